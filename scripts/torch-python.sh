#!/usr/bin/env bash
# Prints the first Python interpreter that can `import torch`, or nothing
# (exit 1). Debian's python3-torch is importable only from Debian's own
# python3, which is not always the python3 first on PATH (pyenv, conda, a
# venv), so candidates are tried in order rather than assuming a path.
# $TRAINMETER_TORCH_PYTHON, when set, is tried first.
for py in ${TRAINMETER_TORCH_PYTHON:-} python3 /usr/bin/python3 python3.13 python3.12 python3.11 python; do
	exe=$(command -v "$py" 2>/dev/null) || continue
	if "$exe" -c 'import torch' >/dev/null 2>&1; then
		echo "$exe"
		exit 0
	fi
done
exit 1

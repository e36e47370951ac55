#!/usr/bin/env bash
# quiet-unless-failed.sh N CMD...: runs CMD; prints the last N lines of its
# output (stdout and stderr) when it succeeds, all of it when it fails (a
# failing test's name and traceback are rarely in the last lines), and exits
# with CMD's status.
set -uo pipefail
n=$1
shift
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
	printf '%s\n' "$out" | tail -n "$n"
else
	printf '%s\n' "$out"
	echo "quiet-unless-failed: $* exited $rc" >&2
fi
exit "$rc"

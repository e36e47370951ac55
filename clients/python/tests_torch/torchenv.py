"""Shared by the torch tests: import torch, or skip — except where torch is
required (CI sets TRAINMETER_REQUIRE_TORCH=1 or CI=true), where a missing
torch is a failure. `make test-python` runs these with the interpreter that
has torch (scripts/torch-python.sh)."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
if PKG_ROOT not in sys.path:
    sys.path.insert(0, PKG_ROOT)

REQUIRED = os.environ.get("TRAINMETER_REQUIRE_TORCH") == "1" or os.environ.get("CI") == "true"

try:
    import torch  # noqa: F401
    TORCH_ERROR = None
except Exception as e:  # ImportError, or a broken install
    torch = None
    TORCH_ERROR = e


def require_torch(test):
    """Class decorator: skip without torch, fail without it where it is required."""
    if torch is not None:
        return test
    if REQUIRED:
        def setUpClass(cls):
            raise RuntimeError("torch is required here (TRAINMETER_REQUIRE_TORCH/CI) but %s cannot import it: %s"
                               % (sys.executable, TORCH_ERROR))
        test.setUpClass = classmethod(setUpClass)
        return test
    return unittest.skip("torch not importable by %s (apt-get install python3-torch)" % sys.executable)(test)

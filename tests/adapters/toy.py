"""The toy C library of the adapter tests: where its sources are, and test markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent / "native"
HEADER = (NATIVE / "toy.h").read_text()

needs_posix = pytest.mark.skipif(
    sys.platform == "win32", reason="the toy library is built with a POSIX C compiler"
)
needs_proc_maps = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)"
)

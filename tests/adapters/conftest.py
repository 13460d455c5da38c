"""Fixtures for the adapter tests: a small C library built in the test session.

``native/toy.c`` is compiled with the system C compiler into a session temporary
directory; tests load it with cffi's ABI mode (``ffi.dlopen``), with ctypes, and
(one test) through a cffi API-mode extension compiled in the session.  Tests that
unload a library work on their own copy of the file so they never unmap the code
other tests use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import exitsafe

from .toy import HEADER, NATIVE


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


@pytest.fixture(scope="session")
def toy_so(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of the freshly built toy shared library."""
    if sys.platform == "win32":
        pytest.skip("the toy library is built with a POSIX C compiler")
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc / gcc / clang) on PATH to build the toy library")
    out = tmp_path_factory.mktemp("toy") / "libtoy.so"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(out),
            f"-I{NATIVE}",
            str(NATIVE / "toy.c"),
            "-lpthread",
        ],
        check=True,
        capture_output=True,
    )
    return str(out)


@pytest.fixture
def toy_copy(toy_so: str, tmp_path: Path) -> str:
    """A private copy of the library, for tests that unload it."""
    path = tmp_path / "libtoycopy.so"
    shutil.copy(toy_so, path)
    return str(path)


@pytest.fixture
def reg():
    """A private registry, torn down at the end of the test (while the library is loaded)."""
    registry = exitsafe.Registry("adapters-test")
    yield registry
    registry.teardown(reason="test end")


@pytest.fixture
def abi(toy_so: str):
    """``(ffi, lib)`` for the toy library in cffi's ABI mode (never closed)."""
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    return ffi, ffi.dlopen(toy_so)


@pytest.fixture
def ctoy(toy_so: str):
    """The toy library through ctypes, with argtypes declared."""
    import ctypes

    lib = ctypes.CDLL(toy_so)
    vp = ctypes.c_void_p
    lib.toy_ctx_new.restype = vp
    lib.toy_ctx_free.argtypes = (vp,)
    lib.toy_obj_new.restype = vp
    lib.toy_obj_new.argtypes = (vp,)
    lib.toy_obj_free.argtypes = (vp,)
    lib.toy_obj_id.argtypes = (vp,)
    lib.toy_catalog_open.restype = vp
    lib.toy_catalog_release.argtypes = (vp,)
    return lib

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
import textwrap
from pathlib import Path

import pytest

import exitsafe

NATIVE = Path(__file__).resolve().parent / "native"
HEADER = (NATIVE / "toy.h").read_text()

needs_posix = pytest.mark.skipif(
    sys.platform == "win32", reason="the toy library is built with a POSIX C compiler"
)


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


def is_mapped(path: str) -> bool:
    """Whether ``path`` is mapped into this process (Linux only)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(real) for line in maps)


needs_proc_maps = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)"
)


def run_py(
    code: str, tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; return the completed process (text output)."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    child_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EXITSAFE_", "TOY_")) and k != "PYTHONFAULTHANDLER"
    }
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_clean_exit(proc: subprocess.CompletedProcess[str]) -> None:
    detail = f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, detail
    for word in ("Exception ignored", "Traceback", "FATAL", "Fatal Python error"):
        assert word not in proc.stderr, detail

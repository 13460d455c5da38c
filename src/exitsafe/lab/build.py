"""Build the lab's two shared libraries with the system C compiler, once, into a cache.

`build` compiles ``native/runtime.c`` and ``native/compiler.c`` (shipped
as package data) into ``libexitsafe_lab_runtime.so`` and
``libexitsafe_lab_compiler.so`` on first use and returns their paths.

Cache: ``$EXITSAFE_LAB_CACHE`` when set, else ``$XDG_CACHE_HOME/exitsafe/lab``
(``~/.cache/exitsafe/lab``), then one directory per build key: the first 16
hex digits of a sha256 over the sources, the compiler command and its
``--version`` banner, the flags and the platform.  Changing any of them builds
into a new directory; an existing directory is reused as is.

Concurrency: several processes may call `build` at the same time on a
cold cache.  Each compiles under an exclusive ``fcntl`` lock on the key
directory's ``.lock`` file into a temporary file, then ``os.replace``\\ s it to
its final name; a library path therefore either does not exist or holds a
complete library, and the fast path (both libraries present) takes no lock.

Compiler: ``$CC`` (which may carry arguments, e.g. ``"gcc -m64"``) when set,
else the first of ``cc``, ``gcc``, ``clang`` on ``PATH``.  No compiler is a
`LabBuildError` saying what to install.  POSIX only (the lab uses
``dlopen``, pthreads, ``fork`` and ``MAP_SHARED``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

__all__ = [
    "COMPILER_LIBRARY",
    "NATIVE_DIR",
    "RUNTIME_LIBRARY",
    "LabBuildError",
    "LabLibraries",
    "build",
    "cache_root",
    "find_compiler",
]

#: Where the C sources live (package data).
NATIVE_DIR = Path(__file__).resolve().parent / "native"
RUNTIME_LIBRARY = "libexitsafe_lab_runtime.so"
COMPILER_LIBRARY = "libexitsafe_lab_compiler.so"

_SOURCES = ("exitsafe_lab.h", "runtime.c", "compiler.c")
_CFLAGS: Tuple[str, ...] = (
    "-std=c99",
    "-O2",
    "-g",
    "-fPIC",
    "-shared",
    "-pthread",
    "-Wall",
    "-Wextra",
)
_TARGETS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    # (library, source, extra link flags)
    (COMPILER_LIBRARY, "compiler.c", ()),
    (RUNTIME_LIBRARY, "runtime.c", ("-ldl",)),
)
_INSTALL_HINT = (
    "install one, e.g. `apt-get install gcc` (Debian/Ubuntu), `dnf install gcc` (Fedora), "
    "`apk add build-base` (Alpine) or the Xcode command line tools (macOS), "
    "or point $CC at a C compiler"
)

_version_cache: Dict[Tuple[str, ...], str] = {}


class LabBuildError(RuntimeError):
    """The lab libraries could not be built (no compiler, or the compiler failed)."""


@dataclass(frozen=True)
class LabLibraries:
    """Paths of a built pair of lab libraries."""

    runtime: Path
    compiler: Path
    directory: Path
    key: str


def cache_root() -> Path:
    """The cache's base directory (before the per-key directory)."""
    env = os.environ.get("EXITSAFE_LAB_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "exitsafe" / "lab"


def find_compiler(cc: Optional[str] = None) -> List[str]:
    """The compiler command: ``cc`` (a command line string) or ``$CC``, else cc/gcc/clang.

    Raises `LabBuildError` naming what to install when none is found.
    """
    spec = cc if cc is not None else os.environ.get("CC", "")
    if spec.strip():
        argv = shlex.split(spec)
        found = shutil.which(argv[0])
        if found is None:
            raise LabBuildError(
                f"the C compiler {argv[0]!r} (from {'cc=' if cc is not None else '$CC='}{spec!r})"
                f" was not found; {_INSTALL_HINT}"
            )
        return [found, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    raise LabBuildError(
        "exitsafe lab: no C compiler found (looked for $CC, cc, gcc, clang on PATH); "
        + _INSTALL_HINT
    )


def _compiler_banner(argv: Sequence[str]) -> str:
    key = tuple(argv)
    if key not in _version_cache:
        try:
            out = subprocess.run(
                [*argv, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
            _version_cache[key] = out.stdout.splitlines()[0] if out.stdout else out.stderr[:200]
        except (OSError, subprocess.SubprocessError) as exc:
            raise LabBuildError(f"could not run the C compiler {argv[0]!r}: {exc}") from exc
    return _version_cache[key]


def _build_key(argv: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(name.encode() + b"\0")
        digest.update((NATIVE_DIR / name).read_bytes())
        digest.update(b"\0")
    digest.update("\0".join(argv).encode())
    digest.update(_compiler_banner(argv).encode())
    digest.update("\0".join(_CFLAGS).encode())
    for _lib, source, link in _TARGETS:
        digest.update(f"{source}:{' '.join(link)}".encode())
    digest.update(f"{sys.platform}:{platform.machine()}".encode())
    return digest.hexdigest()[:16]


def _compile(argv: Sequence[str], source: Path, output: Path, link: Sequence[str]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    cmd = [*argv, *_CFLAGS, f"-I{NATIVE_DIR}", "-o", tmp, str(source), *link]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise LabBuildError(
                f"compiling {source.name} failed (exit {proc.returncode}):\n"
                f"$ {shlex.join(cmd)}\n{proc.stderr.strip()}"
            )
        os.replace(tmp, output)
    except OSError as exc:
        raise LabBuildError(f"could not run {shlex.join(cmd)}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(
    *,
    cache_dir: Optional[Union[str, os.PathLike[str]]] = None,
    cc: Optional[str] = None,
    force: bool = False,
) -> LabLibraries:
    """Build (or find in the cache) both lab libraries and return their paths.

    ``cache_dir`` overrides `cache_root`; ``cc`` overrides ``$CC``;
    ``force`` rebuilds even when the cached libraries exist.  Safe to call from
    several processes and threads at once.  Raises `LabBuildError`.
    """
    if os.name != "posix":
        raise LabBuildError("the exitsafe lab needs a POSIX system (dlopen, pthreads, fork)")
    argv = find_compiler(cc)
    key = _build_key(argv)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    directory = root / key
    result = LabLibraries(
        runtime=directory / RUNTIME_LIBRARY,
        compiler=directory / COMPILER_LIBRARY,
        directory=directory,
        key=key,
    )
    if not force and result.runtime.exists() and result.compiler.exists():
        return result
    directory.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(directory / ".lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            for library, source, link in _TARGETS:
                output = directory / library
                if force or not output.exists():
                    _compile(argv, NATIVE_DIR / source, output, link)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m exitsafe.lab.build [--force]``: build and print the library paths."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        libs = build(force="--force" in args)
    except LabBuildError as exc:
        print(f"exitsafe lab: {exc}", file=sys.stderr)
        return 2
    print(libs.runtime)
    print(libs.compiler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

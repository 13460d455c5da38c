"""The catalogue of bad exits: one real program per kind that `exitsafe run` names.

Shared by ``test_catalogue.py`` (each program run directly, through ``exitsafe run`` and
through the pytest plugin) and the documentation's table of kinds.  Each program forces its
failure (see ``programs/README.md``); a hang ends at the run's timeout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PROGRAMS = Path(__file__).resolve().parent / "programs"

#: Seconds a hanging program runs before it is stopped (and its stacks dumped).
HANG_TIMEOUT = 4.0

#: The C++ worker loop of ``thread_in_native.py`` (as in test_diagnosis.py).
SPIN_CPP = r"""
#include <unistd.h>
static int go;
static int called;
extern "C" void spin_calling(void (*tick)(void)) noexcept {
    tick();
    for (;;) {
        if (__atomic_exchange_n(&go, 0, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&called, 1, __ATOMIC_SEQ_CST);
            tick();
        }
        usleep(1000);
    }
}
extern "C" void session_close(void) {
    __atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 10000 && !__atomic_load_n(&called, __ATOMIC_SEQ_CST); i++)
        usleep(1000);
    usleep(100000);
}
"""


@dataclass(frozen=True)
class Case:
    """One kind and the program that shows it."""

    kind: str
    #: a file of programs/, run with this interpreter (or ``command`` for another program)
    program: Optional[str] = None
    command: tuple[str, ...] = ()
    timeout: float = 30.0
    audit: bool = False
    checks: tuple[str, ...] = ()
    #: what it needs: "lab" (the lab runtime, built with the C compiler), "c++", "fork"
    needs: Optional[str] = None
    #: a further id when one kind has several programs
    variant: str = ""

    @property
    def id(self) -> str:
        return self.kind + (f"-{self.variant}" if self.variant else "")

    def argv(self, library: Optional[Path] = None) -> list[str]:
        if self.command:
            return list(self.command)
        assert self.program is not None
        argv = [sys.executable, "-X", "faulthandler", str(PROGRAMS / self.program)]
        if self.needs == "c++":
            assert library is not None
            argv.append(str(library))
        return argv


CASES = [
    Case("thread-in-native", "thread_in_native.py", timeout=20.0, needs="c++"),
    Case("hang-before-teardown", "hang_before_teardown.py", timeout=HANG_TIMEOUT),
    Case("hang-in-atexit", "hang_in_atexit.py", timeout=HANG_TIMEOUT),
    Case("hang-in-finalizer", "hang_in_finalizer.py", timeout=HANG_TIMEOUT, needs="lab"),
    Case("hang-in-finalizer", "hang_in_native_finalizer.py", timeout=HANG_TIMEOUT,
         needs="lab", audit=True, variant="native-audited"),
    Case("hang-in-finalizer", "hang_in_del_audited.py", timeout=HANG_TIMEOUT, audit=True,
         variant="del-audited"),
    Case("deadlock-at-exit", "deadlock_at_exit.py", timeout=HANG_TIMEOUT),
    Case("hang-in-teardown", "hang_in_teardown.py", timeout=HANG_TIMEOUT),
    Case("hang-in-main", "hang_in_main.py", timeout=HANG_TIMEOUT),
    Case("timeout", command=("sleep", "600"), timeout=2.0),
    Case("crash-in-teardown", "crash_in_teardown.py"),
    Case("crash-after-teardown", "crash_after_teardown.py"),
    Case("crash-at-exit", "crash_at_exit.py"),
    Case("thread-crash-at-exit", "thread_crash_at_exit.py"),
    Case("native-fatal", "native_fatal.py", needs="lab"),
    Case("child-process", "child_process.py", needs="fork"),
    Case("thread-exception", "thread_exception.py"),
    Case("atexit-error", "atexit_error.py"),
    Case("unraisable-at-exit", "unraisable_at_exit.py"),
    Case("lost-output", "lost_output.py", checks=("grep -q 'all 1000 rows' rows.txt",)),
    Case("audit", "audit_late_release.py", audit=True),
]


def missing(case: Case) -> Optional[str]:
    """Why ``case`` cannot run on this machine, or ``None``."""
    if sys.platform == "win32":
        return "the catalogue's programs use POSIX signals, fork and the lab (POSIX only)"
    if case.needs == "c++" and sys.version_info >= (3, 14):
        return "CPython 3.14+ parks such a thread instead of unwinding it (no abort)"
    if case.needs == "c++" and not (shutil.which("g++") or shutil.which("clang++")):
        return "no C++ compiler (g++ or clang++) to build the native worker loop"
    if case.command and shutil.which(case.command[0]) is None:
        return f"no {case.command[0]} command"
    return None


def build_spin(directory: Path) -> Path:
    """Compile the C++ worker loop of ``thread_in_native.py`` into ``directory``."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    assert compiler is not None
    source = directory / "spin.cpp"
    source.write_text(SPIN_CPP)
    library = directory / "libspin.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
        check=True, timeout=120,
    )
    return library


def build_lab() -> Optional[str]:
    """Build the lab libraries (once; cached); why they cannot be built, or ``None``."""
    try:
        from exitsafe.lab import build

        build.build()
    except Exception as exc:  # LabBuildError, no compiler, no cffi
        return f"cannot build the lab libraries: {exc}"
    return None

"""The scenario catalogue S1-S13: what each scenario is, and what each of its two programs must do.

Every scenario has two standalone programs in `exitsafe.lab.scenarios`:
``sN_unprotected.py`` (the binding written the usual way) must fail as
`Scenario.failure` says, every time; ``sN_protected.py`` (the same
binding using exitsafe) must exit 0 with no ``FATAL`` line, no "Exception
ignored", no faulthandler dump, and exactly the leaks
`Scenario.leaks` lists in the runtime's leak report (zero for most;
what the exit policy leaks on purpose otherwise), and the leaks
`Scenario.leaks_when_releasing` lists under ``EXITSAFE_AT_EXIT=release``.

`exitsafe.lab.runner` runs and judges them; ``exitsafe demo`` shows the table.
This module imports nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["CATALOG", "SCENARIO_DIR", "Failure", "Scenario", "get", "select"]

#: Where the scenario programs live.
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

#: Every signal a crash can end a process with: the signals whose default action is to
#: terminate with a core dump (POSIX; signal(7) on Linux), less SIGQUIT, SIGXCPU and SIGXFSZ,
#: which come from a terminal or a resource limit, not from a crash.  Undefined behaviour in
#: or after interpreter finalization (a call into a finalized interpreter, a jump through a
#: freed callback trampoline) may end with any of them: SIGSEGV most often, SIGILL or
#: SIGTRAP when the jump lands on bytes that decode as an invalid or a breakpoint
#: instruction (both seen in this project's runs: SIGILL on 3.11-3.15, SIGTRAP on
#: 3.13-3.15), SIGBUS, SIGFPE or SIGSYS on other memory, SIGABRT when a consistency check
#: fires.  SIGKILL and SIGTERM are not crashes (a timeout kills with SIGKILL).
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGTRAP", "SIGABRT", "SIGFPE", "SIGSYS")


@dataclass(frozen=True)
class Failure:
    """How an unprotected program must fail.

    ``kind`` is one of:

    ``"signal"``  killed by one of ``signals`` (a crash such as SIGSEGV); when
                  ``evidence`` is set, the failure is undefined behaviour that may
                  also, rarely, not crash at all: a run that ends without a signal
                  still fails as expected when the runtime's leak report carries
                  every ``evidence`` field (it proves the undefined behaviour ran);
    ``"fatal"``   killed by SIGABRT after exactly one runtime line
                  ``FATAL: ...`` containing ``fatal``;
    ``"hang"``    still running after `Scenario.hang_timeout` seconds (then
                  its process group is killed);
    ``"leaks"``   exit status ``exit_code`` with exactly ``leaks`` in the runtime's
                  leak report (a leak checker failing the run).
    """

    kind: str
    summary: str
    signals: Tuple[str, ...] = ()
    fatal: Optional[str] = None
    exit_code: Optional[int] = None
    leaks: Mapping[str, int] = field(default_factory=dict)
    evidence: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    """One catalogue entry.

    :ivar id: ``"S1"`` ... ``"S13"``.
    :ivar title: the situation, in a line.
    :ivar short: the situation in a few words, for tables.
    :ivar failure: what the unprotected program must do.
    :ivar protected_by: the exitsafe feature the protected program relies on.
    :ivar leaks: leaks (kind -> count, only non-zero kinds) the main process of the
        protected program must report under `env`.
    :ivar leaks_when_releasing: the same under ``EXITSAFE_AT_EXIT=release``.
    :ivar leaks_when_leaking: the same under ``EXITSAFE_AT_EXIT=leak`` (what is still alive
        at exit), for scenarios whose own ``env`` does not set ``EXITSAFE_AT_EXIT``.
    :ivar child_inherited: for scenarios that fork: the ``inherited`` count the child's
        leak report must show (and the child must report no leaks of its own).
    :ivar env: environment variables both programs run with.
    :ivar timeout: seconds a run may take before it counts as hung.
    :ivar hang_timeout: for ``hang`` failures: seconds after which the unprotected
        program is declared hung and killed.
    :ivar protected_stdout: strings the protected program's stdout must contain.
    :ivar protected_trace: strings its stderr (exitsafe's teardown trace) must contain
        when it runs under its own exit policies (no ``EXITSAFE_AT_EXIT`` override from
        the caller).
    """

    id: str
    title: str
    failure: Failure
    protected_by: str
    short: str = ""
    leaks: Mapping[str, int] = field(default_factory=dict)
    leaks_when_releasing: Mapping[str, int] = field(default_factory=dict)
    leaks_when_leaking: Mapping[str, int] = field(default_factory=dict)
    child_inherited: Optional[int] = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    hang_timeout: float = 3.0
    protected_stdout: Tuple[str, ...] = ()
    protected_trace: Tuple[str, ...] = ()

    @property
    def number(self) -> int:
        return int(self.id[1:])

    def module(self, protected: bool) -> str:
        """The program's module name, e.g. ``exitsafe.lab.scenarios.s1_protected``."""
        return f"exitsafe.lab.scenarios.{self.id.lower()}_{_variant(protected)}"

    def script(self, protected: bool) -> Path:
        """The program's file."""
        return SCENARIO_DIR / f"{self.id.lower()}_{_variant(protected)}.py"

    def to_dict(self) -> Dict[str, object]:
        """The entry as JSON-ready data."""
        return {
            "id": self.id,
            "title": self.title,
            "short": self.short,
            "unprotected": {
                "kind": self.failure.kind,
                "summary": self.failure.summary,
                "signals": list(self.failure.signals),
                "fatal": self.failure.fatal,
                "exit_code": self.failure.exit_code,
                "leaks": dict(self.failure.leaks),
                "evidence": dict(self.failure.evidence),
                "script": str(self.script(False)),
            },
            "protected": {
                "by": self.protected_by,
                "leaks": dict(self.leaks),
                "leaks_when_releasing": dict(self.leaks_when_releasing),
                "leaks_when_leaking": dict(self.leaks_when_leaking),
                "child_inherited": self.child_inherited,
                "script": str(self.script(True)),
            },
            "env": dict(self.env),
            "timeout": self.timeout,
            "hang_timeout": self.hang_timeout,
        }


def _variant(protected: bool) -> str:
    return "protected" if protected else "unprotected"


CATALOG: Tuple[Scenario, ...] = (
    Scenario(
        id="S1",
        short="dependency unloaded before a release",
        title="dependency library unloaded before a handle whose release calls into it",
        failure=Failure(
            "signal",
            "SIGSEGV: the device release jumps into the unmapped compiler",
            signals=("SIGSEGV",),
        ),
        protected_by="pin + libraries released last",
        leaks_when_leaking={"instances": 1, "devices": 1},
    ),
    Scenario(
        id="S2",
        short="globals + cycle finalized in GC order",
        title="instance and device in globals and a reference cycle, finalized in GC order",
        failure=Failure(
            "fatal",
            "abort: child released after its parent",
            fatal="device released after its parent instance was released",
        ),
        protected_by="ordered teardown at exit",
        leaks_when_leaking={"instances": 1, "devices": 1},
    ),
    Scenario(
        id="S3",
        short="last reference dropped after shutdown",
        title="last reference dropped on a background thread after the runtime shut down",
        failure=Failure(
            "fatal",
            "abort: runtime used after it was torn down",
            fatal="runtime used after it was torn down",
        ),
        protected_by="registry closed: the late release is a recorded no-op",
        leaks_when_leaking={"catalogs": 1},
        protected_trace=("late-release",),
    ),
    Scenario(
        id="S4",
        short="native logger calls finalized Python",
        title="native thread calls a Python logger callback during / after finalization",
        failure=Failure(
            "signal",
            "crash: the callback runs after Py_Finalize",
            signals=CRASH_SIGNALS,
            # the runtime writes its report, then calls the still-registered callback
            evidence={"logger": "1"},
        ),
        protected_by="teardown hook unregisters the logger first; guarded callback",
        leaks_when_leaking={"instances": 1},
        protected_trace=("outcome=hook_ran",),
    ),
    Scenario(
        id="S5",
        short="handle outlives its worker thread",
        title="handle created on a worker thread; the worker ends; another worker needs it",
        failure=Failure(
            "fatal",
            "abort: device used after release",
            fatal="device used after release",
        ),
        protected_by="handles outlive their thread; leak_if_foreign_thread at exit",
        leaks_when_leaking={"instances": 1, "devices": 1, "buffers": 1},
        leaks={"instances": 1, "devices": 1, "buffers": 1},
        protected_trace=("outcome=leaked_policy", "outcome=leaked_dependent"),
    ),
    Scenario(
        id="S6",
        short="forked child releases parent's objects",
        title="forked child exits and releases the parent's native objects",
        failure=Failure(
            "fatal",
            "abort in the parent: its instance was destroyed by the child",
            fatal="was destroyed by another process",
        ),
        protected_by="handles inherited by a child are never released there",
        leaks_when_leaking={"instances": 1, "catalogs": 1},
        child_inherited=2,
        protected_trace=("outcome=leaked_inherited",),
    ),
    Scenario(
        id="S7",
        short="release blocks forever at exit",
        title="a release blocks forever at exit (lost device)",
        failure=Failure("hang", "hang: the device release never returns"),
        protected_by="per-step timeout: leak it, log it, exit",
        leaks_when_leaking={"instances": 1, "devices": 1},
        leaks={"instances": 1, "devices": 1},
        leaks_when_releasing={"instances": 1, "devices": 1},
        protected_trace=("outcome=leaked_timeout", "outcome=leaked_dependent"),
    ),
    Scenario(
        id="S8",
        short="parent released while children live",
        title="parent released explicitly while its children live",
        failure=Failure(
            "fatal",
            "abort: device released after its instance",
            fatal="device released after its parent instance was released",
        ),
        protected_by="release deferred until children are gone; strict mode raises",
        protected_stdout=("strict mode refused", "gpu0"),
    ),
    Scenario(
        id="S9",
        short="use after release, double release",
        title="handle used after release, or released twice, from another thread",
        failure=Failure(
            "fatal",
            "abort: buffer used after release",
            fatal="buffer used after release",
        ),
        protected_by="clear Python exception; double release is idempotent",
        leaks_when_leaking={"instances": 1, "devices": 1},
        protected_stdout=("HandleClosedError",),
    ),
    Scenario(
        id="S10",
        short="leak-checker run",
        title="leak-checker run: everything must be freed",
        failure=Failure(
            "leaks",
            "leaks reported: the leak checker fails the run",
            exit_code=23,
            leaks={"instances": 1, "devices": 1, "buffers": 1},
        ),
        protected_by='process-wide "release everything" override: zero leaks',
        env={"EXITSAFE_LAB_LEAK_EXITCODE": "23", "EXITSAFE_AT_EXIT": "release"},
    ),
    Scenario(
        id="S11",
        short="thread inside a native call at exit",
        title="a daemon thread is inside a native call when the interpreter finalizes",
        failure=Failure(
            "fatal",
            "abort: device released under a running call",
            fatal="released while rt_device_run is running on it",
        ),
        protected_by="quiesce: the call in flight is waited for, later calls park",
        leaks_when_leaking={"instances": 1, "devices": 1},
    ),
    Scenario(
        id="S12",
        short="thread inside a stateless native call",
        title="a daemon thread is inside a stateless native function (no object) at exit",
        failure=Failure(
            "fatal",
            "abort: the runtime is shut down under a running call",
            fatal="rt_shutdown() while rt_filter is running on another thread",
        ),
        protected_by="quiesce: the thread parks between two calls, before the binding's exit "
        "handler",
        protected_trace=("quiesce threads=1 parked=1 running=0",),
    ),
    Scenario(
        id="S13",
        short="thread blocked in a native wait",
        title="a non-daemon thread is blocked in a native call that only a wake ends",
        failure=Failure("hang", "hang: the interpreter joins the blocked thread for ever"),
        protected_by="worker wake: the blocked call returns, the thread ends, then the release",
        leaks_when_leaking={"instances": 1, "devices": 1},
        protected_trace=('name="worker events" outcome=hook_ran',),
    ),
)

_BY_ID = {s.id: s for s in CATALOG}


def get(scenario_id: str) -> Scenario:
    """The scenario with this id (``"S3"`` or ``"s3"``); ``KeyError`` if unknown."""
    key = scenario_id.strip().upper()
    if key not in _BY_ID:
        raise KeyError(f"unknown scenario {scenario_id!r}; known: {', '.join(_BY_ID)}")
    return _BY_ID[key]


def select(ids: Optional[Sequence[str]] = None) -> List[Scenario]:
    """The scenarios named in ``ids`` (catalogue order, duplicates removed), or all."""
    if not ids:
        return list(CATALOG)
    wanted = {get(i).id for i in ids}
    return [s for s in CATALOG if s.id in wanted]

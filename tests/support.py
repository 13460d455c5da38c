"""Helpers shared by the test packages: run a Python program in a fresh process and read
what it did.

Programs get :data:`PRELUDE`: ``record(x)`` appends ``x`` to a log with one ``os.write``
(atomic, works from any thread, from finalizers and from forked children), so a test
reads the release order and count back with :attr:`Run.order`.  Every run has a hard
timeout: a hang kills the whole process group and fails the test, never the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

#: Code every program starts with: ``record(x)`` appends ``str(x)`` to the order log.
PRELUDE = textwrap.dedent(
    """
    import os, sys, gc, threading
    import exitsafe
    _LOG = os.open(os.environ["ORDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(raw):
        os.write(_LOG, (str(raw) + "\\n").encode())
    """
)

#: Words that must not appear on the stderr of a clean run.
NOISE = ("Exception ignored", "Traceback", "FATAL", "Fatal Python error")

#: Variables of the test process that must not leak into a child's environment.
_SCRUB = ("EXITSAFE_", "TOY_", "PYTHONFAULTHANDLER", "ORDER_LOG")


@dataclass
class Run:
    """How a program run by :func:`run_program` ended."""

    returncode: Optional[int]  # None: killed after the timeout
    stdout: str
    stderr: str
    order: list[str] = field(default_factory=list)
    ledger_path: Optional[Path] = None

    @property
    def hung(self) -> bool:
        return self.returncode is None

    def ledger(self) -> dict[str, Any]:
        """The ledger JSON the program wrote at exit (``ledger=True``)."""
        assert self.ledger_path is not None, "run_program(..., ledger=True) was not asked"
        assert self.ledger_path.exists(), f"no ledger written\n{self.describe()}"
        data: dict[str, Any] = json.loads(self.ledger_path.read_text())
        return data

    def outcomes(self, registry: str = "default") -> dict[str, str]:
        """``name -> outcome`` of one registry's ledger."""
        for reg in self.ledger()["registries"]:
            if reg["name"] == registry:
                return {e["name"]: e["outcome"] for e in reg["entries"]}
        raise AssertionError(f"no registry {registry!r} in the ledger\n{self.describe()}")

    def outcome_counts(self, registry: str = "default") -> dict[str, int]:
        """``outcome -> number of ledger entries`` of one registry."""
        for reg in self.ledger()["registries"]:
            if reg["name"] == registry:
                counts: dict[str, int] = reg["counts"]
                return counts
        raise AssertionError(f"no registry {registry!r} in the ledger\n{self.describe()}")

    def describe(self) -> str:
        return (
            f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
            f"\n--- order\n{self.order}"
        )


#: Kept for the child: the core the suite runs against (CI runs it under each).
_KEEP = ("EXITSAFE_PURE_PYTHON",)


def child_env(env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The test process's environment without exitsafe's and the tests' own variables,
    except the choice of core, so that a child runs the core the suite runs against."""
    out = {
        k: v for k, v in os.environ.items() if k in _KEEP or not k.startswith(_SCRUB)
    }
    out.update(env or {})
    return out


def run_program(
    body: str,
    tmp_path: Path,
    *,
    env: Optional[Mapping[str, str]] = None,
    args: Sequence[str] = (),
    timeout: float = 60.0,
    prelude: bool = True,
    ledger: bool = False,
    name: str = "prog.py",
) -> Run:
    """Run ``body`` (dedented, after :data:`PRELUDE`) in a fresh interpreter.

    The program runs in its own session; after ``timeout`` seconds its whole process
    group is killed and the result has ``returncode=None``.  ``ledger=True`` sets
    ``EXITSAFE_LEDGER`` so that :meth:`Run.ledger` can read it.
    """
    log = tmp_path / (name + ".order")
    script = tmp_path / name
    script.write_text((PRELUDE if prelude else "") + textwrap.dedent(body))
    full_env = child_env(env)
    full_env["ORDER_LOG"] = str(log)
    ledger_path = None
    if ledger:
        ledger_path = tmp_path / (name + ".ledger.json")
        full_env["EXITSAFE_LEDGER"] = str(ledger_path)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        code = None
    order = log.read_text().splitlines() if log.exists() else []
    return Run(code, out, err, order, ledger_path)


def run_py(
    code: str, tmp_path: Path, *, env: Optional[Mapping[str, str]] = None, timeout: float = 60.0
) -> Run:
    """Run ``code`` as it is (no prelude) in a fresh interpreter: :func:`run_program`."""
    return run_program(code, tmp_path, env=env, timeout=timeout, prelude=False)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


def assert_clean(run: Run, *, allow: Sequence[str] = ()) -> None:
    """Exit status 0, no hang, and none of :data:`NOISE` on stderr (except ``allow``)."""
    assert not run.hung, f"the program hung\n{run.describe()}"
    assert run.returncode == 0, run.describe()
    for word in NOISE:
        if word not in allow:
            assert word not in run.stderr, run.describe()


def is_mapped(path: str) -> bool:
    """Whether ``path`` is mapped into this process (Linux only)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(real) for line in maps)

"""The proof harness for interrupts: a Ctrl-C delivered at every line / every instruction of
a section of exitsafe, with exitsafe's promises checked after each.

:func:`sweep` runs :mod:`tests.adversarial.interrupt_child` in a fresh interpreter for one
section (a set-up and an action, defined there with ``@section``), one mode and one
core, and returns a :class:`Sweep`: for ``N = 1, 2, 3, ...`` the action ran with SIGINT
delivered at the N-th event of exitsafe's code, until a run completed without a
delivery; every run that broke a promise is listed with the place the interrupt landed
(function, file, line, event).  The modes:

``line``    every ``sys.settrace`` event (``call``, ``line``, ``return``, ``exception``):
            Ctrl-C under a debugger, ``coverage`` or a profiler (any version);
``opcode``  every instruction (``f_trace_opcodes``, or ``sys.monitoring`` on CPython 3.12+):
            Ctrl-C on CPython 3.9, which acts on signals after most instructions;
``calls``   function entries and the instruction after each call: Ctrl-C on CPython 3.10+
            with no tracer installed.

The default run samples ``N`` with a stride (about :data:`BUDGET` runs per sweep);
``EXITSAFE_EVERY_LINE=1`` runs every ``N``.  To point the harness at another section, add
a ``@section("name")`` function to the child program and call ``sweep("name", ...)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..support import child_env

CHILD = Path(__file__).with_name("interrupt_child.py")

#: ``EXITSAFE_PURE_PYTHON`` value of each core.
CORES = {"compiled": "0", "python": "1"}
MODES = ("line", "opcode", "calls")
#: The sections the child program defines (each one set-up and action).
SECTIONS = (
    "track",
    "release",
    "release_chain",
    "retain",
    "borrow",
    "call",
    "adapter_track",
    "add_dependency",
    "detach",
    "on_teardown",
    "teardown",
    "gc",
)

EVERY = os.environ.get("EXITSAFE_EVERY_LINE") == "1"
#: Runs per sweep in the default run (a stride over N); every N with EXITSAFE_EVERY_LINE=1.
BUDGET = 40


@dataclass
class Sweep:
    """What one sweep found."""

    section: str
    mode: str
    core: str
    python: str = ""
    events: int = 0  # events of exitsafe's code in the uninterrupted action
    runs: int = 0  # runs in which the interrupt was delivered
    stride: int = 1
    monitoring: bool = False
    failing: list[dict[str, Any]] = field(default_factory=list)  # the runs that broke one
    #: the runs that broke one with the interrupt at an instruction the compiler left out
    #: of its ``try`` (CPython 3.14's NOT_TAKEN: see the child's ``_outside_its_try``)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False  # the child printed its last line
    stderr: str = ""
    returncode: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.finished and not self.failing

    def checks(self) -> set[str]:
        """The names of the promises broken (see the child's documentation)."""
        return {check for run in self.failing for check, _ in run["failures"]}

    def places(self) -> dict[str, list[int]]:
        """``"function file:line [event]" -> [N, ...]`` of the failing runs."""
        out: dict[str, list[int]] = defaultdict(list)
        for run in self.failing:
            out[_place(run)].append(run["at"])
        return dict(out)

    def describe(self, limit: int = 60, gaps: bool = False) -> str:
        """The failing runs grouped by where the interrupt landed, for an assertion
        (``gaps``: the runs of `gaps` instead)."""
        runs = self.gaps if gaps else self.failing
        what = (
            "broke a promise at an instruction the compiler left out of its try"
            if gaps
            else "broke a promise"
        )
        head = (
            f"section {self.section!r}, mode {self.mode}, {self.core} core, CPython "
            f"{self.python}: {len(runs)} of {self.runs} interrupted runs {what} "
            f"({self.events} events, stride {self.stride}"
            f"{', sys.monitoring' if self.monitoring else ''})"
        )
        if not self.finished:
            head += (
                f"\nTHE SWEEP DID NOT FINISH (exit {self.returncode}); stderr tail:\n"
                + self.stderr[-3000:]
            )
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for run in runs:
            groups[_place(run)].append(run)
        lines = [head]
        for place, runs in list(groups.items())[:limit]:
            checks = sorted({c for r in runs for c, _ in r["failures"]})
            example = runs[0]["failures"][0][1]
            ns = ",".join(str(r["at"]) for r in runs[:10]) + ("..." if len(runs) > 10 else "")
            lines.append(f"  N={ns} at {place}: {', '.join(checks)} (e.g. {example})")
        if len(groups) > limit:
            lines.append(f"  ... and {len(groups) - limit} more places")
        return "\n".join(lines)


def _place(run: dict[str, Any]) -> str:
    fired = run.get("fired") or {}
    return (
        f"{fired.get('function')} {fired.get('file')}:{fired.get('line')} "
        f"[{fired.get('event')}]"
    )


def sweep(
    section: str,
    mode: str,
    core: str,
    *,
    every: Optional[bool] = None,
    budget: int = BUDGET,
    threads: str = "main",
    timeout: float = 900.0,
    python: Optional[str] = None,
) -> Sweep:
    """Run one sweep in a fresh interpreter (``python``, default this one) and read it."""
    every = EVERY if every is None else every
    cmd = [python or sys.executable, str(CHILD), section, mode, "--threads", threads]
    if not every:
        cmd += ["--budget", str(budget)]
    env = child_env({"EXITSAFE_PURE_PYTHON": CORES[core]})
    result = Sweep(section, mode, core)
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        out, result.stderr, result.returncode = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout)
        result.stderr = _text(exc.stderr) + f"\n(killed after {timeout} s)"
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        item = json.loads(line)
        if item.get("done"):
            result.finished = True
            result.python = item["python"]
            result.events = item["events"]
            result.runs = item["runs"]
            result.stride = item["stride"]
            result.monitoring = item["monitoring"]
            if item["core"] != ("compiled" if core == "compiled" else "python"):
                raise AssertionError(f"asked for the {core} core, got {item['core']}")
        elif (item.get("fired") or {}).get("compiler_gap") and all(
            check != "harness" for check, _ in item["failures"]
        ):
            result.gaps.append(item)
        else:
            result.failing.append(item)
    return result


def _text(data: object) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return str(data)

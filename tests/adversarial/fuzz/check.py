"""The invariants every generated program must satisfy, checked on its finished run.

:func:`check` first asserts what holds whatever the program (no hang, no noise, at most
one release per handle and process, none by a child of what it inherited, dependency
order, hook edges, one ledger outcome per handle agreeing with the release log), then
compares with :func:`~.model.expect`.  Each failure names the invariant.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from exitsafe import Outcome

from ...support import NOISE, Run
from .model import Expected, Process
from .scenario import Scenario

#: What a program raising on purpose prints: the one traceback of that exception.
_RAISED = {"raise": "RuntimeError: fuzz: escaping main", "keyboard": "KeyboardInterrupt"}


class Log:
    """The ``os.write`` log of a run, split per process."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.main_pid = next(x.split()[1] for x in lines if x.startswith("P "))
        self.child_pid = next((x.split()[1] for x in lines if x.startswith("C ")), None)
        self.child_status = [int(x.split()[1]) for x in lines if x.startswith("S ")]

    def events(self, pid: str) -> list[tuple[str, str]]:
        """``(kind, name)`` in order, ``kind`` ``"R"`` (a release) or ``"K"`` (a hook)."""
        out = []
        for x in self.lines:
            parts = x.split()
            if parts[0] in ("R", "K") and parts[1] == pid:
                out.append((parts[0], parts[2]))
        return out


def check(s: Scenario, exp: Expected, run: Run, tmp: Path) -> None:
    assert not run.hung, "the program hung (killed after the hard timeout)"
    _check_stderr(s, run)
    log = Log(run.order)
    assert "signal not acted on" not in run.order, "SIGTERM was not acted on"
    assert run.returncode == exp.main.status, (
        f"exit status {run.returncode}, expected {exp.main.status}"
    )
    _check_process(exp.main, log.events(log.main_pid), _ledger(tmp, log.main_pid, s), "main")
    if s.child is None:
        assert log.child_pid is None
        return
    assert exp.child is not None and log.child_pid is not None, "the child did not start"
    assert log.child_status == [exp.child.status], f"child status {log.child_status}"
    _check_process(exp.child, log.events(log.child_pid), _ledger(tmp, log.child_pid, s), "child")


def _check_stderr(s: Scenario, run: Run) -> None:
    err = run.stderr
    assert "Exception ignored" not in err, "noise on stderr: Exception ignored"
    expected = _RAISED.get(s.exit)
    if expected is None:
        for word in NOISE:
            assert word not in err, f"noise on stderr: {word}"
        return
    assert expected in err, "the program's own exception was not reported"
    assert err.count("Traceback") == 1, "noise on stderr beyond the program's own traceback"
    for word in NOISE:
        if word != "Traceback":
            assert word not in err, f"noise on stderr: {word}"


def _ledger(tmp: Path, pid: str, s: Scenario) -> dict[str, list[str]]:
    path = tmp / f"ledger-{pid}.json"
    assert path.exists(), f"no ledger written by {pid}"
    data: dict[str, Any] = json.loads(path.read_text())
    out: dict[str, list[str]] = {}
    for reg in data["registries"]:
        if reg["name"] == s.registry_name:
            for e in reg["entries"]:
                out.setdefault(e["name"], []).append(e["outcome"])
    return out


def _check_process(
    exp: Process, events: list[tuple[str, str]], ledger: dict[str, list[str]], who: str
) -> None:
    released = [name for kind, name in events if kind == "R"]
    hooks = [name for kind, name in events if kind == "K"]
    twice = [n for n, c in Counter(released).items() if c > 1]
    assert not twice, f"{who}: released more than once: {twice}"
    assert not [n for n, c in Counter(hooks).items() if c > 1], f"{who}: a hook ran twice"
    # Only names this process may release (a child: only what it created itself).
    extra = set(released) - exp.released - exp.may_release
    assert not extra, f"{who}: released what it must not: {sorted(extra)}"
    assert set(hooks) <= exp.hooks_run, (
        f"{who}: ran hooks it must not: {set(hooks) - exp.hooks_run}"
    )
    # Never a parent before (or without) the handles that depend on it.
    pos = {name: n for n, (kind, name) in enumerate(events) if kind == "R"}
    for child, parents in exp.parents.items():
        for parent in parents:
            if parent in pos:
                assert child in pos and pos[child] < pos[parent], (
                    f"{who}: {parent} released before (or without) its dependent {child}"
                )
    # Exactly one ledger outcome per handle and hook, agreeing with the log.
    assert set(ledger) == set(exp.outcomes), (
        f"{who}: ledger names {sorted(ledger)} != {sorted(exp.outcomes)}"
    )
    for name, outcomes in ledger.items():
        assert len(outcomes) == 1, f"{who}: {name} has {len(outcomes)} ledger outcomes: {outcomes}"
        outcome = outcomes[0]
        assert outcome in Outcome.ALL, f"{who}: {name}: unknown outcome {outcome!r}"
        ran = name in pos or name in hooks
        inherited_ran = outcome in Outcome.RAN and who == "child" and name not in exp.released
        assert ran == (outcome in Outcome.RAN) or inherited_ran, (
            f"{who}: {name} ended {outcome} but its release/hook {'ran' if ran else 'never ran'}"
        )
        assert outcome in exp.outcomes[name], (
            f"{who}: {name} ended {outcome}, expected one of {sorted(exp.outcomes[name])}"
        )
    # At teardown a hook runs before the handles in its before=, after those in its after=
    # (an explicit release() before the teardown is not deferred by a hook: documented).
    at = {name: n for n, (kind, name) in enumerate(events) if kind == "K"}
    for hook, (before, after) in exp.hook_edges.items():
        if hook in at:
            for b in before:
                if ledger.get(b) == [Outcome.RELEASED]:
                    continue
                assert pos.get(b, len(events)) > at[hook], f"{who}: {b} released before hook {hook}"
            for a in after:
                assert pos.get(a, -1) < at[hook], f"{who}: hook {hook} ran before {a} was released"
    missing = exp.released - set(released)
    assert not missing, f"{who}: never released: {sorted(missing)}"

"""Run a scenario program in a fresh process and judge it against the catalogue.

`run_scenario` runs ``sN_unprotected.py`` or ``sN_protected.py`` with
[`exitsafe.testing.run`][exitsafe.testing.run] (``python -X faulthandler``, exitsafe's trace on,
its own process group killed on timeout), collects the runtime's leak
reports through a private ``EXITSAFE_LAB_LEAK_REPORT`` file, and returns a
`ScenarioRun` saying whether the program did what
`exitsafe.lab.catalog` says it must, and if not, every way it did not.

Both the test suite and ``exitsafe demo`` use it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from exitsafe.testing import ExitResult, run

from .catalog import Scenario
from .report import LeakReport, parse_leak_reports

__all__ = [
    "FATAL_PREFIX",
    "ScenarioRun",
    "describe_exit",
    "fatal_lines",
    "ledger_summary",
    "run_scenario",
    "survived_with_evidence",
]

FATAL_PREFIX = "FATAL: "

#: Variables a scenario run never inherits from the caller's environment (a
#: scenario's own ``env`` or the caller's ``env`` argument may still set them).
_SCRUBBED = (
    "EXITSAFE_AT_EXIT",
    "EXITSAFE_STEP_TIMEOUT",
    "EXITSAFE_TEARDOWN_TIMEOUT",
    "EXITSAFE_LEDGER",
    "EXITSAFE_QUIESCE",  # (it would quiesce the unprotected programs too: S12 would not fail)
    "EXITSAFE_LAB_LEAK_EXITCODE",
    "EXITSAFE_LAB_LEAK_REPORT",
)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding exitsafe/


@dataclass
class ScenarioRun:
    """One run of one scenario program, judged.

    :ivar ok: the program did what the catalogue says (failed as expected when
        unprotected; exited cleanly with exactly the expected leaks when protected).
    :ivar problems: every way it did not, in words (empty when ``ok``).
    :ivar outcome: how it ended, decoded in a few words (``"SIGSEGV"``,
        ``"SIGABRT + FATAL: ..."``, ``"hang, killed after 3 s"``, ``"exit 0"``).
    :ivar detail: the leak report (and, protected, the ledger) in a few words.
    """

    scenario: Scenario
    protected: bool
    result: ExitResult
    reports: List[LeakReport]
    env: Dict[str, str]
    problems: List[str] = field(default_factory=list)
    outcome: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def main_report(self) -> Optional[LeakReport]:
        """The leak report of the program's own process (not of a forked child)."""
        for report in self.reports:
            if not report.forked:
                return report
        return None

    @property
    def child_reports(self) -> List[LeakReport]:
        return [r for r in self.reports if r.forked]

    @property
    def duration(self) -> float:
        return self.result.duration

    def to_dict(self) -> Dict[str, object]:
        """The run as JSON-ready data."""
        result = self.result
        return {
            "scenario": self.scenario.id,
            "variant": "protected" if self.protected else "unprotected",
            "ok": self.ok,
            "problems": list(self.problems),
            "outcome": self.outcome,
            "detail": self.detail,
            "returncode": result.returncode,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "fatal": fatal_lines(result.stderr),
            "fatal_python_error": result.fatal_error.message if result.fatal_error else None,
            "unraisable": len(result.unraisable),
            "leak_reports": [dict(r.fields) for r in self.reports],
            "ledger": ledger_summary(result),
            "duration": round(result.duration, 3),
            "env": dict(self.env),
        }


def fatal_lines(stderr: str) -> List[str]:
    """The runtime's ``FATAL: ...`` lines in ``stderr``."""
    return [line for line in stderr.splitlines() if line.startswith(FATAL_PREFIX)]


def _short_fatal(line: str) -> str:
    """``FATAL: device released twice`` without the parenthesised call details."""
    return line.split(" (", 1)[0]


def describe_exit(result: ExitResult, hang_timeout: Optional[float] = None) -> str:
    """How a run ended in a few words: ``SIGSEGV``, ``SIGABRT + FATAL: ...``,
    ``hang, killed after 3 s``, ``exit 0``, ``exit 23``."""
    if result.timed_out:
        limit = hang_timeout if hang_timeout is not None else result.timeout
        return f"hang, killed after {limit:g} s" if limit is not None else "hang, killed"
    fatal = fatal_lines(result.stderr)
    if result.signal is not None:
        text = result.signal
        if fatal:
            text += " + " + _short_fatal(fatal[0])
        elif result.fatal_error is not None:
            text += f" (Fatal Python error: {result.fatal_error.message})"
        return text
    text = f"exit {result.returncode}"
    if fatal:
        text += " + " + _short_fatal(fatal[0])
    return text


def ledger_summary(result: ExitResult) -> Dict[str, int]:
    """exitsafe's teardown outcomes over every registry, from the trace (``{}`` if none);
    late releases count as ``late_release``."""
    counts: Dict[str, int] = {}
    for teardown in result.registries:
        for outcome, n in teardown.outcomes.items():
            counts[outcome] = counts.get(outcome, 0) + n
        if teardown.late_releases:
            counts["late_release"] = counts.get("late_release", 0) + teardown.late_releases
    return counts


def _leak_text(reports: List[LeakReport]) -> str:
    main = next((r for r in reports if not r.forked), None)
    if main is None:
        return "no leak report (the runtime never unloaded)"
    text = main.summary()
    children = [r for r in reports if r.forked]
    if children:
        text += "; child: " + ", ".join(c.summary() for c in children)
    return text


def _scenario_env(
    scenario: Scenario, report_path: Path, env: Optional[Mapping[str, str]]
) -> Dict[str, str]:
    full: Dict[str, str] = {}
    full.update(scenario.env)
    full.update(env or {})
    full["EXITSAFE_LAB_LEAK_REPORT"] = str(report_path)
    return full


def run_scenario(
    scenario: Scenario,
    *,
    protected: bool,
    env: Optional[Mapping[str, str]] = None,
    python: Optional[str] = None,
    timeout: Optional[float] = None,
) -> ScenarioRun:
    """Run one scenario program once and judge it.

    ``env`` is added on top of the scenario's own environment (e.g.
    ``{"EXITSAFE_AT_EXIT": "release"}``; the expected leaks then follow
    `Scenario.leaks_when_releasing`).  ``timeout`` defaults to the
    scenario's ``hang_timeout`` for an unprotected program expected to hang,
    else to its ``timeout``.  The lab libraries must be buildable (the caller
    usually builds them first, so parallel runs find them in the cache).
    """
    hang = not protected and scenario.failure.kind == "hang"
    limit = (
        timeout if timeout is not None else (scenario.hang_timeout if hang else scenario.timeout)
    )
    with tempfile.TemporaryDirectory(prefix="exitsafe-lab-") as tmp:
        report_path = Path(tmp) / "leaks.txt"
        run_env = _scenario_env(scenario, report_path, env)
        child_env: Dict[str, Optional[str]] = {name: None for name in _SCRUBBED}
        child_env.update(run_env)
        pythonpath = os.environ.get("PYTHONPATH")
        child_env["PYTHONPATH"] = (
            _PACKAGE_ROOT + os.pathsep + pythonpath if pythonpath else _PACKAGE_ROOT
        )
        result = run(
            script=scenario.script(protected),
            env=child_env,
            timeout=limit,
            python=python or sys.executable,
        )
        reports = parse_leak_reports(
            report_path.read_text(encoding="utf-8", errors="replace")
            if report_path.exists()
            else ""
        )
    shown_env = {k: v for k, v in run_env.items() if k != "EXITSAFE_LAB_LEAK_REPORT"}
    outcome_run = ScenarioRun(scenario, protected, result, reports, shown_env)
    outcome_run.outcome = describe_exit(result, limit if hang else None)
    if protected:
        override = (env or {}).get("EXITSAFE_AT_EXIT", "").strip().lower()
        if override == "release":
            expected = scenario.leaks_when_releasing
        elif override == "leak":
            expected = scenario.leaks_when_leaking
        else:
            expected = scenario.leaks
        own_policy = "EXITSAFE_AT_EXIT" not in (env or {})
        outcome_run.problems = _judge_protected(
            scenario, result, reports, dict(expected), check_trace=own_policy
        )
        ledger = ledger_summary(result)
        detail = _leak_text(reports)
        if ledger:
            detail += "; ledger: " + " ".join(f"{k}={v}" for k, v in sorted(ledger.items()))
        outcome_run.detail = detail
    else:
        outcome_run.problems = _judge_unprotected(scenario, result, reports)
        if survived_with_evidence(scenario, result, reports):
            outcome_run.outcome += " (did not crash this time; report: " + " ".join(
                f"{k}={v}" for k, v in scenario.failure.evidence.items()
            ) + ")"
        outcome_run.detail = _leak_text(reports) if scenario.failure.kind == "leaks" else ""
    return outcome_run


def survived_with_evidence(
    scenario: Scenario, result: ExitResult, reports: List[LeakReport]
) -> bool:
    """The unprotected run did not die by a signal (it exited, or it hung and was killed
    at the time limit), but the runtime's leak report proves the undefined behaviour of
    a ``"signal"`` scenario ran (`Failure.evidence`): it happened not to crash
    this time.  (S4 on CPython 3.9 can hang instead: its native thread's late callback
    waits forever for the finalized interpreter.)"""
    evidence = scenario.failure.evidence
    if not evidence or (result.signal is not None and not result.timed_out):
        return False
    main = next((r for r in reports if not r.forked), None)
    return main is not None and all(main.fields.get(k) == v for k, v in evidence.items())


def _judge_unprotected(
    scenario: Scenario, result: ExitResult, reports: List[LeakReport]
) -> List[str]:
    failure = scenario.failure
    problems: List[str] = []
    fatal = fatal_lines(result.stderr)
    got = describe_exit(result)
    if failure.kind == "hang":
        if not result.timed_out:
            problems.append(f"expected a hang, but it ended: {got}")
    elif result.timed_out and not survived_with_evidence(scenario, result, reports):
        problems.append(f"expected {failure.summary}, but it hung and was killed")
    elif result.timed_out:
        pass  # the undefined behaviour ran (the report proves it) and hung instead of crashing
    elif failure.kind == "signal":
        if result.signal not in failure.signals and not survived_with_evidence(
            scenario, result, reports
        ):
            expected = f"death by {'/'.join(failure.signals)}"
            if failure.evidence:
                expected += " (or an exit whose leak report shows " + " ".join(
                    f"{k}={v}" for k, v in failure.evidence.items()
                ) + ")"
            problems.append(f"expected {expected}, got {got}")
    elif failure.kind == "fatal":
        if result.signal != "SIGABRT":
            problems.append(f"expected SIGABRT after a FATAL line, got {got}")
        if len(fatal) != 1:
            problems.append(f"expected exactly one FATAL line, got {len(fatal)}: {fatal}")
        elif failure.fatal and failure.fatal not in fatal[0]:
            problems.append(f"expected a FATAL line containing {failure.fatal!r}, got {fatal[0]!r}")
    elif failure.kind == "leaks":
        if result.returncode != failure.exit_code:
            problems.append(f"expected exit status {failure.exit_code}, got {got}")
        main = next((r for r in reports if not r.forked), None)
        if main is None:
            problems.append("expected a leak report, found none")
        elif main.leaks != dict(failure.leaks):
            problems.append(f"expected leaks {dict(failure.leaks)}, got {main.leaks}")
    else:
        problems.append(f"unknown failure kind {failure.kind!r} in the catalogue")
    return problems


def _judge_protected(
    scenario: Scenario,
    result: ExitResult,
    reports: List[LeakReport],
    expected_leaks: Dict[str, int],
    check_trace: bool,
) -> List[str]:
    problems: List[str] = []
    if result.timed_out:
        problems.append(f"hung: killed after {result.timeout:g} s")
    elif result.returncode != 0:
        problems.append(f"expected exit status 0, got {describe_exit(result)}")
    fatal = fatal_lines(result.stderr)
    if fatal:
        problems.append(f"the runtime printed {fatal[0]!r}")
    if result.fatal_error is not None:
        problems.append(f"faulthandler dump: Fatal Python error: {result.fatal_error.message}")
    if result.unraisable:
        first = result.unraisable[0]
        problems.append(
            f"{len(result.unraisable)} 'Exception ignored' block(s), first: "
            f"{first.exc_type or 'exception'} in {first.where}"
        )
    for teardown in result.registries:
        if not teardown.finished:
            problems.append(f"exitsafe's teardown of registry {teardown.registry!r} did not finish")
    if "exitsafe: teardown of registry" in result.stderr:
        problems.append("exitsafe reported a failed teardown")
    if result.uncaught is not None:
        problems.append(f"uncaught exception: {result.uncaught.exc_type}")
    if "Traceback (most recent call last)" in result.stderr and not problems:
        problems.append("a traceback was printed on stderr")
    main = next((r for r in reports if not r.forked), None)
    if main is None:
        problems.append("no leak report from the runtime (it never unloaded)")
    elif main.leaks != expected_leaks:
        problems.append(
            f"expected leaks {expected_leaks or 'none'}, the runtime reported "
            f"{main.leaks or 'none'}"
        )
    if scenario.child_inherited is not None:
        children = [r for r in reports if r.forked]
        if len(children) != 1:
            problems.append(f"expected one leak report from the forked child, got {len(children)}")
        else:
            child = children[0]
            if child.inherited != scenario.child_inherited or child.total:
                problems.append(
                    f"expected the child to keep {scenario.child_inherited} inherited objects and "
                    f"leak none, it reported {child.summary()}"
                )
    for text in scenario.protected_stdout:
        if text not in result.stdout:
            problems.append(f"expected {text!r} on stdout")
    for text in scenario.protected_trace if check_trace else ():
        if text not in result.stderr:
            problems.append(f"expected {text!r} in exitsafe's trace")
    return problems

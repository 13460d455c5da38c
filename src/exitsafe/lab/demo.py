"""``exitsafe demo``: run the scenario catalogue without and with exitsafe, and show the table.

For every selected scenario (all of S1-S13 by default) both programs run in
fresh processes, in parallel: the unprotected one must fail the way the
catalogue says, the protected one must exit 0 with exactly the leaks its
exit policy allows.  Progress goes to stderr; the table (or, with
``--json``, the same as data) goes to stdout.

Exit status: 0 when every unprotected run failed as expected and every
protected run was clean; 1 otherwise; 2 for a usage error or when the lab
runtime cannot be built (no C compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from . import catalog
from .build import LabBuildError, build
from .catalog import Scenario
from .runner import ScenarioRun, ledger_summary, run_scenario

__all__ = ["ScenarioResult", "main", "render_table", "run_demo"]


@dataclass
class ScenarioResult:
    """Both runs of one scenario."""

    scenario: Scenario
    unprotected: ScenarioRun
    protected: ScenarioRun

    @property
    def ok(self) -> bool:
        return self.unprotected.ok and self.protected.ok


def _parse_only(text: str) -> List[str]:
    ids = [part.strip() for part in text.split(",") if part.strip()]
    for scenario_id in ids:
        catalog.get(scenario_id)  # KeyError names the unknown id
    return ids


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exitsafe demo",
        description=(
            "Run the scenario catalogue (S1-S13) without and with exitsafe, each in a "
            "fresh process, and show what happened."
        ),
    )
    parser.add_argument(
        "--only",
        metavar="IDS",
        help="comma-separated scenario ids to run, e.g. S1,S3 (default: all)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of a table"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="programs to run at once (default: the number of CPUs, at most 8)",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        default=sys.executable,
        help="the interpreter that runs the scenarios (default: this one)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the scenarios and exit without running them"
    )
    return parser


def run_demo(
    scenarios: Sequence[Scenario],
    *,
    jobs: int = 0,
    python: Optional[str] = None,
    progress: Optional[TextIO] = None,
) -> List[ScenarioResult]:
    """Run both programs of every scenario (in parallel) and return the judged results,
    in catalogue order.  Progress lines go to ``progress`` when given."""
    workers = jobs if jobs > 0 else min(8, os.cpu_count() or 2)
    tasks = [(s, protected) for s in scenarios for protected in (False, True)]
    done: Dict[Tuple[str, bool], ScenarioRun] = {}
    lock = threading.Lock()
    width = len(str(len(tasks)))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {
            pool.submit(run_scenario, s, protected=p, python=python): (s, p) for s, p in tasks
        }
        for future in as_completed(futures):
            scenario, protected = futures[future]
            run = future.result()
            with lock:
                done[(scenario.id, protected)] = run
                if progress is not None:
                    mark = "ok" if run.ok else "UNEXPECTED"
                    variant = "protected  " if protected else "unprotected"
                    progress.write(
                        f"[{len(done):>{width}}/{len(tasks)}] {scenario.id:<3} {variant} "
                        f"{run.duration:5.1f} s  {run.outcome}  ({mark})\n"
                    )
                    progress.flush()
    return [ScenarioResult(s, done[(s.id, False)], done[(s.id, True)]) for s in scenarios]


def _count(n: int, word: str) -> str:
    return f"{n} {word}"


def _ledger_words(ledger: Dict[str, int]) -> str:
    """What exitsafe's teardown did, in a few words (late no-op releases left out)."""
    parts: List[str] = []
    if ledger.get("released_at_exit"):
        parts.append(_count(ledger["released_at_exit"], "released"))
    leaked = [
        (ledger.get("leaked_policy", 0), "by policy"),
        (ledger.get("leaked_timeout", 0), "timed out"),
        (ledger.get("leaked_in_use", 0), "in use"),
        (ledger.get("leaked_dependent", 0), "dependent"),
    ]
    if any(n for n, _ in leaked):
        parts.append("leaked " + " + ".join(f"{n} {why}" for n, why in leaked if n))
    failed = sum(ledger.get(k, 0) for k in ("release_failed", "hook_failed", "hook_timeout"))
    # leaked_inherited (a forked child's teardown) is shown from the child's leak report.
    if failed:
        parts.append(_count(failed, "failed"))
    return ", ".join(parts)


def _without_cell(run: ScenarioRun) -> str:
    result = run.result
    if (
        result.signal is not None
        and not result.timed_out
        and run.outcome.startswith(result.signal + " (Fatal Python error")
    ):
        text = result.signal  # the faulthandler line only repeats the signal
    else:
        text = run.outcome
    if run.detail:
        text += f"; {run.detail}"
    if not run.ok:
        text += " -- UNEXPECTED: " + "; ".join(run.problems)
    return text


def _with_cell(run: ScenarioRun) -> str:
    main = run.main_report
    text = run.outcome + ", " + (main.summary() if main is not None else "no leak report")
    notes = _ledger_words(ledger_summary(run.result))
    children = run.child_reports
    if children:
        kept = sum(c.inherited for c in children)
        leaked = sum(c.total for c in children)
        notes += ("; " if notes else "") + f"child: {kept} inherited kept, {leaked} leaked"
    if notes:
        text += f" ({notes})"
    if not run.ok:
        text += " -- UNEXPECTED: " + "; ".join(run.problems)
    return text


def render_table(results: Sequence[ScenarioResult], width: Optional[int] = None) -> str:
    """The results as a plain-text table, ``width`` columns wide (default: the terminal's
    width, at least 100); long cells wrap inside their column."""
    if width is None:
        width = max(100, shutil.get_terminal_size((140, 24)).columns)
    headers = ("", "scenario", "without exitsafe", "time", "with exitsafe", "time", "")
    rows = [
        (
            r.scenario.id,
            r.scenario.short or r.scenario.title,
            _without_cell(r.unprotected),
            f"{r.unprotected.duration:.1f} s",
            _with_cell(r.protected),
            f"{r.protected.duration:.1f} s",
            "ok" if r.ok else "FAIL",
        )
        for r in results
    ]
    gap = "  "
    widths = [3, 0, 0, 6, 0, 6, 4]
    available = max(60, width - sum(widths) - len(gap) * (len(widths) - 1))
    longest = max((len(row[1]) for row in rows), default=10)
    widths[1] = min(longest, 40, max(16, available * 35 // 100))
    flexible = available - widths[1]
    widths[2] = flexible * 45 // 100
    widths[4] = flexible - widths[2]
    lines: List[str] = []
    wraps = False

    def emit(cells: Sequence[str]) -> None:
        nonlocal wraps
        wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths)]
        height = max(len(w) for w in wrapped)
        wraps = wraps or height > 1
        for i in range(height):
            parts = [(w[i] if i < len(w) else "").ljust(n) for w, n in zip(wrapped, widths)]
            lines.append(gap.join(parts).rstrip())

    emit(headers)
    lines.append(gap.join("-" * n for n in widths))
    body_start = len(lines)
    row_starts: List[int] = []
    for row in rows:
        row_starts.append(len(lines))
        emit(row)
    if wraps:  # separate multi-line rows with a blank line so each stays readable
        for index in reversed(row_starts[1:]):
            lines.insert(index, "")
    del body_start
    return "\n".join(lines)


def _legend(results: Sequence[ScenarioResult]) -> str:
    lines = ["How exitsafe fixes each:"]
    for r in results:
        lines.append(f"  {r.scenario.id:<4} {r.scenario.protected_by}")
    return "\n".join(lines)


def _summary(results: Sequence[ScenarioResult], elapsed: float) -> str:
    bad = [r for r in results if not r.ok]
    if not bad:
        return (
            f"All {len(results)} scenarios behaved as expected in {elapsed:.1f} s: every "
            "program without exitsafe crashed, aborted, hung or leaked; every program with "
            "exitsafe exited 0 with only the leaks its exit policy chose."
        )
    return (
        f"{len(bad)} of {len(results)} scenarios did NOT behave as expected: "
        + ", ".join(r.scenario.id for r in bad)
        + " (see the UNEXPECTED notes above)."
    )


def _interpreter(python: str) -> str:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return f"{platform.python_implementation()} {platform.python_version()}"
    return python


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``exitsafe demo``; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    try:
        ids = _parse_only(args.only) if args.only else None
    except KeyError as exc:
        print(f"exitsafe demo: {exc.args[0]}", file=sys.stderr)
        return 2
    scenarios = catalog.select(ids)
    if args.list:
        for s in scenarios:
            print(
                f"{s.id:<4} {s.title}\n     without: {s.failure.summary}\n"
                f"     with:    {s.protected_by}"
            )
        return 0
    if sys.platform == "win32":
        print("exitsafe demo: the scenario lab needs a POSIX system", file=sys.stderr)
        return 2
    err = sys.stderr
    err.write("exitsafe demo: building the lab runtime (cached after the first time)...\n")
    err.flush()
    try:
        libs = build()
    except LabBuildError as exc:
        print(f"exitsafe demo: cannot build the lab runtime: {exc}", file=err)
        return 2
    err.write(
        f"exitsafe demo: running {len(scenarios)} scenario(s) x 2 programs with "
        f"{_interpreter(args.python)} ({libs.directory})\n"
    )
    err.flush()
    started = time.monotonic()
    results = run_demo(scenarios, jobs=args.jobs, python=args.python, progress=err)
    elapsed = time.monotonic() - started
    ok = all(r.ok for r in results)
    if args.json:
        data = {
            "ok": ok,
            "python": _interpreter(args.python),
            "duration": round(elapsed, 3),
            "libraries": {"runtime": str(libs.runtime), "compiler": str(libs.compiler)},
            "scenarios": [
                {
                    "id": r.scenario.id,
                    "title": r.scenario.title,
                    "protected_by": r.scenario.protected_by,
                    "expected": r.scenario.to_dict(),
                    "ok": r.ok,
                    "unprotected": r.unprotected.to_dict(),
                    "protected": r.protected.to_dict(),
                }
                for r in results
            ],
        }
        print(json.dumps(data, indent=2))
    else:
        print(
            f"exitsafe demo: each scenario's binding written the usual way, then with "
            f"exitsafe ({_interpreter(args.python)})\n"
        )
        print(render_table(results))
        print()
        print(_legend(results))
        print()
        print(_summary(results, elapsed))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

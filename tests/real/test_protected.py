"""Each real-binding program, protected by exitsafe, exits cleanly every time: N of N runs
(``Case.protected_runs``, 20) on every interpreter the package has wheels for.

Clean is ``ExitResult.clean`` and, besides, no "Traceback" and no "Exception in thread" on
stderr: a thread ended while printing its exception leaves a line cut short, which the
parser of ``exitsafe.testing`` does not take for one.  Where the case says how
(``Case.reads_back``), the file the program wrote must then read back whole.  A case whose
``protected_unclean`` names a limitation of exitsafe is an expected failure (not strict:
the limitation shows in a few runs in a hundred for some); an unexpected pass says it is
gone.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult, run

from .cases import CASES, PROGRAMS, Case
from .conftest import environment_for, versions

#: (case, protected program): its ``protected`` one, then each of ``also_protected``
PROTECTED = [
    (case, program)
    for case in CASES
    if case.protected is not None
    for program in (case.protected, *case.also_protected)
]
FORBIDDEN = ("Traceback", "Exception in thread")


def clean(result: ExitResult) -> bool:
    return result.clean and not any(text in result.stderr for text in FORBIDDEN)


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(
    ("case", "program"),
    PROTECTED,
    ids=[case.id if program == case.protected else f"{case.id}[{program}]"
         for case, program in PROTECTED],
)
def test_protected_program_exits_cleanly_every_time(
    case: Case, program: str, version: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = environment_for(version, case)
    unclean = case.protected_unclean if program == case.protected else None
    if unclean:
        request.applymarker(pytest.mark.xfail(reason=unclean, strict=False))

    unread: dict[int, str] = {}

    def one(attempt: int) -> ExitResult:
        cwd = tmp_path / f"run-{attempt + 1}"
        cwd.mkdir()
        result = run(
            script=PROGRAMS / program,
            python=env.python,
            timeout=case.timeout,
            cwd=cwd,
            env=dict(case.env or ()),
        )
        if case.reads_back is not None and clean(result):
            check = subprocess.run(
                [str(env.python), "-c", case.reads_back],
                cwd=cwd, capture_output=True, text=True, timeout=120,
            )
            if check.returncode != 0:
                unread[attempt] = check.stderr[-2000:]
        return result

    # Two runs at a time (independent processes, each in its own directory): the 20 runs
    # of every case and interpreter fit in CI's time that way.  An expected failure stops
    # at the first pair with an unclean run.
    results: list[ExitResult] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        if not unclean:
            results = list(pool.map(one, range(case.protected_runs)))
        for first in range(0, case.protected_runs if unclean else 0, 2):
            batch = range(first, min(first + 2, case.protected_runs))
            results += pool.map(one, batch)
            if not all(map(clean, results[-len(batch):])):
                break
    for attempt, result in enumerate(results):
        printed = [text for text in FORBIDDEN if text in result.stderr]
        assert clean(result), (
            f"{program} on CPython {version}, run {attempt + 1} of "
            f"{case.protected_runs}: {result.summary()}"
            + (f" (stderr has {', '.join(map(repr, printed))})" if printed else "")
            + f"\n\n{result.report()}"
        )
    assert not unread, (
        f"{program} on CPython {version}: its output does not read back after "
        f"{len(unread)} clean run(s) of {case.protected_runs}: {unread}"
    )

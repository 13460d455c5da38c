"""Each real-binding program, protected by exitsafe, exits cleanly every time: N of N runs
(``Case.protected_runs``, 20) on every interpreter the package has wheels for."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult, run

from .cases import CASES, Case
from .conftest import environment_for, versions

PROTECTED = [case for case in CASES if case.protected is not None]


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("case", PROTECTED, ids=[case.id for case in PROTECTED])
def test_protected_program_exits_cleanly_every_time(
    case: Case, version: str, tmp_path: Path
) -> None:
    env = environment_for(version, case)

    def one(attempt: int) -> ExitResult:
        cwd = tmp_path / f"run-{attempt + 1}"
        cwd.mkdir()
        return run(
            script=case.protected_script,
            python=env.python,
            timeout=case.timeout,
            cwd=cwd,
            env=dict(case.env or ()),
        )

    # Two runs at a time (independent processes, each in its own directory): the 20 runs
    # of every case and interpreter fit in CI's time that way.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, range(case.protected_runs)))
    for attempt, result in enumerate(results):
        assert result.clean, (
            f"{case.protected} on CPython {version}, run {attempt + 1} of "
            f"{case.protected_runs}: {result.summary()}\n\n{result.report()}"
        )

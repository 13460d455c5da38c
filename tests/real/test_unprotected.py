"""Each real-binding program, unprotected, really fails: in at least one of N runs it ends
the way its case describes (see ``cases.py``), on every interpreter with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cases import CASES, Case
from .conftest import environment_for, run_until_failure, versions


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_unprotected_program_fails(case: Case, version: str, tmp_path: Path) -> None:
    env = environment_for(version, case)
    results, failed = run_until_failure(case, env, tmp_path)
    seen = "; ".join(f"run {i + 1}: {r.summary()}" for i, r in enumerate(results))
    assert failed, (
        f"{case.program} on CPython {version} did not fail as described "
        f"({case.summary}) in {len(results)} runs: {seen}\n\nlast run:\n{results[-1].report()}"
    )

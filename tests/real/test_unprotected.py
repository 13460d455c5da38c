"""Each real-binding program, unprotected, really fails: in at least one of N runs it ends
the way its case describes (see ``cases.py``), on every interpreter with the package, and
``exitsafe run``'s report names that failure by one of the case's kinds in its first line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult

from .cases import CASES, Case, RealEnv
from .conftest import environment_for, run_all, run_until_failure, versions


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_unprotected_program_fails(case: Case, version: str, tmp_path: Path) -> None:
    env = environment_for(version, case)
    if case.clean_from is not None and env.version >= case.clean_from[0]:
        _assert_clean_there(case, env, tmp_path)
        return
    results, failed = run_until_failure(case, env, tmp_path)
    seen = "; ".join(f"run {i + 1}: {r.summary()}" for i, r in enumerate(results))
    assert failed, (
        f"{case.program} on CPython {version} did not fail as described "
        f"({case.summary}) in {len(results)} runs: {seen}\n\nlast run:\n{results[-1].report()}"
    )
    assert_named(case, results[-1])


def _assert_clean_there(case: Case, env: RealEnv, cwd: Path) -> None:
    """``case.clean_from``: on this interpreter the unprotected program exits clean, every
    one of ``case.runs`` runs (CPython changed; when it changes back, this says so), but
    for a failure of ``case.still_from``'s kinds, without a signal."""
    assert case.clean_from is not None
    results = run_all(case, env, cwd)
    unclean = [
        f"run {i + 1}: {r.summary()}"
        for i, r in enumerate(results)
        if not r.clean and not _still_there(case, r)
    ]
    assert not unclean, (
        f"{case.program} on CPython {env.name}, expected clean there "
        f"({case.clean_from[1]}): " + "; ".join(unclean)
    )


def _still_there(case: Case, result: ExitResult) -> bool:
    """An unclean run of a failure that did not go with CPython's change."""
    diagnosis = result.diagnosis
    return (
        result.signal is None
        and not result.timed_out
        and diagnosis is not None
        and diagnosis.kind in case.still_from
    )


def assert_named(case: Case, result: ExitResult) -> None:
    """The report's first line names the failure with one of the case's kinds (issue 29's
    bar: a real program the project never saw is diagnosed right in its first line)."""
    assert bool(case.kinds) != bool(case.unnamed), f"{case.id}: give kinds or unnamed"
    first = result.summary()
    diagnosis = result.diagnosis
    if not case.kinds:
        # a known gap (case.unnamed): a kind showing up here means it is closed
        assert diagnosis is None, f"{case.id} is now named: {first}; update cases.py"
        assert first.startswith("NOT CLEAN: "), first
        return
    named = diagnosis.kind if diagnosis is not None else None
    if named is None and case.unnamed_when is not None:
        pattern, why = case.unnamed_when
        if re.search(pattern, result.stdout):
            # the one way of failing no kind can name (why): the first line says so plainly
            assert first.startswith("NOT CLEAN: "), f"{first} ({why})"
            return
    assert named in case.kinds, (
        f"{case.program}: the report's first line names {named!r}, not one of "
        f"{case.kinds}:\n{result.report()}"
    )
    assert first.startswith(f"NOT CLEAN [{named}]: "), first

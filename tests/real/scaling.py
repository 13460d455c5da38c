"""What the scaling tests (``test_scaling_*.py``) share: a case per way the workers end, a
program's runs (two at a time, each in its own directory), and the checks of a run whose
program prints how each of its workers ended (``programs/shards.py``)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from exitsafe.testing import ExitResult, run

from .cases import Case, RealEnv, real_envs
from .conftest import environment_for

#: The interpreters between the oldest and the newest local ones (pyenv's, the main one
#: included), where a series of runs looking for a race (pools, dask, Ray tasks) makes at
#: most `BETWEEN_RUNS` runs: each path is still seen to end as it must there.  Every other
#: interpreter (3.9, 3.13, Debian sid's 3.14 and 3.15) makes the series' whole count: the
#: oldest and the newest carry the frameworks' oldest and newest releases (Ray 2.51 and
#: 2.60, distributed 2024.8 and 2026.8), and the 3.14 change of the default start method.
#: The whole count everywhere would add about 6 minutes to CI's run.
BETWEEN = ("3.10", "3.11", "3.12")
BETWEEN_RUNS = 2


def runs_on(version: str, runs: int) -> int:
    """How many of a series' ``runs`` are made on CPython ``version`` (see `BETWEEN`)."""
    return min(runs, BETWEEN_RUNS) if version in BETWEEN else runs


def per_end_case(program: str, end: str, runs: int, **fields: Any) -> Case:
    """The case of ``program`` (in ``programs/``) with its workers ended by ``end``, id
    ``<program>-<end>`` (``dask-worker-shards-sigterm``), ``runs`` runs; a run fails when it
    is not clean.  ``fields``: the case's other fields (``package``, ``timeout``, ...)."""
    return Case(
        id=f"{program.replace('_', '-')[:-3]}-{end}",
        program=program,
        fails=lambda result, version: not result.clean,
        runs=runs,
        **fields,
    )


def shard_environment(version: str, case: Case) -> tuple[RealEnv, dict[str, str]]:
    """The environment of ``version`` for ``case``, whose ``package`` or ``also_needs``
    names h5py (the workers' shards), and the variables that choose the shards' format
    (``programs/shards.py``): none (HDF5) where h5py is installed; ``SHARD_FORMAT=parquet``
    where only pyarrow is (CPython 3.15: h5py has no wheel there), a stand-in with the same
    property (a file never closed does not read back); else `environment_for`'s skip."""
    for env in real_envs():
        packages = env.packages
        if env.name == version and packages.get("h5py", "-") == "-" and (
            packages.get("pyarrow", "-") != "-"
        ):
            def swap(name: str) -> str:
                return "pyarrow" if name == "h5py" else name

            stand_in = dataclasses.replace(
                case, package=swap(case.package), also_needs=tuple(map(swap, case.also_needs))
            )
            return environment_for(version, stand_in), {"SHARD_FORMAT": "parquet"}
    return environment_for(version, case), {}


def run_two_at_a_time(
    script: Path,
    runs: int,
    tmp_path: Path,
    *,
    python: Path,
    timeout: float,
    env: Optional[Mapping[str, str]] = None,
    args: Sequence[str] = (),
    keep_stdout: bool = False,
) -> list[ExitResult]:
    """Run ``script`` (``args`` after it) ``runs`` times with ``python``, two runs at a time,
    each in its own new directory ``tmp_path/run-<n>`` (``n`` from 1), its working directory
    (where the workers' ledgers go); the results in the order of ``n``.  ``keep_stdout``:
    each run's stdout is also written to ``stdout.txt`` in its directory."""

    def one(attempt: int) -> ExitResult:
        cwd = tmp_path / f"run-{attempt + 1}"
        cwd.mkdir()
        result = run(script=script, args=args, python=python, timeout=timeout, cwd=cwd,
                     env=env)
        if keep_stdout:
            (cwd / "stdout.txt").write_text(result.stdout)
        return result

    with ThreadPoolExecutor(max_workers=2) as pool:  # (two runs at a time, as elsewhere)
        return list(pool.map(one, range(runs)))


def assert_ends(
    results: Sequence[ExitResult],
    label: str,
    ended: Callable[[ExitResult], Mapping[Any, tuple[bool, ...]]],
    expected: Mapping[Any, Optional[tuple[bool, ...]]],
    what: str,
) -> None:
    """Assert of each run in ``results`` (run ``n`` of ``len(results)``, the messages name it
    after ``label``): that it ended by itself (no timeout, no signal); that ``ended(result)``,
    the program's report of each worker's end (a tuple whose first field says whether the
    worker's shard read back), has the workers of ``expected`` and each one's tuple, where
    ``None`` stands for either tuple of a race, all fields true or all false (``what`` names
    the fields in the message); and that the program exited 1 exactly when a shard did not
    read back, 0 otherwise."""
    for attempt, result in enumerate(results):
        where = f"{label}, run {attempt + 1} of {len(results)}"
        assert not result.timed_out and result.signal is None, (
            f"{where}: {result.summary()}\n\n{result.report()}"
        )
        got = ended(result)
        assert set(got) == set(expected) and all(
            got[key] == want if want is not None else len(set(got[key])) == 1
            for key, want in expected.items()
        ), (
            f"{where}: {what}: {got}, expected {expected}\n\n{result.stdout}\n"
            f"{result.stderr[-3000:]}"
        )
        assert result.returncode == int(not all(ends[0] for ends in got.values())), (
            f"{where}: {result.summary()}"
        )

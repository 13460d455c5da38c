"""exitsafe in the workers of the standard library's process pools (docs/scaling.md): for each
way a worker of ``multiprocessing.Pool`` or ``concurrent.futures.ProcessPoolExecutor`` ends
where exitsafe's teardown can run (by itself, or with the initializer recipe), every
worker's HDF5 shard reads back and its own ledger says ``released_at_exit``, 10 runs of 10
(2 of 2 on the interpreters between the oldest and the newest local ones,
``scaling.BETWEEN``) on every interpreter with h5py (``programs/h5py_process_pools.py``),
or with pyarrow (a Parquet shard instead: CPython 3.15, see ``scaling.shard_environment``).

``with Pool(...)`` right after the work (terminate while workers may be going idle) is the
``h5py-pool-terminate`` case of ``cases.py``; the crashed worker's own shard is never
readable (nothing runs in a process killed by SIGSEGV), so the program does not read it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult

from .cases import PROGRAMS, Case
from .conftest import versions
from .scaling import run_two_at_a_time, runs_on, shard_environment

PROGRAM = PROGRAMS / "h5py_process_pools.py"
RUNS = 10

#: (engine, end of the workers): every path where the workers' teardown runs
PATHS = [
    ("pool", "close"),
    ("pool", "crash"),
    ("pool", "spawn-terminate"),
    ("pool", "forkserver-terminate"),
    ("executor", "close"),
    ("executor", "cancel"),
    ("executor", "sigterm"),
    ("executor", "crash"),
]

#: only for ``environment_for``: the package the program needs
H5PY = Case(
    id="h5py-process-pools",
    program=PROGRAM.name,
    package="h5py",
    fails=lambda result, version: not result.clean,
    runs=RUNS,
    timeout=60.0,
    summary="process-pool workers' HDF5 shards, adopted by the pool's initializer",
)


def passed(result: ExitResult, end: str) -> bool:
    if result.timed_out or result.returncode != 0 or "Traceback" in result.stderr:
        return False
    if "unreadable 0" not in result.stdout:
        return False
    # a worker's SIGSEGV makes the run unclean for exitsafe.testing (a child crashed),
    # which is the path itself; elsewhere the run must be clean
    return end == "crash" or result.clean


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(("engine", "end"), PATHS, ids=[f"{e}-{p}" for e, p in PATHS])
def test_every_worker_shard_reads_back(
    engine: str, end: str, version: str, tmp_path: Path
) -> None:
    env, shard_format = shard_environment(version, H5PY)
    runs = runs_on(version, RUNS)
    results = run_two_at_a_time(PROGRAM, runs, tmp_path, python=env.python,
                                timeout=H5PY.timeout, args=[engine, end],
                                env={"EXITSAFE_LEDGER": "ledger-{pid}.json", **shard_format})
    for attempt, result in enumerate(results):
        assert passed(result, end), (
            f"{PROGRAM.name} {engine} {end} on CPython {version}, run {attempt + 1} of "
            f"{runs}: {result.summary()}\nstdout:\n{result.stdout}\n\n{result.report()}"
        )


#: (engine, end of the workers) where a release that hangs is bounded: a normal end (the
#: teardown from ``multiprocessing``'s finalizer) and both kinds of signal (the recipe's)
HANG_PATHS = [("pool", "close"), ("pool", "forkserver-terminate"), ("executor", "sigterm")]
HANG_BOUND = "1"


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(("engine", "end"), HANG_PATHS, ids=[f"{e}-{p}" for e, p in HANG_PATHS])
def test_a_release_that_hangs_is_bounded_in_every_worker(
    engine: str, end: str, version: str, tmp_path: Path
) -> None:
    """docs/scaling.md's "bounded" column: each worker adopts an object whose close never
    returns (``--hang``) before its shard.  With ``EXITSAFE_TEARDOWN_TIMEOUT`` the worker's
    teardown closes the shard, abandons that close at the bound and the worker ends: the
    pool ends, every shard reads back, and each worker's ledger records the object
    ``leaked_timeout`` and the shard ``released_at_exit`` (the program checks both).
    Without the bound the workers never end (measured: the parent's join waits for ever)."""
    env, shard_format = shard_environment(version, H5PY)
    runs = runs_on(version, RUNS)
    results = run_two_at_a_time(
        PROGRAM, runs, tmp_path, python=env.python, timeout=H5PY.timeout,
        args=[engine, end, "--hang"],
        env={"EXITSAFE_LEDGER": "ledger-{pid}.json", "EXITSAFE_TEARDOWN_TIMEOUT": HANG_BOUND,
             **shard_format},
    )
    for attempt, result in enumerate(results):
        assert passed(result, end), (
            f"{PROGRAM.name} {engine} {end} --hang on CPython {version}, run {attempt + 1} "
            f"of {runs}: {result.summary()}\nstdout:\n{result.stdout}\n\n{result.report()}"
        )
        assert result.stderr.count("'stuck' release still running after") >= 1, result.stderr


#: ``h5py_process_pools.py``'s line for each worker of a terminated pool
WORKER = re.compile(r"^worker ended by ([\w-]+): rows (\d+), shard (\w+)$", re.M)


def assert_each_terminated_worker(result: ExitResult, label: str) -> None:
    """Without the recipe, each worker of a terminated pool ends by the SIGTERM or by
    itself: a worker may take the pool's stop sentinel before the SIGTERM (a race inside
    ``Pool.terminate()``: 3.14.10, 6 runs of 12; 3.13, once in CI) and begin its normal
    end, where exitsafe's teardown closes its shard.  One that ended by itself has its
    shard readable.  One the SIGTERM ended may have either: killed at work or idle, its
    shard is unreadable; killed later in that normal end, after the teardown, it reads
    back (CI, 3.14.10 spawn: both workers so).  The exit code cannot tell the two apart,
    so the test checks what it can, and the program's status must agree (1 when a shard
    is unreadable); the failure itself is the ``h5py-pool-terminate`` case's."""
    workers = WORKER.findall(result.stdout)
    assert len(workers) == 2, f"{label}: {result.summary()}\n{result.stdout}"
    for ended, _rows, shard in workers:
        if ended == "itself":
            assert shard in ("readable", "none"), f"{label}: {result.stdout}"
        else:
            assert ended == "sigterm", f"{label}: {result.stdout}"
    unreadable = any(shard == "unreadable" for _, _, shard in workers)
    assert result.returncode == (1 if unreadable else 0), f"{label}: {result.summary()}"


#: The paths where a worker's teardown runs without the recipe (a normal end); on the
#: others a shard is left unreadable without it.
RUNS_WITHOUT = ("close", "cancel")
CONTROL_RUNS = 2
#: The controls: every path but a crash, where the other workers' shards may all be empty
#: (the crashed worker took every task; an HDF5 file created and never written reads back
#: even unclosed: seen once in about 40 runs), so no control can be asserted there.
CONTROL_PATHS = [(engine, end) for engine, end in PATHS if end != "crash"]


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(
    ("engine", "end"), CONTROL_PATHS, ids=[f"{e}-{p}" for e, p in CONTROL_PATHS]
)
def test_without_the_recipe_only_a_normal_end_closes_the_shards(
    engine: str, end: str, version: str, tmp_path: Path
) -> None:
    """The controls of the table's "without the recipe" column: the same program with the
    pool's initializer not wrapped."""
    env, shard_format = shard_environment(version, H5PY)
    results = run_two_at_a_time(PROGRAM, CONTROL_RUNS, tmp_path, python=env.python,
                                timeout=H5PY.timeout, args=[engine, end, "--plain"],
                                env=shard_format)
    for attempt, result in enumerate(results):
        label = f"{PROGRAM.name} {engine} {end} --plain on CPython {version}, run {attempt + 1}"
        assert not result.timed_out, f"{label}: {result.summary()}"
        if end in RUNS_WITHOUT:
            assert passed(result, end), f"{label}: {result.summary()}\n{result.stdout}"
        elif end.endswith("-terminate"):
            assert_each_terminated_worker(result, label)
        else:
            assert result.returncode == 1 and "unreadable 0" not in result.stdout, (
                f"{label}: a shard should be left unreadable\n{result.stdout}"
            )

"""Ray actors and task workers, each with an adopted HDF5 shard, ended every way Ray ends them
(``tests/real/programs/ray_actor_shards.py``, docs/scaling.md "Ray").  One driver run
(``ray_actor_shards_protected.py``) has an actor per way: the driver drops its last handle
(``scope``), ``__ray_terminate__``, ``exit_actor()`` inside the actor, ``ray.kill``, a crash
(SIGSEGV) and ``ray.shutdown()``, and, with the recipe (``__ray_terminate__`` first, waited
for), ``scope``, ``kill`` and ``shutdown`` again.  After the run each actor's shard is read
back and its worker's own ledger (``EXITSAFE_LEDGER=<dir>/ledger-{pid}.json``) is looked at.

* without the recipe: ``terminate`` and ``exit_actor`` run the worker's exit teardown (shard
  readable, its ledger records it), and so does ``scope`` with Ray 2.60 (Ray 2.51, the
  newest for CPython 3.9, force-exits an actor that went out of scope); ``kill`` and
  ``crash`` leave the shard unreadable and no ledger, and so does ``shutdown`` but for a
  rare race (once in about 30 runs on Ray 2.60 the worker took a SIGTERM first and exited
  normally), which the test lets pass;
* with the recipe, every actor but the crashed one closes its shard and writes its ledger.

One driver run covers every way (a Ray node and nine actors take 10-15 s to start and end
on an idle 2-core machine; two runs at a time, about 24 s a run).  10 runs on CPython 3.9
and 3.13, which cover both Ray versions (2.51, the newest for 3.9, and the one every newer
interpreter gets); 2 runs on the others (the same Ray as 3.13), keeping the file to about
5 minutes of CI with the task workers' runs (4-6 s a run: 10 runs, 2 on the interpreters
between the oldest and the newest local ones, ``scaling.BETWEEN``) and the bounded ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

import pytest

from exitsafe.testing import ExitResult

from .cases import Case
from .conftest import environment_for, versions
from .scaling import assert_ends, run_two_at_a_time, runs_on

#: the interpreters with the actor driver's full 10 runs (see the docstring); the others get 2
FULL_RUNS = ("3.9", "3.13")
LINE = re.compile(r"^actor ended by ([\w+]+): shard (readable|unreadable), ledger (\w+)$", re.M)

CASE = Case(
    id="ray-actor-shards",
    program="ray_actor_shards.py",
    package="ray",
    also_needs=("h5py",),  # (the workers' shards)
    fails=lambda result, version: not result.clean,
    runs=10,
    # a run takes 10-15 s on an idle 2-core machine (a Ray node, nine actors): the bound
    # is for a hang only
    timeout=240.0,
    summary="Ray actors ended by scope, terminate, exit_actor, kill, crash and shutdown, "
            "with and without the recipe",
    protected="ray_actor_shards_protected.py",
)


def expected(ray_version: str) -> dict[str, Optional[tuple[bool, bool]]]:
    """How each actor ends -> (shard readable, ledger records it released); ``None``: either
    all or nothing (a race: see ``shutdown``)."""
    major, minor = (int(p) for p in ray_version.split(".")[:2])
    # measured: Ray 2.51 force-exits an out-of-scope actor, 2.60 ends it the graceful way;
    # the change (ray-project/ray#57090) came after 2.51
    graceful_scope = (major, minor) >= (2, 52)
    ran, lost = (True, True), (False, False)
    return {
        "scope": ran if graceful_scope else lost,
        "terminate": ran,
        "exit_actor": ran,
        "kill": lost,
        "crash": lost,
        # lost, but once in about 30 runs on Ray 2.60 a SIGTERM from the node going down
        # reached the worker before the raylet's force exit, and Ray's own SIGTERM handler
        # in the worker (SystemExit) made it a normal exit: the teardown ran
        "shutdown": None,
        "scope+recipe": ran,
        "kill+recipe": ran,
        "shutdown+recipe": ran,
    }


def ends_by(line: re.Pattern[str]) -> Callable[[ExitResult], dict[str, tuple[bool, bool]]]:
    """What a driver printed of its workers' ends, read with ``line`` (``LINE``,
    ``TASK_LINE``): how each ended -> (shard readable, ledger released)."""

    def ended(result: ExitResult) -> dict[str, tuple[bool, bool]]:
        return {how: (shard == "readable", ledger == "released")
                for how, shard, ledger in line.findall(result.stdout)}

    return ended


@pytest.mark.parametrize("version", versions())
def test_ray_actors_teardown_per_path(version: str, tmp_path: Path) -> None:
    env = environment_for(version, CASE)
    want = expected(env.packages["ray"])
    runs = CASE.runs if version in FULL_RUNS else 2
    # (each run's stdout kept in its directory: what each actor's end gave)
    results = run_two_at_a_time(CASE.protected_script, runs, tmp_path, python=env.python,
                                timeout=CASE.timeout, keep_stdout=True)
    # (exit 1 in every run: the crashed actor's shard never reads back)
    assert_ends(results, f"{CASE.protected} on CPython {version} (ray {env.packages['ray']})",
                ends_by(LINE), want, "each actor's end -> (shard readable, ledger released)")


TASKS = Case(
    id="ray-task-shards",
    program="ray_task_shards.py",
    package="ray",
    also_needs=("h5py",),
    fails=lambda result, version: not result.clean,
    runs=10,
    timeout=240.0,  # (a run takes 4-6 s on an idle 2-core machine: for a hang only)
    summary="Ray task workers that keep an adopted shard, ended by max_calls=1, "
            "ray.cancel(force=True) and ray.shutdown()",
)
TASK_LINE = re.compile(
    r"^task worker ended by (\w+): shard (readable|unreadable), ledger (\w+)$", re.M
)
#: how each task worker ends -> (shard readable, ledger released); ``None``: the race of
#: ``shutdown`` (see ``expected``)
TASK_ENDS: dict[str, Optional[tuple[bool, bool]]] = {
    "max_calls": (True, True),  # the recipe: the worker exits normally after its task
    "cancel": (False, False),  # Ray's force exit: no code runs
    "shutdown": None,
}


@pytest.mark.parametrize("version", versions())
def test_ray_task_workers_teardown_per_path(version: str, tmp_path: Path) -> None:
    """Tasks (``programs/ray_task_shards.py``): a worker that keeps what its task adopted
    tears it down only where it exits normally, after a ``max_calls=1`` task; Ray
    force-exits it on ``ray.cancel(force=True)`` and at ``ray.shutdown()``.  10 runs (a
    run takes 4-6 s), 2 on the interpreters between the oldest and the newest local ones
    (``scaling.BETWEEN``)."""
    env = environment_for(version, TASKS)
    runs = runs_on(version, TASKS.runs)
    results = run_two_at_a_time(TASKS.script, runs, tmp_path, python=env.python,
                                timeout=TASKS.timeout, keep_stdout=True)
    assert_ends(
        results, f"{TASKS.program} on CPython {version} (ray {env.packages['ray']})",
        ends_by(TASK_LINE), TASK_ENDS,
        "each task worker's end -> (shard readable, ledger released)",
    )


#: the variables of the bounded runs: each worker also adopts, before its shard, an object
#: whose close never returns (``shards.Stuck``), and the teardown's bound is 1 s
BOUNDED = {"SHARD_HANG": "1", "EXITSAFE_TEARDOWN_TIMEOUT": "1"}


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize("program", ["actors", "tasks"])
def test_a_release_that_hangs_is_bounded_in_ray_workers(
    program: str, version: str, tmp_path: Path
) -> None:
    """docs/scaling.md's "bounded" column for Ray: the same drivers, each worker with an
    object whose close hangs adopted before its shard, and ``EXITSAFE_TEARDOWN_TIMEOUT=1``.
    Every worker whose teardown runs (a graceful end, the recipe's) closes its shard,
    abandons the hanging close at the bound and exits: the same ends as without it, and
    each such worker's ledger also records the object ``leaked_timeout`` (``shards.released``
    checks both).  The task driver runs as often as in its test above; the actor driver
    (nine actors, six of them torn down, about 25 s a run) twice on every interpreter."""
    case = CASE if program == "actors" else TASKS
    env = environment_for(version, case)
    script = CASE.protected_script if program == "actors" else TASKS.script
    runs = 2 if program == "actors" else runs_on(version, TASKS.runs)
    results = run_two_at_a_time(script, runs, tmp_path, python=env.python,
                                timeout=case.timeout, keep_stdout=True, env=BOUNDED)
    if program == "actors":
        line, want = LINE, expected(env.packages["ray"])
    else:
        line, want = TASK_LINE, TASK_ENDS
    assert_ends(
        results, f"{script.name} with a hanging release, bounded, on CPython {version} "
        f"(ray {env.packages['ray']})",
        ends_by(line), want,
        "each worker's end -> (shard readable, ledger released, the object leaked)",
    )

"""dask distributed's nanny workers (``LocalCluster(processes=True)``), each with an adopted
HDF5 shard, ended every way the engine ends them (``tests/real/programs/dask_worker_shards.py``,
docs/scaling.md "dask distributed"): a run ends its worker by ``client.restart()``, by
SIGTERM, by the nanny's memory monitor (its SIGTERM, then SIGKILL at its next look) or by a
crash (``os._exit``), then closes the new one (``with Client(...)``).  After
the run each worker's shard is read back and its own ledger
(``EXITSAFE_LEDGER=ledger-{pid}.json``) is looked at.  (One run for every path in turn,
``DASK_END=restart,sigterm,crash``, saw the nanny closed while it restarted the worker
after the SIGTERM, once in four runs on a machine with a load of 20 on 2 cores: not
understood, so each path has its own runs.)

* unprotected: SIGTERM (the nanny's included) and the crash leave the worker's shard
  unreadable and no ledger (the worker closed last runs exitsafe's teardown: shard
  readable, its ledger records it);
* protected (the recipe: a ``WorkerPlugin`` whose ``setup`` calls
  ``teardown_on_signals("SIGTERM", mode="immediate")``): the worker ended by
  ``client.restart()`` and those sent SIGTERM (from outside, or by the nanny's memory
  monitor) run their teardown, 10 runs of 10 (2 of 2 on the interpreters between the
  oldest and the newest local ones, ``scaling.BETWEEN``).  A crash
  (``os._exit``) runs nothing, with or without it;
* bounded (docs/scaling.md's "bounded" column): each worker also adopts, before its shard,
  an object whose close never returns (``SHARD_HANG=1``).  With
  ``EXITSAFE_TEARDOWN_TIMEOUT=1`` the worker sent SIGTERM and the one closed both close
  their shard, abandon that close at the bound and end, their ledgers recording the shard
  ``released_at_exit`` and the object ``leaked_timeout``, 10 runs of 10.  Without the bound
  the closed worker's teardown never ends: the nanny kills it at its own timeout, the
  shard closed already (it went first) but no ledger written.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional

import pytest

from exitsafe.testing import ExitResult

from .cases import Case
from .conftest import versions
from .scaling import (
    assert_ends,
    per_end_case,
    run_two_at_a_time,
    runs_on,
    shard_environment,
)

#: how each worker ends -> (shard readable, ledger records it released)
UNPROTECTED = {"restart": (True, True), "sigterm": (False, False), "crash": (False, False),
               "memory": (False, False), "close": (True, True)}
PROTECTED = {**UNPROTECTED, "sigterm": (True, True), "memory": (True, True)}
LINE = re.compile(r"^worker ended by (\w+): shard (readable|unreadable), ledger (\w+)$", re.M)


def _case(program: str, end: str, runs: int, *, bound: Optional[str] = None) -> Case:
    """The case of ``program`` ending a worker by ``end``; ``bound``: each worker also adopts
    an object whose close hangs (``SHARD_HANG=1``), and ``EXITSAFE_TEARDOWN_TIMEOUT`` is
    ``bound`` (``""``: not set); the id then ends with ``-hang`` or ``-hang-bounded``."""
    env: tuple[tuple[str, str], ...] = (
        ("DASK_END", end), ("EXITSAFE_LEDGER", "ledger-{pid}.json")
    )
    if bound is not None:
        env += (("SHARD_HANG", "1"),)
        env += (("EXITSAFE_TEARDOWN_TIMEOUT", bound),) if bound else ()
    case = per_end_case(
        program, end, runs,
        package="distributed",
        also_needs=("h5py",),  # (the workers' shards)
        # a run takes 4-8 s on an idle machine (three interpreters start: the client and
        # two workers), a few times that on a loaded one: the bound is for a hang only
        timeout=180.0,
        summary=f"a dask nanny worker ended by {end}, then one by close",
        env=env,
    )
    if bound is None:
        return case
    return dataclasses.replace(case, id=case.id + ("-hang-bounded" if bound else "-hang"))


#: (case, how each worker ends -> (shard readable, ledger released))
CASES = [
    # what dask does: the shard of a worker ended by SIGTERM or a crash is lost
    (_case("dask_worker_shards.py", "sigterm", 2), UNPROTECTED),
    (_case("dask_worker_shards.py", "crash", 2), UNPROTECTED),
    (_case("dask_worker_shards.py", "memory", 2), UNPROTECTED),
    # the recipe: nothing needed for a restart (or close); SIGTERM runs the teardown
    (_case("dask_worker_shards_protected.py", "restart", 10), PROTECTED),
    (_case("dask_worker_shards_protected.py", "sigterm", 10), PROTECTED),
    # the nanny's own SIGTERM (its memory monitor), with its SIGKILL 100 ms later if the
    # worker is still there: the teardown runs in that time
    (_case("dask_worker_shards_protected.py", "memory", 10), PROTECTED),
    # a release that hangs, bounded: both ends (SIGTERM, then close) abandon it at 1 s
    (_case("dask_worker_shards_protected.py", "sigterm", 10, bound="1"), PROTECTED),
    # ... not bounded: the nanny kills the closed worker, its shard closed, no ledger
    (_case("dask_worker_shards_protected.py", "close", 2, bound=""), {"close": (True, False)}),
]


def ended(result: ExitResult) -> dict[str, tuple[bool, bool]]:
    return {how: (shard == "readable", ledger == "released")
            for how, shard, ledger in LINE.findall(result.stdout)}


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(("case", "expected"), CASES, ids=[c.id for c, _ in CASES])
def test_dask_workers_teardown_per_path(
    case: Case, expected: dict, version: str, tmp_path: Path
) -> None:
    env, shard_format = shard_environment(version, case)
    results = run_two_at_a_time(case.script, runs_on(version, case.runs), tmp_path,
                                python=env.python, timeout=case.timeout,
                                env={**dict(case.env or ()), **shard_format})
    want = {how: expected[how] for how in (dict(case.env or ())["DASK_END"], "close")}
    assert_ends(results, f"{case.program} on CPython {version}", ended, want,
                "each worker's end -> (shard readable, ledger released)")
    if dict(case.env or ()).get("EXITSAFE_TEARDOWN_TIMEOUT"):
        for result in results:  # (each of the two workers abandoned the hanging close)
            assert result.stderr.count("'stuck' release still running after") == 2, (
                result.stderr[-3000:]
            )

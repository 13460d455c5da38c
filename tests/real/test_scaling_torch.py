"""torch.distributed (gloo, CPU) workers under ``torchrun``, each with an adopted HDF5
shard, ended every way torch elastic ends them (``tests/real/programs/torch_gloo_shards.py``,
docs/scaling.md "torch.distributed"): a normal end with the process group left to the
interpreter, a SIGTERM to ``torchrun`` (the agent sends SIGTERM to each worker), and a crash
of one worker (``os._exit``; the agent then ends the other with SIGTERM).  After the run
each worker's shard is read back and its own ledger (``EXITSAFE_LEDGER=ledger-{pid}.json``)
is looked at.

* unprotected (the shard adopted, nothing else): a normal end runs exitsafe's teardown;
  a SIGTERM leaves every shard unreadable and no ledger, a crash both shards;
* protected (the recipe: ``teardown_on_signals("SIGTERM", mode="immediate")``, the open and
  the adoption in ``exitsafe.signals.deferred()``, ``destroy_process_group`` as a teardown
  hook after the shard): the worker sent SIGTERM closes its shard, destroys its group and
  writes its ledger, 10 runs of 10, also when worker 0 waits in a receive that never
  completes (native code: its handler runs when worker 1's teardown has destroyed its group
  and the receive fails); the crashed worker runs nothing, with or without it;
* bounded: each worker also adopts, before its shard, an object whose close never returns
  (``SHARD_HANG=1``); with ``EXITSAFE_TEARDOWN_TIMEOUT=1`` the protected worker sent
  SIGTERM closes its shard, destroys its group, abandons the hanging close at the bound,
  and its ledger records the object ``leaked_timeout`` too, 10 runs of 10.

Only where ``.ci/install-real`` could install a CPU build of torch (PyPI's wheels are CUDA
builds of several GB; a CPU one lies on the CI machine's disk for CPython 3.11).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from exitsafe.testing import ExitResult

from .cases import Case
from .conftest import environment_for, versions
from .scaling import assert_ends, per_end_case, run_two_at_a_time

#: rank -> (shard readable, ledger records it released, group destroyed by the teardown)
Ends = dict[int, tuple[bool, bool, bool]]
LINE = re.compile(
    r"^rank (\d) ended by [\w-]+: shard (readable|unreadable), ledger (\w+), group (\w+)$", re.M
)
UNPROTECTED: dict[str, Ends] = {
    "close": {0: (True, True, False), 1: (True, True, False)},
    "sigterm": {0: (False, False, False), 1: (False, False, False)},
    "crash": {0: (False, False, False), 1: (False, False, False)},
}
PROTECTED: dict[str, Ends] = {
    "close": {0: (True, True, True), 1: (True, True, True)},
    "sigterm": {0: (True, True, True), 1: (True, True, True)},
    "crash": {0: (True, True, True), 1: (False, False, False)},
}


def _case(program: str, end: str, runs: int) -> Case:
    return per_end_case(
        program, end, runs,
        package="torch",
        also_needs=("h5py",),  # (the workers' shards)
        # a run takes 10-20 s on an idle machine (torchrun and two workers import torch):
        # the bound is for a hang only
        timeout=300.0,
        summary=f"two gloo workers under torchrun, ended by {end}",
        env=(("TORCH_END", end),),
    )


#: (case, expected ends)
CASES = [
    (_case("torch_gloo_shards.py", "close", 2), UNPROTECTED["close"]),
    (_case("torch_gloo_shards.py", "sigterm", 2), UNPROTECTED["sigterm"]),
    (_case("torch_gloo_shards.py", "crash", 2), UNPROTECTED["crash"]),
    (_case("torch_gloo_shards_protected.py", "close", 10), PROTECTED["close"]),
    (_case("torch_gloo_shards_protected.py", "sigterm", 10), PROTECTED["sigterm"]),
    (_case("torch_gloo_shards_protected.py", "crash", 10), PROTECTED["crash"]),
    # worker 0 waits in a receive (native code) when the SIGTERM comes: its handler runs
    # once worker 1's teardown has destroyed its group, which ends the receive with an error
    (_case("torch_gloo_shards_protected.py", "sigterm-blocked", 10), PROTECTED["sigterm"]),
    # a release that hangs (adopted before the shard), bounded by the teardown's timeout
    (dataclasses.replace(
        _case("torch_gloo_shards_protected.py", "sigterm", 10),
        id="torch-gloo-shards-protected-sigterm-hang-bounded",
        env=(("TORCH_END", "sigterm"), ("SHARD_HANG", "1"), ("EXITSAFE_TEARDOWN_TIMEOUT", "1")),
    ), PROTECTED["sigterm"]),
]


def ended(result: ExitResult) -> Ends:
    return {int(rank): (shard == "readable", ledger == "released", group == "destroyed")
            for rank, shard, ledger, group in LINE.findall(result.stdout)}


@pytest.mark.parametrize("version", versions())
@pytest.mark.parametrize(("case", "expected"), CASES, ids=[c.id for c, _ in CASES])
def test_torch_workers_teardown_per_path(
    case: Case, expected: Ends, version: str, tmp_path: Path
) -> None:
    env = environment_for(version, case)
    results = run_two_at_a_time(case.script, case.runs, tmp_path, python=env.python,
                                timeout=case.timeout, env=dict(case.env or ()))
    assert_ends(results, f"{case.program} on CPython {version}", ended, expected,
                "each rank's end -> (shard readable, ledger released, group destroyed)")

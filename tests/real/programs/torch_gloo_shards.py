"""torch.distributed with the gloo backend (CPU) under ``torchrun``: each of two workers
joins the process group, opens its own HDF5 shard (``shard-<rank>.h5``), adopts it
(``exitsafe.adopt(f, close="close")``), writes rows, and sums a tensor with the other worker
(``all_reduce``).  After the run the launcher reads every shard back; a shard whose file was
never closed reads back as unreadable (HDF5 writes its superblock at close).

    python torch_gloo_shards.py [END]      (or END in the environment: TORCH_END)

How the workers end (``END``):

* ``close`` (default): each worker returns from its work and its process exits normally,
  the process group left to the interpreter (no ``destroy_process_group()``);
* ``sigterm``: the launcher sends SIGTERM to ``torchrun`` (a job scheduler cancelling the
  job, a container stop) while the workers wait between two steps; torch elastic's agent
  sends SIGTERM to each worker, then SIGKILL to those still alive after its grace period;
* ``sigterm-blocked``: the same, worker 0 waiting in a receive from worker 1 that never
  comes (a collective that waits in native code, where a signal's Python handler cannot
  run until it returns);
* ``crash``: worker 1 calls ``os._exit(1)`` after its rows (a crash: nothing runs there);
  the agent then ends worker 0 with SIGTERM (``--max-restarts=0``).

Printed for each worker: ``rank R ended by END: shard readable|unreadable, ledger
released|none, group destroyed|left``, then ``shards N, unreadable M``; exit 1 if a shard
is unreadable.  Each worker writes its own ledger (``EXITSAFE_LEDGER=ledger-{pid}.json``,
set by the launcher) and, when its exit teardown destroyed the process group, a file
saying so.  ``torch_gloo_shards_protected.py`` runs the same with the recipe of
docs/scaling.md.
"""

import glob
import os
import signal
import subprocess
import sys
import time

from shards import adopt_stuck, read_back

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


def worker(end: str, protect=None) -> None:
    """One worker (``torchrun`` sets ``RANK`` and the rendezvous); ``protect(rank)``, if
    given, opens and adopts the shard itself (the recipe) and returns it."""
    import h5py
    import numpy as np
    import torch
    import torch.distributed as dist

    import exitsafe

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(f"pid-{rank}", "w") as file:
        file.write(str(os.getpid()))
    adopt_stuck()
    if protect is not None:
        shard = protect(rank)
    else:
        shard = h5py.File(f"shard-{rank}.h5", "w")
        exitsafe.adopt(shard, close="close", name="shard")
    total = torch.ones(4)
    for i in range(20):
        shard.create_dataset(f"row{i}", data=np.full(1000, i))
        dist.all_reduce(total)
    with open(f"written-{rank}", "w") as file:
        file.write(str(float(total[0])))
    if end == "crash" and rank == 1:
        os._exit(1)
    if end == "sigterm-blocked" and rank == 0:
        dist.recv(torch.zeros(4), src=1)  # never sent: a collective waiting in native code
    if end in ("sigterm", "sigterm-blocked", "crash"):
        deadline = time.monotonic() + 120  # (a bound for a broken run: the agent ends us)
        while time.monotonic() < deadline:  # between two steps: Python code, signals run
            time.sleep(0.01)
        raise SystemExit("the agent never ended this worker")


def launch(script: str, end: str) -> int:
    """Run ``script`` under torchrun with two workers, end them as ``end`` says, and read
    the shards back (in the current directory)."""
    env = dict(os.environ, EXITSAFE_LEDGER="ledger-{pid}.json", TORCH_END=end)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={WORLD}", "--max-restarts=0", script]
    agent = subprocess.Popen(command, env=env)
    if end.startswith("sigterm"):
        deadline = time.monotonic() + 120  # (a bound for a broken run, not a timing)
        while len(glob.glob("written-*")) < WORLD and agent.poll() is None:
            if time.monotonic() > deadline:
                agent.kill()
                raise SystemExit("the workers never wrote their rows")
            time.sleep(0.05)
        agent.send_signal(signal.SIGTERM)
    status = agent.wait(timeout=300)
    print(f"torchrun exit status {status}", flush=True)
    unreadable = 0
    for rank in range(WORLD):
        try:
            with open(f"pid-{rank}") as file:
                pid = file.read()
        except OSError:
            pid = "?"
        ok, read = read_back(f"shard-{rank}.h5", pid)
        unreadable += not ok
        destroyed = os.path.exists(f"destroyed-{pid}")
        print(f"rank {rank} ended by {end}: {read}, "
              f"group {'destroyed' if destroyed else 'left'}", flush=True)
    print(f"shards {WORLD}, unreadable {unreadable}", flush=True)
    return 1 if unreadable else 0


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker(os.environ["TORCH_END"])
    else:
        end = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TORCH_END", "close")
        sys.exit(launch(os.path.abspath(__file__), end))

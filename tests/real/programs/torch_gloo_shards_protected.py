"""PROTECTED: torch_gloo_shards.py with the recipe of docs/scaling.md ("torch.distributed"):
each worker turns SIGTERM (what torch elastic's agent sends its workers when the job is
cancelled or another worker failed) into exitsafe's teardown, defers it while it opens and
adopts its shard, and destroys the process group in the teardown, after the shard:

    teardown_on_signals("SIGTERM", mode="immediate")
    with exitsafe.signals.deferred():
        shard = h5py.File(f"shard-{rank}.h5", "w")
        handle = exitsafe.adopt(shard, close="close")
    exitsafe.on_teardown(dist.destroy_process_group, after=[handle])

A worker sent SIGTERM then closes its shard, destroys its group and writes its ledger
before it dies by SIGTERM, as the agent expects.  ``close`` needs only the adoption (the
process exits normally and exitsafe's exit teardown runs); the hook destroys the group
there too.  A crashed worker (``os._exit``) runs nothing: its shard stays unreadable; the
other one, terminated by the agent, keeps its shard.  Exit 1 if a shard is unreadable.
"""

import os
import sys

from torch_gloo_shards import launch, worker

import exitsafe
from exitsafe.signals import teardown_on_signals


def protect(rank: int):
    import h5py
    import torch.distributed as dist

    def destroy() -> None:
        dist.destroy_process_group()
        with open(f"destroyed-{os.getpid()}", "w"):  # (what the launcher reports)
            pass

    teardown_on_signals("SIGTERM", mode="immediate")
    with exitsafe.signals.deferred():  # a SIGTERM meanwhile: acted on after the adoption
        shard = h5py.File(f"shard-{rank}.h5", "w")
        handle = exitsafe.adopt(shard, close="close", name="shard")
    exitsafe.on_teardown(destroy, after=[handle], name="destroy_process_group")
    return shard


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker(os.environ["TORCH_END"], protect)
    else:
        end = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TORCH_END", "close")
        sys.exit(launch(os.path.abspath(__file__), end))

"""PROTECTED: ray_actor_shards.py with the recipe of docs/scaling.md ("Ray").  Ray runs no
code in an actor it ends by ``ray.kill`` (a force exit: the worker ``_exit``\\ s) or at
``ray.shutdown()`` (the raylet force-exits the job's workers), nor, up to Ray 2.51 (the
newest for CPython 3.9), when the driver drops the last handle.  So the driver first ends
the actor the graceful way, with a ``__ray_terminate__`` task, and waits for it:

    try:
        ray.get(actor.__ray_terminate__.remote())
    except ray.exceptions.RayActorError:
        pass  # (the actor's death is the task's result)
    ray.kill(actor)  # or ray.shutdown(), del actor: the actor is gone already

The worker then exits normally: exitsafe's exit teardown runs there, closing the shard,
and writes the worker's ledger.  Run here for ``RAY_RECIPE`` (default ``scope,kill,
shutdown``): each of those ways gets a second actor, ``HOW+recipe``, next to the actors of
``RAY_END`` (default every way, without the recipe: what Ray does).  ``crash`` is not
covered: nothing runs in a process that crashed.
"""

import sys

import ray
from ray_actor_shards import main


def terminate(actor) -> None:
    """The recipe: end the actor gracefully (its exit teardown runs), and wait for it."""
    try:
        ray.get(actor.__ray_terminate__.remote())
    except ray.exceptions.RayActorError:
        pass


if __name__ == "__main__":
    sys.exit(main(terminate))

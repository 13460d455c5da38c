"""UNPROTECTED: a program computes on a Java thread pool through JPype and adopts the pool
so that exitsafe shuts it down at exit, exitsafe imported first as its quick start says.

``Executors.newFixedThreadPool`` makes non-daemon Java threads that wait for tasks until
the pool is shut down.  JPype registers its JVM shutdown (``_JTerminate``) with ``atexit``
when it is imported, after exitsafe, so it runs first (``atexit`` runs newest first): its
``DestroyJavaVM`` waits for every non-daemon Java thread, and exitsafe's teardown, which
would shut the pool down, never runs.  A hang: killed on timeout with the main thread in
``_JTerminate``, 10 runs of 10 on each of CPython 3.9-3.13 (JPype1 1.7.1, OpenJDK 17).  The
order of imports decides: with jpype imported before exitsafe, exitsafe's teardown runs
first and shuts the pool down; an ``atexit.register(pool.shutdown)`` made after the
import of jpype works too.  ``adopt(..., early=True)`` works whatever the order.
"""

# exitsafe first, as its quick start says: the order of the imports is the case
# isort: off
import exitsafe
import jpype
import jpype.imports
# isort: on

jpype.startJVM()
from java.util.concurrent import Callable, Executors  # noqa: E402


@jpype.JImplements(Callable)
class Checksum:
    """A task run on the pool's Java threads, written in Python."""

    def __init__(self, n: int) -> None:
        self.n = n

    @jpype.JOverride
    def call(self) -> int:
        return sum(range(self.n))


pool = Executors.newFixedThreadPool(4)  # non-daemon threads
exitsafe.adopt(pool, close="shutdown")  # shut down by exitsafe's teardown at exit
futures = [pool.submit(Checksum(10_000 * i)) for i in range(8)]
print("checksums", sum(future.get() for future in futures), flush=True)

"""S3 unprotected: the last reference is dropped on a background thread after the runtime shut down.

A worker thread (daemon, stopped and joined by its pool's ``atexit``
handler) holds a provider catalog, like the WinML ``EpCatalog`` of the
seeds, and drops it when it stops.  The binding, imported after the pool,
shuts the runtime down from its own ``atexit`` handler.  ``atexit`` runs
handlers last-registered-first: the runtime is shut down, then the pool
stops its worker, whose catalog's ``__del__`` calls the runtime:
**SIGABRT**, ``FATAL: runtime used after it was torn down``.
"""

from __future__ import annotations

import atexit
import threading

# --- the application's worker pool (imported first) ------------------------------
_stop = threading.Event()
_ready = threading.Event()


def _stop_workers() -> None:
    _stop.set()
    _worker.join(5.0)


atexit.register(_stop_workers)

# --- the binding ---------------------------------------------------------------------
from exitsafe.lab import shim  # noqa: E402

ffi = shim.ffi
_rt = shim.load_runtime()
atexit.register(_rt.rt_shutdown)  # shut the runtime down at exit


class Catalog:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_catalog_create()

    def names(self) -> list[str]:
        n = self._lib.rt_catalog_count(self._ptr)
        return [ffi.string(self._lib.rt_catalog_name(self._ptr, i)).decode() for i in range(n)]

    def __del__(self) -> None:
        self._lib.rt_catalog_release(self._ptr)


# --- the application ------------------------------------------------------------------
def _work() -> None:
    catalog = Catalog()  # owned by this thread
    print("S3 unprotected: providers", catalog.names(), flush=True)
    _ready.set()
    _stop.wait()
    # returning drops the last reference: Catalog.__del__ -> rt_catalog_release


_worker = threading.Thread(target=_work, name="worker", daemon=True)
_worker.start()
_ready.wait()
print("S3 unprotected: main done, exiting", flush=True)

"""S3 protected: the late release on the worker thread is a recorded no-op.

Changes from ``s3_unprotected.py``: the catalog is a tracked handle, and the
runtime itself is a handle whose release is ``rt_shutdown`` (instead of an
``atexit`` handler), with every catalog depending on it.

exitsafe's teardown (registered when the binding imports exitsafe, so it runs
before the pool's handler) releases the catalog, then shuts the runtime
down, and closes the registry.  When the pool stops its worker, the worker
drops its catalog, whose finalizer asks for a release: a late request, recorded, no
native call.  Exit 0.
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
import exitsafe  # noqa: E402
from exitsafe import cffi as exitsafe_cffi  # noqa: E402
from exitsafe.lab import shim  # noqa: E402

ffi = shim.ffi
_rt = shim.load_runtime()
_runtime = exitsafe.track(_rt, lambda lib: lib.rt_shutdown(), kind="runtime", name="lab runtime")


class Catalog:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_catalog_create(),
            _rt.rt_catalog_release,
            kind="catalog",
            depends_on=[_runtime],
        )

    def names(self) -> list[str]:
        with self.handle.borrow() as ptr:
            n = _rt.rt_catalog_count(ptr)
            return [ffi.string(_rt.rt_catalog_name(ptr, i)).decode() for i in range(n)]

    def __del__(self) -> None:
        # The binding's finalizer stays; it asks exitsafe instead of calling C.
        self.handle.release()


# --- the application ------------------------------------------------------------------
def _work() -> None:
    catalog = Catalog()
    print("S3 protected: providers", catalog.names(), flush=True)
    _ready.set()
    _stop.wait()
    # returning drops the last reference: Catalog.__del__ asks for a release after
    # teardown, a recorded no-op (a late request)


_worker = threading.Thread(target=_work, name="worker", daemon=True)
_worker.start()
_ready.wait()
print("S3 protected: main done, exiting", flush=True)

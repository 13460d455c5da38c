"""S6 unprotected: a forked child exits and releases its parent's native objects.

A pre-fork worker: the parent opens an instance and a provider catalog, then
forks a child that uses them and exits normally.  The child's interpreter
shutdown runs the wrappers' ``__del__``, which release the objects it
inherited, and the runtime's driver-side state is shared with the parent.
When the parent uses its instance again: **SIGABRT**, ``FATAL: instance #1
was destroyed by another process``.
"""

from __future__ import annotations

import os
import sys

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_instance_create()

    def device_count(self) -> int:
        return int(self._lib.rt_instance_device_count(self._ptr))

    def __del__(self) -> None:
        self._lib.rt_instance_release(self._ptr)


class Catalog:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_catalog_create()

    def count(self) -> int:
        return int(self._lib.rt_catalog_count(self._ptr))

    def __del__(self) -> None:
        self._lib.rt_catalog_release(self._ptr)


instance = Instance()
catalog = Catalog()
pid = os.fork()
if pid == 0:
    print(f"S6 unprotected: child sees {catalog.count()} providers, exiting", flush=True)
    sys.exit(0)  # a normal exit: the child's finalizers run
_, status = os.waitpid(pid, 0)
print(f"S6 unprotected: child exited with status {status}", flush=True)
print(f"S6 unprotected: parent has {instance.device_count()} devices", flush=True)

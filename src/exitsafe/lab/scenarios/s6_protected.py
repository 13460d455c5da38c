"""S6 protected: handles inherited by a forked child are never released there.

Changes from ``s6_unprotected.py``: the wrappers own tracked handles instead
of a ``__del__``.  The child's exit teardown finds the two handles were
inherited and leaves them alone (``leaked_inherited`` in the child's
ledger); the parent keeps using them and releases them at its own exit.
Exit 0 in both processes; the parent leaks nothing, and the child's leak
report counts the two objects as inherited, not as its leaks.
"""

from __future__ import annotations

import os
import sys

from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance"
        )

    def device_count(self) -> int:
        with self.handle.borrow() as ptr:
            return int(_rt.rt_instance_device_count(ptr))


class Catalog:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi, _rt.rt_catalog_create(), _rt.rt_catalog_release, kind="catalog"
        )

    def count(self) -> int:
        with self.handle.borrow() as ptr:
            return int(_rt.rt_catalog_count(ptr))


instance = Instance()
catalog = Catalog()
pid = os.fork()
if pid == 0:
    print(f"S6 protected: child sees {catalog.count()} providers, exiting", flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print(f"S6 protected: child exited with status {status}", flush=True)
print(f"S6 protected: parent has {instance.device_count()} devices", flush=True)
if status != 0:
    sys.exit(1)

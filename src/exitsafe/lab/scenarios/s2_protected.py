"""S2 protected: the same cycle, released in dependency order before finalization.

Changes from ``s2_unprotected.py``: each wrapper owns a tracked handle
(``exitsafe.cffi.track``) instead of a ``__del__``; the device's handle
depends on the instance's.  The cycle stays.

At exit exitsafe's teardown runs before the interpreter finalizes anything:
the device is released, then the instance.  When the garbage collector later
collects the cycle the handles are already released: nothing native runs.
"""

from __future__ import annotations

from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance"
        )
        self.devices: list[Device] = []


class Device:
    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        instance.devices.append(self)  # the same cycle
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_device_create(instance.handle.raw),
            _rt.rt_device_release,
            kind="device",
            depends_on=[instance.handle],
        )

    def submit(self) -> int:
        with self.handle.borrow() as ptr:
            return int(_rt.rt_device_submit(ptr))


instance = Instance()
device = Device(instance)
device.submit()
print("S2 protected: work done, exiting", flush=True)

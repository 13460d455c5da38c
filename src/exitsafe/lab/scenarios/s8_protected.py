"""S8 protected: releasing a parent is deferred until its children are gone; strict mode names them.

Changes from ``s8_unprotected.py``: ``close()`` releases a tracked handle;
the device's handle depends on the instance's.  ``instance.close()`` drops
the instance's owner but its native release waits for the device;
``device.close()`` releases the device, then the instance.

The second half uses a strict registry (``exitsafe.Registry(strict=True)``),
where the same wrong-order ``close()`` raises ``LiveDependentsError`` naming
the device, and the program closes them in the right order.  Exit 0, no
leaks.
"""

from __future__ import annotations

from typing import Optional

import exitsafe
from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self, registry: Optional[exitsafe.Registry] = None) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_instance_create(),
            _rt.rt_instance_release,
            kind="instance",
            registry=registry,
        )

    def close(self) -> None:
        self.handle.release()


class Device:
    def __init__(self, instance: Instance, registry: Optional[exitsafe.Registry] = None) -> None:
        with instance.handle.borrow() as parent:
            ptr = _rt.rt_device_create(parent)
        self.handle = exitsafe_cffi.track(
            ffi,
            ptr,
            _rt.rt_device_release,
            kind="device",
            name="gpu0",
            depends_on=[instance.handle],
            registry=registry,
        )

    def submit(self) -> int:
        with self.handle.borrow() as ptr:
            return int(_rt.rt_device_submit(ptr))

    def close(self) -> None:
        self.handle.release()


instance = Instance()
device = Device(instance)
device.submit()
instance.close()  # wrong order: deferred until the device is released
print(f"S8 protected: instance closed (state: {instance.handle.state})", flush=True)
device.close()
print(
    f"S8 protected: device closed (instance: {instance.handle.state},"
    f" device: {device.handle.state})",
    flush=True,
)

strict = exitsafe.Registry(name="s8-strict", strict=True)
instance2 = Instance(strict)
device2 = Device(instance2, strict)
try:
    instance2.close()
except exitsafe.LiveDependentsError as exc:
    print(f"S8 protected: strict mode refused: {exc}", flush=True)
else:
    raise SystemExit("S8 protected: strict mode did not refuse the wrong order")
device2.close()
instance2.close()
print("S8 protected: closed in the right order, exiting", flush=True)

"""S7 protected: a per-step timeout leaks the blocked release, logs it, and the process exits.

Changes from ``s7_unprotected.py``: the instance and the device are tracked
handles and the device's release gets ``timeout=1.0``.  At exit the release
runs on a teardown worker thread; after one second exitsafe abandons it
(``leaked_timeout``, logged), leaks the instance it depends on
(``leaked_dependent``: releasing it could pull state from under the blocked
release), and the process exits.  Exit 0; the leak report shows the device
and the instance, deliberately.
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


class Device:
    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_device_create(instance.handle.raw),
            _rt.rt_device_release,
            kind="device",
            depends_on=[instance.handle],
            timeout=1.0,  # a device release that takes longer is abandoned and leaked
        )


instance = Instance()
device = Device(instance)
with device.handle.borrow() as ptr:
    _rt.rt_device_lose(ptr)  # the driver stops answering
print("S7 protected: device lost, exiting", flush=True)

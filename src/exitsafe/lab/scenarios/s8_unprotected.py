"""S8 unprotected: the instance is closed explicitly while its device is alive.

The application closes what it opened, in the order it thinks of: the
instance first, then the device.  The runtime lets the instance go (the
device becomes an orphan) and aborts when the orphan is released:
**SIGABRT**, ``FATAL: device released after its parent instance was
released``.
"""

from __future__ import annotations

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self._ptr = _rt.rt_instance_create()

    def close(self) -> None:
        if self._ptr is not None:
            _rt.rt_instance_release(self._ptr)
            self._ptr = None


class Device:
    def __init__(self, instance: Instance) -> None:
        self._ptr = _rt.rt_device_create(instance._ptr)

    def submit(self) -> int:
        return int(_rt.rt_device_submit(self._ptr))

    def close(self) -> None:
        if self._ptr is not None:
            _rt.rt_device_release(self._ptr)
            self._ptr = None


instance = Instance()
device = Device(instance)
device.submit()
instance.close()  # wrong order: the device is still alive
print("S8 unprotected: instance closed", flush=True)
device.close()
print("S8 unprotected: device closed, exiting", flush=True)

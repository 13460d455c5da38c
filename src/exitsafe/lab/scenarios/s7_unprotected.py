"""S7 unprotected: releasing a lost device blocks forever at exit.

The device was lost (a GPU reset, a driver that stopped answering).  The
program is done and exits; during interpreter shutdown ``Device.__del__``
releases the device, and the release never returns: the process **hangs**
until somebody kills it.
"""

from __future__ import annotations

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class Instance:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_instance_create()


class Device:
    def __init__(self, instance: Instance) -> None:
        self._lib = _rt
        self.instance = instance
        self._ptr = _rt.rt_device_create(instance._ptr)

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)  # blocks forever on a lost device


instance = Instance()
device = Device(instance)
_rt.rt_device_lose(device._ptr)  # the driver stops answering
print("S7 unprotected: device lost, exiting", flush=True)

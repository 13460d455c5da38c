"""S10 unprotected: a leak-checker run; the binding leaks everything at exit.

To avoid crashing at exit, the binding's ``__del__`` does nothing while the
interpreter is finalizing (a common defensive pattern).  The program ends
with its instance, device and buffer in globals, so none is released: the
runtime's leak report lists them and the leak checker fails the run
(``EXITSAFE_LAB_LEAK_EXITCODE=23``: **exit status 23**).
"""

from __future__ import annotations

import sys

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()


class _Native:
    _release_name = ""

    def __init__(self, ptr: object) -> None:
        self._lib = _rt
        self._ptr = ptr

    def __del__(self) -> None:
        if sys.is_finalizing():
            return  # releasing at exit can crash: leak instead
        getattr(self._lib, self._release_name)(self._ptr)


class Instance(_Native):
    _release_name = "rt_instance_release"

    def __init__(self) -> None:
        super().__init__(_rt.rt_instance_create())


class Device(_Native):
    _release_name = "rt_device_release"

    def __init__(self, instance: Instance) -> None:
        super().__init__(_rt.rt_device_create(instance._ptr))
        self.instance = instance


class Buffer(_Native):
    _release_name = "rt_buffer_release"

    def __init__(self, device: Device, size: int) -> None:
        super().__init__(_rt.rt_buffer_create(device._ptr, size))
        self.device = device


instance = Instance()
device = Device(instance)
buffer = Buffer(device, 256)
print("S10 unprotected: work done, exiting", flush=True)

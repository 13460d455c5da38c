"""S1 unprotected: the compiler library is unloaded before a device whose release calls it.

A binding written the usual way: module-level library objects, wrapper
classes that release their native object in ``__del__``, and a process-wide
default instance kept as a raw pointer.  The runtime borrows the compiler
the binding loaded (``rt_init``); every device release calls into it.

The binding unloads its compiler plugin in an ``atexit`` handler (as DLLs go
at process exit on Windows, in an order nobody controls).  The device is
finalized later, during interpreter shutdown: ``Device.__del__`` releases it,
the runtime calls the compiler, whose code is no longer mapped: **SIGSEGV**.
"""

from __future__ import annotations

import atexit

from exitsafe.lab import shim

ffi = shim.ffi
_compiler = shim.load_compiler()  # the plugin the runtime calls while releasing devices
_rt = shim.load_runtime()
_rt.rt_init(str(shim.compiler_path()).encode())
atexit.register(ffi.dlclose, _compiler)  # unload the plugin at exit
_default_instance = _rt.rt_instance_create()  # process-wide, never released


class Device:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_device_create(_default_instance)

    def submit(self) -> int:
        return int(self._lib.rt_device_submit(self._ptr))

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)  # calls into the compiler


device = Device()
device.submit()
print("S1 unprotected: work done, exiting", flush=True)

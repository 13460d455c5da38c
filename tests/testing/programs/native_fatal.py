"""A native library aborts on its own check at exit: the shape of libzmq's ``Assertion
failed`` or Qt's ``QThread: Destroyed while thread is still running``.

The binding shuts its runtime down in an ``atexit`` handler; a device released later, in
``__del__`` during finalization, makes the lab runtime print ``FATAL: ...`` and abort.
"""

import atexit

from exitsafe.lab import shim

rt = shim.load_runtime()
rt.rt_init(shim.ffi.NULL)
instance = rt.rt_instance_create()
atexit.register(rt.rt_shutdown)


class Device:
    def __init__(self) -> None:
        self._lib = rt
        self._ptr = rt.rt_device_create(instance)

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)


device = Device()
print("ready", flush=True)

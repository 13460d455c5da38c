"""S11 unprotected: a thread is inside a native call when the interpreter finalizes.

An inference worker runs ``rt_device_run`` in a loop on a daemon thread (a
long native call that releases the GIL, like ``session.run()``).  The main
thread finishes; the binding's exit cleanup (an ``atexit`` handler, as many
bindings have) releases the device while the worker is still inside
``rt_device_run`` on it: the runtime **aborts** (``FATAL: device #.. released
while rt_device_run is running on it``), which is how a real runtime's
use-after-free ends when it checks.  Without that cleanup, on CPython 3.9 to
3.13 the worker would be ended by ``pthread_exit`` on its way back into
Python during finalization, which aborts C++ runtimes ("terminate called
without an active exception"), and on 3.14+ it hangs there.
"""

from __future__ import annotations

import atexit
import threading
import time

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

    def run(self, ms: int) -> None:
        self._lib.rt_device_run(self._ptr, ms)

    def close(self) -> None:
        self._lib.rt_device_release(self._ptr)


instance = Instance()
device = Device(instance)
atexit.register(device.close)  # the binding's exit cleanup


def infer() -> None:
    while True:
        device.run(200)  # 200 ms of native work per request


threading.Thread(target=infer, name="inference", daemon=True).start()
while not _rt.rt_device_running(device._ptr):  # the worker is inside its native call
    time.sleep(0.001)
print("S11 unprotected: main done, exiting while the worker is in a native call", flush=True)

"""S11 protected: the teardown waits for the native call in flight, then the worker parks.

Changes from ``s11_unprotected.py``: the instance and device are tracked handles,
and the worker calls ``rt_device_run`` through ``exitsafe.cffi.call``, which
borrows the device for the duration of each call.  At exit the teardown reaches
the device, waits (bounded) for the call in flight to return, and from then on a
call on the worker thread does not enter native code: the (daemon) worker is
parked until the process ends.  The device is released after the last run
returned, then the instance.  Exit 0, no leaks.
"""

from __future__ import annotations

import threading
import time

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
        )

    def run(self, ms: int) -> None:
        # The device is borrowed for the call: never released under it.
        exitsafe_cffi.call(_rt.rt_device_run, self.handle, ms)


instance = Instance()
device = Device(instance)


def infer() -> None:
    while True:
        device.run(200)


threading.Thread(target=infer, name="inference", daemon=True).start()
while not _rt.rt_device_running(device.handle.raw):  # the worker is inside its native call
    time.sleep(0.001)
print("S11 protected: main done, exiting while the worker is in a native call", flush=True)

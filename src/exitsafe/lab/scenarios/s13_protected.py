"""S13 protected: a worker with a wake action ends the blocked call before the exit.

Changes from ``s13_unprotected.py``: the instance and device are tracked handles
(as in S11), and the pump thread is declared with one line,
``exitsafe.worker(thread, wake=..., uses=[device.handle])``.  When the main
thread finishes, in the early phase (before the interpreter joins its
non-daemon threads), exitsafe runs the wake action: ``rt_device_wake`` ends
the wait, ``rt_device_wait`` returns 1 and the pump's loop ends.  The thread is
joined, then the device is released (never while the thread waits on it), then
the instance.  Exit 0, no leaks.
"""

from __future__ import annotations

import threading
import time

import exitsafe
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


instance = Instance()
device = Device(instance)
raw = device.handle.raw


def pump() -> None:
    while _rt.rt_device_wait(raw) == 0:  # blocks until the device has an event
        pass  # (handle the event)


thread = threading.Thread(target=pump, name="events")
thread.start()
# At exit: wake the pump, wait for it to end, and only then release the device.
exitsafe.worker(thread, wake=lambda: _rt.rt_device_wake(raw), uses=[device.handle])
while not _rt.rt_device_waiting(raw):  # the pump is blocked in its native call
    time.sleep(0.001)
print("S13 protected: main done, exiting while the pump is blocked in rt_device_wait",
      flush=True)

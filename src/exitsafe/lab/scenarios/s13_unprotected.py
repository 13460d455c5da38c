"""S13 unprotected: a thread is blocked in a native call that only a wake ends.

An event pump runs ``rt_device_wait`` in a loop on a (non-daemon) thread: a
native call that blocks, with the GIL released, until the runtime has an event
for the device (like a device's event queue, a ``recv()`` with no timeout, a
driver's ``wait_for_event``).  Nothing in the program ever wakes it: only
``rt_device_wake`` ends the wait.  The main thread finishes; the interpreter
joins its non-daemon threads before any ``atexit`` callback, and the pump never
returns: the process **hangs** for ever.  (Made a daemon thread, the pump would
still be blocked inside the runtime while the device is released: S11's abort,
``FATAL: device #.. released while rt_device_wait is blocked on it``.)
"""

from __future__ import annotations

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


instance = Instance()
device = Device(instance)
raw = device._ptr


def pump() -> None:
    while _rt.rt_device_wait(raw) == 0:  # blocks until the device has an event
        pass  # (handle the event)


thread = threading.Thread(target=pump, name="events")
thread.start()
while not _rt.rt_device_waiting(raw):  # the pump is blocked in its native call
    time.sleep(0.001)
print("S13 unprotected: main done, exiting while the pump is blocked in rt_device_wait",
      flush=True)

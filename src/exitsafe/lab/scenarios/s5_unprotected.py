"""S5 unprotected: a device created on a worker thread dies with the thread; another worker uses it.

The binding gives each thread its own device (``threading.local``) and keeps
a process-wide cache of raw device pointers so other threads can find a
device by name.  Worker A creates ``gpu0`` and ends: its thread-local
storage is cleared and ``Device.__del__`` releases the device.  Worker B
takes ``gpu0`` from the cache and allocates a buffer on it: **SIGABRT**,
``FATAL: device used after release``.
"""

from __future__ import annotations

import threading
from typing import Any

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_instance = _rt.rt_instance_create()  # process-wide
_tls = threading.local()
_devices_by_name: dict[str, Any] = {}  # name -> raw rt_device *


class Device:
    def __init__(self) -> None:
        self._lib = _rt
        self._ptr = _rt.rt_device_create(_instance)

    def __del__(self) -> None:
        self._lib.rt_device_release(self._ptr)


def thread_device(name: str) -> Any:
    """This thread's device, published under ``name`` for the other threads."""
    device = getattr(_tls, "device", None)
    if device is None:
        device = _tls.device = Device()
        _devices_by_name[name] = device._ptr
    return device._ptr


def worker_a() -> None:
    _rt.rt_device_submit(thread_device("gpu0"))


def worker_b() -> None:
    device = _devices_by_name["gpu0"]
    buffer = _rt.rt_buffer_create(device, 64)  # the device died with worker A
    _rt.rt_buffer_release(buffer)


a = threading.Thread(target=worker_a)
a.start()
a.join()
print("S5 unprotected: worker A ended", flush=True)
b = threading.Thread(target=worker_b)
b.start()
b.join()
print("S5 unprotected: worker B done, exiting", flush=True)

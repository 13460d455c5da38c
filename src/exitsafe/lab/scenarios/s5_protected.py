"""S5 protected: handles created on a worker outlive their thread; they are leaked at exit.

Changes from ``s5_unprotected.py``: devices and buffers are tracked handles
(the device depends on the instance, the buffer on the device) and the cache
holds the device *wrapper* rather than a raw pointer, so the device lives as
long as anyone references it, whichever thread created it.  Devices use the
ready-made policy ``exitsafe.policies.leak_if_foreign_thread``: at exit a
device created on a worker thread is leaked rather than released (the
runtime's per-thread state may be gone), and the instance it depends on is
leaked with it.  ``EXITSAFE_AT_EXIT=release`` releases everything instead.
"""

from __future__ import annotations

import threading

from exitsafe import Handle, policies
from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_instance = exitsafe_cffi.track(
    ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance"
)
_tls = threading.local()
_devices_by_name: dict[str, Device] = {}  # name -> device wrapper (owns a reference)


class Device:
    def __init__(self) -> None:
        self.handle = exitsafe_cffi.track(
            ffi,
            _rt.rt_device_create(_instance.raw),
            _rt.rt_device_release,
            kind="device",
            depends_on=[_instance],
            exit_policy=policies.leak_if_foreign_thread,
        )


def thread_device(name: str) -> Device:
    """This thread's device, published under ``name`` for the other threads."""
    device = getattr(_tls, "device", None)
    if device is None:
        device = _tls.device = Device()
        _devices_by_name[name] = device
    return device


def worker_a() -> None:
    with thread_device("gpu0").handle.borrow() as ptr:
        _rt.rt_device_submit(ptr)


_buffers: list[Handle] = []


def worker_b() -> None:
    device = _devices_by_name["gpu0"]
    with device.handle.borrow() as ptr:
        buffer = exitsafe_cffi.track(
            ffi,
            _rt.rt_buffer_create(ptr, 64),
            _rt.rt_buffer_release,
            kind="buffer",
            depends_on=[device.handle],
            exit_policy=policies.leak_if_foreign_thread,
        )
    _buffers.append(buffer)  # kept for later use by the application


a = threading.Thread(target=worker_a)
a.start()
a.join()
print("S5 protected: worker A ended", flush=True)
b = threading.Thread(target=worker_b)
b.start()
b.join()
print("S5 protected: worker B done, exiting", flush=True)

"""S9 protected: use after release is a Python exception; a second release is a no-op.

Changes from ``s9_unprotected.py``: the buffer (and the instance and device)
are tracked handles; ``write`` borrows the handle, which raises
``exitsafe.HandleClosedError`` once the buffer is released, and ``close()``
is ``handle.release()``, which does nothing the second time.  The worker
reports the error; both threads close the buffer; exit 0, no leaks.
"""

from __future__ import annotations

import threading

import exitsafe
from exitsafe import cffi as exitsafe_cffi
from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_instance = exitsafe_cffi.track(
    ffi, _rt.rt_instance_create(), _rt.rt_instance_release, kind="instance"
)
_device = exitsafe_cffi.track(
    ffi,
    _rt.rt_device_create(_instance.raw),
    _rt.rt_device_release,
    kind="device",
    depends_on=[_instance],
)


class Buffer:
    def __init__(self, size: int) -> None:
        with _device.borrow() as device:
            ptr = _rt.rt_buffer_create(device, size)
        self.handle = exitsafe_cffi.track(
            ffi, ptr, _rt.rt_buffer_release, kind="buffer", depends_on=[_device]
        )

    def write(self, data: bytes) -> None:
        with self.handle.borrow() as ptr:
            _rt.rt_buffer_write(ptr, 0, data, len(data))

    def close(self) -> None:
        self.handle.release()


errors: list[str] = []


def upload(buffer: Buffer, data: bytes) -> None:
    try:
        buffer.write(data)
    except exitsafe.HandleClosedError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    buffer.close()  # a second release, from another thread: a no-op


buffer = Buffer(64)
buffer.write(b"first upload")
buffer.close()
uploader = threading.Thread(target=upload, args=(buffer, b"late upload"))
uploader.start()
uploader.join()
buffer.close()  # and a third
print(f"S9 protected: the late upload raised {errors[0]}", flush=True)
print(f"S9 protected: buffer state {buffer.handle.state}, exiting", flush=True)

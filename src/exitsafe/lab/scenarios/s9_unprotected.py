"""S9 unprotected: a buffer is used after it was released, from another thread.

The main thread closes a buffer while an upload worker still holds the
wrapper; the worker writes to it: **SIGABRT**, ``FATAL: buffer used after
release`` (in a runtime without checks: a use after free).  Had it got that
far, ``__del__`` would have released the buffer a second time.
"""

from __future__ import annotations

import threading

from exitsafe.lab import shim

ffi = shim.ffi
_rt = shim.load_runtime()
_instance = _rt.rt_instance_create()
_device = _rt.rt_device_create(_instance)


class Buffer:
    def __init__(self, size: int) -> None:
        self._ptr = _rt.rt_buffer_create(_device, size)

    def write(self, data: bytes) -> None:
        _rt.rt_buffer_write(self._ptr, 0, data, len(data))

    def close(self) -> None:
        _rt.rt_buffer_release(self._ptr)

    def __del__(self) -> None:
        self.close()


buffer = Buffer(64)
buffer.write(b"first upload")
buffer.close()  # the main thread is done with it...
uploader = threading.Thread(target=buffer.write, args=(b"late upload",))
uploader.start()  # ...but the upload worker is not
uploader.join()
print("S9 unprotected: exiting", flush=True)

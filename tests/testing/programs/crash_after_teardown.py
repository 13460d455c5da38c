"""A third-party object exitsafe was not told about crashes in its ``__del__`` after the
teardown finished."""

import ctypes
import os

import exitsafe


class Codec:
    def __init__(self) -> None:
        self._handle = ctypes.c_void_p(16)

    def __del__(self, write=os.write, string_at=ctypes.string_at) -> None:
        write(2, b"codec: releasing after its runtime\n")
        string_at(self._handle.value)  # native code on freed memory


runtime = exitsafe.track(1, lambda raw: None, kind="runtime", name="runtime")
codec = Codec()
print("encoded", flush=True)

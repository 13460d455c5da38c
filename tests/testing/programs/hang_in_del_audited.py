"""A Python ``__del__`` stuck in a native wait while the interpreter finalizes: the shape of
wgpu's read-back in ``__del__`` (a buffer mapped for reading waits for a queue that the exit
tore down).  Run audited, the report names the class and where the object was made, and
says its release was running when the process was killed.
"""

import ctypes
import os


class Readback:
    def __init__(self) -> None:
        self._mapped = ctypes.create_string_buffer(4096)  # the mapped buffer (native memory)
        self._done, self._signal = os.pipe()  # the queue's completion, never signalled
        self._read = os.read  # (bound now: module globals may be gone at finalization)

    def __del__(self) -> None:
        self._read(self._done, 1)  # a native wait (C code), as wgpu's map_read


readback = Readback()
print("reading back at exit", flush=True)

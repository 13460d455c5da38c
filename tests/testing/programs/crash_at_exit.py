"""A binding without exitsafe: its ``__del__`` calls native code that crashes at exit."""

import ctypes


class Device:
    def __del__(self) -> None:
        ctypes.string_at(0)


device = Device()
print("done", flush=True)

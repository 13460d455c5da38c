"""A toy binding with the classic exit crash: the binding shuts its native runtime
down in an atexit hook, and a Device kept in a global releases itself in __del__,
which runs after the atexit hooks, when the runtime's memory is gone. ctypes.string_at
on the dead runtime's address stands in for the native release function: it really
dereferences the address, so the crash is a real segmentation fault."""

import atexit
import ctypes


class Runtime:
    """A toy native runtime: a block of native memory that devices use."""

    def __init__(self):
        self._memory = ctypes.create_string_buffer(64)
        self.address = ctypes.addressof(self._memory)

    def device_release(self):
        ctypes.string_at(self.address)  # native code reading the runtime's state

    def shutdown(self):
        self.address = 0  # the runtime's memory is gone


class Device:
    def __init__(self, runtime):
        self.runtime = runtime

    def __del__(self):
        self.runtime.device_release()


runtime = Runtime()
atexit.register(runtime.shutdown)  # the binding's own cleanup, at exit
device = Device(runtime)
print("work done")

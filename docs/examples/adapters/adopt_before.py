"""Third-party objects, before: another library's classes (you cannot change them)
close their native object in close() or __del__, and the session keeps only its
environment's pointer. Left in globals, the environment is finalized first."""

from exitsafe.lab import shim


# --- another library's code ---------------------------------------------------------
class Environment:
    def __init__(self, lib):
        self._lib, self._ptr, self.open = lib, lib.rt_instance_create(), True

    def close(self):
        if self.open:
            self._lib.rt_instance_release(self._ptr)
            self.open = False

    __del__ = close


class Session:
    def __init__(self, env):
        self._lib, self.open = env._lib, True
        self._ptr = env._lib.rt_device_create(env._ptr)

    def close(self):
        if self.open:
            self._lib.rt_device_release(self._ptr)
            self.open = False

    __del__ = close
# ------------------------------------------------------------------------------------

env = Environment(shim.load_runtime())
session = Session(env)
print("work done")

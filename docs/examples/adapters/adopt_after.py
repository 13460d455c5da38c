"""Third-party objects, after: adopt() hands them to exitsafe, the session depending
on its environment. At teardown exitsafe calls session.close(), then env.close();
their own __del__ finds them closed later and does nothing."""

from exitsafe import adopt
from exitsafe.lab import shim


# --- another library's code (unchanged) ---------------------------------------------
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
adopt(env, kind="environment")
adopt(session, kind="session", depends_on=[env])   # adopted objects work in depends_on
print("work done")

"""Third-party object with a __del__, after: neutralize_at_exit() names the
attribute holding the native object. exitsafe's teardown sets it to None, so the late
__del__ finds the model closed and frees nothing: the instance is leaked on purpose (the
leak report counts it) and the OS reclaims it. The class is not changed."""

import atexit

import exitsafe
from exitsafe.lab import shim


# --- another library's code (you cannot change it) ---------------------------------
lib = shim.load_runtime()
atexit.register(lib.rt_shutdown)  # the library tears its runtime down at exit


class Model:
    def __init__(self):
        self._instance = lib.rt_instance_create()
        self.on_progress = None

    def predict(self):
        return lib.rt_instance_device_count(self._instance)

    def close(self):
        if self._instance is not None:
            lib.rt_instance_release(self._instance)
            self._instance = None

    __del__ = close
# ------------------------------------------------------------------------------------


class App:
    def __init__(self):
        self.model = Model()
        self.model.on_progress = self.report  # a cycle: app -> model -> app
        exitsafe.lowlevel.neutralize_at_exit(self.model, "_instance")

    def report(self, fraction):
        pass


app = App()
app.model.predict()
print("work done")

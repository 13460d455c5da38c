"""Third-party object with a __del__, before: another library's model class frees its
native object in __del__, and the library shuts its runtime down in an atexit handler.
The program's model sits in a reference cycle (a callback that refers back to it), so it
is collected only by the interpreter's last garbage collection: after the shutdown."""

import atexit

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

    def report(self, fraction):
        pass


app = App()
app.model.predict()
print("work done")

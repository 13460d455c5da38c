"""Third-party objects, before: a catalog class from another library releases its
native handle in __del__, and that release crashes once the driver was shut down at
exit (the WinML EpCatalog bug). Here the driver's own atexit shutdown stands for
that."""

import atexit

from exitsafe.lab import shim

lib = shim.load_runtime()
atexit.register(lib.rt_shutdown)   # the driver tears itself down at exit


# --- another library's code ---------------------------------------------------------
class EpCatalog:                   # shaped like windowsml.EpCatalog
    def __init__(self):
        self._handle = lib.rt_catalog_create()

    def find_all_providers(self):
        count = lib.rt_catalog_count(self._handle)
        return [shim.ffi.string(lib.rt_catalog_name(self._handle, i)).decode()
                for i in range(count)]

    def __del__(self):
        if self._handle:
            lib.rt_catalog_release(self._handle)
# ------------------------------------------------------------------------------------

catalog = EpCatalog()
print(catalog.find_all_providers())

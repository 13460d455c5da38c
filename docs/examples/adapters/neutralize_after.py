"""Third-party objects, after: neutralize_at_exit() sets the catalog's handle
attribute to None at teardown, so its __del__ does nothing during the interpreter's
shutdown: the catalog is leaked on purpose, and the OS reclaims it."""

import atexit

from exitsafe.lab import shim
from exitsafe.lowlevel import neutralize_at_exit

lib = shim.load_runtime()
atexit.register(lib.rt_shutdown)   # the driver tears itself down at exit


# --- another library's code (unchanged) ---------------------------------------------
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
neutralize_at_exit(catalog, "_handle")   # usable until exit; its __del__ a no-op after
print(catalog.find_all_providers())

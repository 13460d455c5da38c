"""The cffi ABI-mode shim over the lab libraries.

``ffi`` carries the declarations of both libraries (`CDEF`, kept in
sync with ``native/exitsafe_lab.h``).  `load_runtime` and
`load_compiler` build the libraries if needed (`exitsafe.lab.build`)
and ``ffi.dlopen`` them, so the caller holds the library objects and decides
when ``ffi.dlclose`` runs: that is what the scenarios play with.

Typical binding-style use::

    from exitsafe.lab import shim

    compiler = shim.load_compiler()          # the host's reference to the compiler
    rt = shim.load_runtime()
    rt.rt_init(shim.compiler_path().encode())  # the runtime borrows the compiler
    instance = rt.rt_instance_create()

This module imports cffi; nothing in ``exitsafe`` itself imports it (the lab is
imported only on demand).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import cffi  # type: ignore[import-untyped]

from .build import LabLibraries, build

__all__ = [
    "CDEF",
    "KIND_NAMES",
    "compiler_path",
    "ffi",
    "libraries",
    "load_compiler",
    "load_runtime",
    "runtime_path",
]

#: The C declarations of both libraries (see native/README.md for semantics).
CDEF = """
typedef struct rt_instance rt_instance;
typedef struct rt_device rt_device;
typedef struct rt_buffer rt_buffer;
typedef struct rt_catalog rt_catalog;

#define RT_KIND_INSTANCE 0
#define RT_KIND_DEVICE 1
#define RT_KIND_BUFFER 2
#define RT_KIND_CATALOG 3

#define RT_OK 0
#define RT_ERR_STATE -1
#define RT_ERR_COMPILER_NOT_LOADED -2
#define RT_ERR_COMPILER_SYMBOLS -3
#define RT_ERR_RANGE -4

#define RT_LIVE 0
#define RT_TORN_DOWN_SHUTDOWN 1
#define RT_TORN_DOWN_UNLOAD 2

typedef void (*rt_log_fn)(int level, const char *message);

const char *rt_version(void);
int rt_init(const char *compiler_path);
int rt_shutdown(void);

rt_instance *rt_instance_create(void);
int rt_instance_release(rt_instance *instance);
int rt_instance_device_count(rt_instance *instance);

rt_device *rt_device_create(rt_instance *instance);
int rt_device_release(rt_device *device);
int rt_device_submit(rt_device *device);
int rt_device_lose(rt_device *device);
int rt_device_program(rt_device *device);
int rt_device_run(rt_device *device, unsigned int ms);
int rt_device_running(rt_device *device);
int rt_device_wait(rt_device *device);
int rt_device_wake(rt_device *device);
int rt_device_waiting(rt_device *device);

rt_buffer *rt_buffer_create(rt_device *device, size_t size);
int rt_buffer_release(rt_buffer *buffer);
size_t rt_buffer_size(rt_buffer *buffer);
int rt_buffer_write(rt_buffer *buffer, size_t offset, const void *data, size_t size);
int rt_buffer_read(rt_buffer *buffer, size_t offset, void *out, size_t size);

rt_catalog *rt_catalog_create(void);
int rt_catalog_release(rt_catalog *catalog);
int rt_catalog_count(rt_catalog *catalog);
const char *rt_catalog_name(rt_catalog *catalog, int index);

int rt_filter(unsigned int ms);
int rt_filters_running(void);

int rt_logger_register(rt_log_fn fn, unsigned int interval_us);
int rt_logger_unregister(void);

int rt_live(int kind);
int rt_inherited(void);
int rt_torn_down(void);
unsigned long long rt_logger_calls(void);
int rt_leak_report(char *out, size_t size);

const char *cc_version(void);
int cc_program_create(unsigned long long device_id);
int cc_program_release(int program);
int cc_live_programs(void);
"""

#: Kind index -> name, as in the leak report.
KIND_NAMES = ("instance", "device", "buffer", "catalog")

#: The FFI object shared by the shim and the scenarios (``ffi.gc``, ``ffi.callback``...).
ffi: Any = cffi.FFI()
ffi.cdef(CDEF)

_libraries: Optional[LabLibraries] = None


def libraries() -> LabLibraries:
    """The built libraries (built on the first call in this process, then remembered)."""
    global _libraries
    if _libraries is None:
        _libraries = build()
    return _libraries


def runtime_path() -> Path:
    """Path of ``libexitsafe_lab_runtime.so`` (built if needed)."""
    return libraries().runtime


def compiler_path() -> Path:
    """Path of ``libexitsafe_lab_compiler.so`` (built if needed)."""
    return libraries().compiler


def load_runtime(path: Optional[str] = None) -> Any:
    """``ffi.dlopen`` the runtime (``path`` or the built one); the caller owns the result.

    Every ``ffi.dlopen`` of the same path adds a reference to the same loaded
    copy; it is unloaded (and its destructor runs) when the last one is
    ``ffi.dlclose``\\ d, or at process exit.
    """
    return ffi.dlopen(path if path is not None else str(runtime_path()))


def load_compiler(path: Optional[str] = None) -> Any:
    """``ffi.dlopen`` the compiler (``path`` or the built one); the caller owns the result.

    The runtime never holds a reference of its own (``rt_init`` borrows the
    copy loaded here), so ``ffi.dlclose`` of the last such object unmaps the
    compiler's code.
    """
    return ffi.dlopen(path if path is not None else str(compiler_path()))

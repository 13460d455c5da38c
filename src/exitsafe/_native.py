"""The platform's loader, seen through ctypes: which library an address lives in, extra
loader references that keep a library mapped, and closing them.

Used by both FFI adapters (`exitsafe._adapter`); imported only when an adapter is.
Each function returns ``None`` where the platform offers no way.
"""

from __future__ import annotations

import _ctypes
import ctypes as _c
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

WINDOWS = sys.platform == "win32"


class _DlInfo(_c.Structure):
    _fields_ = (
        ("dli_fname", _c.c_char_p),
        ("dli_fbase", _c.c_void_p),
        ("dli_sname", _c.c_char_p),
        ("dli_saddr", _c.c_void_p),
    )


_dl_funcs: dict[str, Any] = {}


def _dl() -> dict[str, Any]:
    """The loader functions this platform offers (``dladdr``, ``dlinfo``, Windows APIs)."""
    if _dl_funcs:
        return _dl_funcs
    funcs: dict[str, Any] = {"loaded": True}
    if WINDOWS:  # pragma: no cover - exercised on Windows only
        kernel32 = _c.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        get = kernel32.GetModuleHandleExW
        get.argtypes = (_c.c_uint32, _c.c_void_p, _c.POINTER(_c.c_void_p))
        get.restype = _c.c_int
        funcs["GetModuleHandleExW"] = get
    else:
        candidates: list[Optional[str]] = [None]
        try:
            from ctypes.util import find_library

            candidates.append(find_library("dl"))
        except Exception:  # ctypes.util may fail in odd environments; dladdr is optional
            pass
        for candidate in candidates:
            try:
                libdl = _c.CDLL(candidate)
                dladdr = libdl.dladdr
            except (OSError, AttributeError):
                continue
            dladdr.argtypes = (_c.c_void_p, _c.POINTER(_DlInfo))
            dladdr.restype = _c.c_int
            funcs["dladdr"] = dladdr
            dlinfo = getattr(libdl, "dlinfo", None)
            if dlinfo is not None:
                dlinfo.argtypes = (_c.c_void_p, _c.c_int, _c.c_void_p)
                dlinfo.restype = _c.c_int
                funcs["dlinfo"] = dlinfo
            break
    _dl_funcs.update(funcs)
    return _dl_funcs


_GET_MODULE_FROM_ADDRESS = 0x4
_GET_MODULE_UNCHANGED_REFCOUNT = 0x2


def module_of_address(address: int) -> Optional[tuple[int, Optional[str]]]:
    """``(base address, path)`` of the loaded module containing ``address``."""
    funcs = _dl()
    if WINDOWS:  # pragma: no cover - exercised on Windows only
        hmod = _c.c_void_p()
        flags = _GET_MODULE_FROM_ADDRESS | _GET_MODULE_UNCHANGED_REFCOUNT
        if not funcs["GetModuleHandleExW"](flags, address, _c.byref(hmod)) or not hmod.value:
            return None
        return hmod.value, None
    dladdr = funcs.get("dladdr")
    if dladdr is None:
        return None
    info = _DlInfo()
    if not dladdr(address, _c.byref(info)) or not info.dli_fbase:
        return None
    path = os.fsdecode(info.dli_fname) if info.dli_fname else None
    return info.dli_fbase, path


_RTLD_DI_LINKMAP = 2


def path_of_handle(handle: int) -> Optional[str]:
    """The file name of the library behind a POSIX ``dlopen`` handle (Linux: ``dlinfo``)."""
    dlinfo = _dl().get("dlinfo")
    if dlinfo is None or not handle:
        return None
    link_map = _c.c_void_p()
    if dlinfo(handle, _RTLD_DI_LINKMAP, _c.byref(link_map)) != 0 or not link_map.value:
        return None
    # struct link_map { ElfW(Addr) l_addr; char *l_name; ... }
    name = _c.cast(link_map.value + _c.sizeof(_c.c_void_p), _c.POINTER(_c.c_char_p))[0]
    return os.fsdecode(name) if name else None


def is_loaded_handle(handle: int) -> Optional[bool]:
    """Whether ``handle`` is the ``dlopen`` handle of a library loaded now, or ``None`` where
    that cannot be told (Windows, no ``dlinfo``).

    Asked before a raw handle given by a user reaches ``dlinfo`` or ``dlclose``, which crash
    on anything else.  A handle is its library's ``struct link_map`` (glibc, musl): it is
    looked for in the loader's list of loaded objects, from the main program's entry on.
    """
    dlinfo = _dl().get("dlinfo")
    if WINDOWS or dlinfo is None:
        return None
    main = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]
    try:
        link_map = _c.c_void_p()
        if dlinfo(main, _RTLD_DI_LINKMAP, _c.byref(link_map)) != 0:
            return None
        # struct link_map { l_addr; l_name; l_ld; l_next; l_prev; ... }
        next_offset = 3 * _c.sizeof(_c.c_void_p)
        entry = link_map.value
        while True:  # (not "while entry:": see tests/adversarial/test_try_coverage.py)
            if not entry:
                break
            if entry == handle:
                return True
            entry = _c.c_void_p.from_address(entry + next_offset).value
        return False
    finally:
        _ctypes.dlclose(main)


def loader_ref(address: Optional[int] = None, path: Optional[str] = None) -> Optional[int]:
    """Take one more loader reference on an already loaded library.

    The library is then not unmapped by anybody's ``dlclose`` / ``FreeLibrary`` until
    `close_library_handle` drops it; the reference is found from an address
    inside the library (a function) or from its path.  Never loads anything new.
    """
    if WINDOWS:  # pragma: no cover - exercised on Windows only
        if address is None:
            return None
        hmod = _c.c_void_p()
        if not _dl()["GetModuleHandleExW"](_GET_MODULE_FROM_ADDRESS, address, _c.byref(hmod)):
            return None
        return hmod.value
    if path is None and address is not None:
        found = module_of_address(address)
        path = found[1] if found is not None else None
    noload = getattr(os, "RTLD_NOLOAD", None)
    if not path or noload is None:
        return None
    try:
        handle: int = _ctypes.dlopen(path, os.RTLD_NOW | noload)
    except OSError:
        return None  # not loaded under that name; nothing to pin at the loader level
    return handle


def module_of_loaded(name: Optional[str]) -> Optional[tuple[int, Optional[str]]]:
    """``(base address, path)`` of the library already loaded as ``name`` (as given to
    ``dlopen``), as `module_of_address` gives them for its code; ``None``: not loaded under
    that name, or not knowable here (Windows, no ``dlinfo``).  Never loads anything."""
    handle = loader_ref(path=name) if name and not WINDOWS else None
    if handle is None:
        return None
    try:
        return module_of_handle(handle)
    finally:
        close_library_handle(handle)


def module_of_handle(handle: int) -> Optional[tuple[int, Optional[str]]]:
    """``(base address, path)`` of the library behind a loader handle that is open now, as
    `module_of_address` gives them for its code (Windows: the handle is the base); ``None``:
    not knowable here.  ``handle`` must be a live handle (see `is_loaded_handle`)."""
    if WINDOWS:  # pragma: no cover - exercised on Windows only
        return (handle, None) if handle else None
    dlinfo = _dl().get("dlinfo")
    link_map = _c.c_void_p()
    if (
        not handle
        or dlinfo is None
        or dlinfo(handle, _RTLD_DI_LINKMAP, _c.byref(link_map)) != 0
        or not link_map.value
    ):
        return None
    # struct link_map { l_addr; l_name; l_ld; ... }: l_ld, the library's dynamic section,
    # lies in its own mapping (l_addr is only the load bias, 0 for the main program)
    dynamic = _c.c_void_p.from_address(link_map.value + 2 * _c.sizeof(_c.c_void_p)).value
    return module_of_address(dynamic) if dynamic else None


def close_library_handle(handle: int) -> None:
    """``dlclose`` / ``FreeLibrary`` one reference of a library handle."""
    if WINDOWS:  # pragma: no cover - exercised on Windows only
        _ctypes.FreeLibrary(handle)  # type: ignore[attr-defined]
    else:
        _ctypes.dlclose(handle)


def immortalize(obj: object) -> None:
    """Leak one reference to ``obj``, so it survives even interpreter finalization.

    For callback function pointers that native code may still call while (or after)
    Python finalizes its modules: freeing their trampoline would turn such a call into
    a jump into freed memory.
    """
    from ._process import keep_forever

    keep_forever(obj)
    _c.pythonapi.Py_IncRef(_c.py_object(obj))

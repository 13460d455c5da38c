"""exitsafe for ctypes bindings: :func:`track` pointers, :func:`pin` libraries, guarded
:func:`callback` functions.

* :func:`track` owns a native pointer (``c_void_p``, ``POINTER(T)`` instance,
  ``c_char_p`` or a plain ``int`` address) and calls ``release(ptr)`` exactly
  once, in dependency order, or never when the handle is leaked.  It keeps
  the library of the release function alive and, when that library is
  pinned, depends on the pin automatically.
* :func:`pin` holds a ``CDLL`` / ``PyDLL`` / ``WinDLL`` (or a raw ``dlopen``
  / ``LoadLibrary`` handle) loaded while anything depending on it lives,
  and closes it (``dlclose`` / ``FreeLibrary``) after the last dependent, or
  never under a leak policy.
* :func:`callback` makes a ``CFUNCTYPE`` function pointer whose Python side
  returns a default once teardown began, and keeps it alive for as long as
  native code may call it (for ever, if it is still registered at exit).

Every function returns an :class:`exitsafe.Handle`; see ``docs/adapters.md``.
Thread rules: every function may be called from any thread; a release or
close runs on the thread dropping the last owner or on the teardown thread.
"""

from __future__ import annotations

import _ctypes
import ctypes as _c
import os
import sys
from _weakref import ref as _weakref

from ._guard import Guarded
from .lifetime import Handle, Registry
from .objects import (
    _bind_address,
    _claim_address,
    _forget_address,
    _hook_after_leak,
    _live_at,
    _register_lookup,
    _registry,
    _resolve,
)
from .objects import (
    handle_of as _adopt_handle_of,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType
    from typing import Any, Callable, Optional

    from .lifetime import ExitPolicy

    OnError = Callable[[type[BaseException], BaseException, Optional[TracebackType]], object]

__all__ = ["callback", "handle_of", "pin", "pinned", "track"]

_WINDOWS = sys.platform == "win32"

#: Objects exitsafe keeps referenced until the process ends (pins with close=False).
_forever: list[object] = []


# ---------------------------------------------------------------------- native helpers
# Shared with exitsafe.cffi.  Each returns None where the platform offers no way.


class _DlInfo(_c.Structure):
    _fields_ = (
        ("dli_fname", _c.c_char_p),
        ("dli_fbase", _c.c_void_p),
        ("dli_sname", _c.c_char_p),
        ("dli_saddr", _c.c_void_p),
    )


_dl_funcs: Optional[dict[str, Any]] = None


def _dl() -> dict[str, Any]:
    """The loader functions this platform offers (``dladdr``, ``dlinfo``, Windows APIs)."""
    global _dl_funcs
    if _dl_funcs is not None:
        return _dl_funcs
    funcs: dict[str, Any] = {}
    if _WINDOWS:  # pragma: no cover - exercised on Windows only
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
    _dl_funcs = funcs
    return funcs


_GET_MODULE_FROM_ADDRESS = 0x4
_GET_MODULE_UNCHANGED_REFCOUNT = 0x2


def _module_of_address(address: int) -> Optional[tuple[int, Optional[str]]]:
    """``(base address, path)`` of the loaded module containing ``address``."""
    funcs = _dl()
    if _WINDOWS:  # pragma: no cover - exercised on Windows only
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


def _path_of_handle(handle: int) -> Optional[str]:
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


def _loader_ref(address: Optional[int] = None, path: Optional[str] = None) -> Optional[int]:
    """Take one more loader reference on an already loaded library.

    The library is then not unmapped by anybody's ``dlclose`` / ``FreeLibrary``
    until :func:`_drop_loader_ref`; the reference is found from an address
    inside the library (a function) or from its path.  Never loads anything new.
    """
    if _WINDOWS:  # pragma: no cover - exercised on Windows only
        if address is None:
            return None
        hmod = _c.c_void_p()
        if not _dl()["GetModuleHandleExW"](_GET_MODULE_FROM_ADDRESS, address, _c.byref(hmod)):
            return None
        return hmod.value
    if path is None and address is not None:
        found = _module_of_address(address)
        path = found[1] if found is not None else None
    noload = getattr(os, "RTLD_NOLOAD", None)
    if not path or noload is None:
        return None
    try:
        handle: int = _ctypes.dlopen(path, os.RTLD_NOW | noload)
    except OSError:
        return None  # not loaded under that name; nothing to pin at the loader level
    return handle


def _close_library_handle(handle: int) -> None:
    """``dlclose`` / ``FreeLibrary`` one reference of a library handle."""
    if _WINDOWS:  # pragma: no cover - exercised on Windows only
        _ctypes.FreeLibrary(handle)  # type: ignore[attr-defined]
    else:
        _ctypes.dlclose(handle)


def _keep_forever(obj: object) -> None:
    """Leak one reference to ``obj``: it then survives interpreter finalization.

    Used for callback function pointers that native code may still call
    while (or after) Python finalizes its modules: freeing their trampoline
    would turn such a call into a jump into freed memory.
    """
    _forever.append(obj)
    _c.pythonapi.Py_IncRef(_c.py_object(obj))


# ---------------------------------------------------------------------- pointers


def _address(ptr: object) -> int:
    """Validate a pointer argument of :func:`track`; return its address."""
    if isinstance(ptr, bool):
        raise TypeError("track() needs a pointer, got a bool")
    if isinstance(ptr, int):
        if ptr == 0:
            raise ValueError("track() got a NULL pointer (0): there is nothing to own")
        if ptr < 0:
            raise ValueError(f"track() got a negative address: {ptr}")
        return ptr
    if isinstance(ptr, _ctypes.CFuncPtr):
        raise TypeError(
            "track() got a ctypes function pointer; use exitsafe.ctypes.callback() for "
            "Python callbacks, and pin() for the library that owns native functions"
        )
    if isinstance(ptr, (_c.c_void_p, _c.c_char_p, _c.c_wchar_p, _ctypes._Pointer)):
        address = _c.cast(ptr, _c.c_void_p).value
        if not address:
            raise ValueError(
                f"track() got a NULL pointer ({type(ptr).__name__}): there is nothing to own"
            )
        return address
    if isinstance(ptr, _ctypes._SimpleCData):
        raise TypeError(
            f"track() needs a pointer; {type(ptr).__name__} is not a pointer type "
            f"(pass a c_void_p / POINTER(T) instance, or the address as an int)"
        )
    if isinstance(ptr, (_ctypes.Structure, _ctypes.Union, _ctypes.Array)):
        raise TypeError(
            f"track() needs a pointer, got a {type(ptr).__name__} value; its memory belongs "
            f"to ctypes. Track the pointer C returned to you instead"
        )
    raise TypeError(f"track() needs a ctypes pointer or an int address, got {type(ptr).__name__}")


def _library_of(release: object) -> Optional[object]:
    """The ``CDLL`` a ctypes foreign function was loaded from (ctypes keeps it in _objects)."""
    if isinstance(release, _ctypes.CFuncPtr):
        objects = getattr(release, "_objects", None)
        if isinstance(objects, dict):
            lib = objects.get("0")
            if isinstance(lib, _c.CDLL):
                return lib
    return None


class _PointerRelease:
    """The release function of a tracked pointer: forget the address, call ``release``."""

    __slots__ = ("address", "handle", "keep", "release", "wrap_int")

    def __init__(self, release: Callable[[Any], object], address: int, keep: object) -> None:
        self.release = release
        self.address = address
        self.keep = keep  # the library the release code lives in, kept referenced
        self.handle: Optional[Callable[[], Optional[Handle]]] = None
        # A foreign function without argtypes would pass an int as a C int and truncate
        # a 64-bit address: hand it a c_void_p instead.
        self.wrap_int = (
            isinstance(release, _ctypes.CFuncPtr) and getattr(release, "argtypes", None) is None
        )

    def __call__(self, raw: Any) -> None:
        _forget_address(self.address, self.handle() if self.handle is not None else None)
        if self.wrap_int and isinstance(raw, int):
            raw = _c.c_void_p(raw)
        self.release(raw)


def track(
    ptr: object,
    release: Callable[[Any], object],
    *,
    registry: Optional[Registry] = None,
    lib: object = None,
    kind: str = "handle",
    depends_on: Iterable[object] = (),
    exit_policy: Optional[ExitPolicy] = None,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Own the native object at ``ptr``: ``release(ptr)`` runs exactly once, or never if leaked.

    The ctypes counterpart of ``ffi.gc`` with the lifetime rules of
    :meth:`exitsafe.Registry.track` (same ``kind``, ``depends_on``,
    ``exit_policy``, ``name``, ``timeout``): released when the handle's last
    owner lets go (``handle.release()``, ``with``, or garbage collection of
    the handle) and no dependent lives; at teardown in dependency order;
    never twice.  ``handle.raw`` returns ``ptr`` as given and raises
    :class:`~exitsafe.HandleClosedError` after release.

    ``ptr``: a ``c_void_p``, ``c_char_p``, ``POINTER(T)`` instance or an
    ``int`` address; NULL raises ``ValueError``, non-pointers ``TypeError``,
    a pointer already tracked :class:`~exitsafe.AlreadyTrackedError`.
    ``release``: usually ``lib.thing_free``; when it has no ``argtypes`` an
    int address is passed as ``c_void_p`` (not truncated to a C int).

    The library is kept referenced; if it (or ``lib``) is pinned with
    :func:`pin` in the same registry, the handle depends on the pin, so the
    library is closed only after this release ran.  ``depends_on`` accepts
    handles and objects exitsafe knows (pinned libraries, tracked pointers,
    adopted objects, wrappers).
    """
    if not callable(release):
        raise TypeError(f"release must be callable, got {type(release).__name__}")
    address = _address(ptr)
    reg = _registry(registry)
    parents = list(_resolve(depends_on, reg, "depends_on"))
    library = lib if lib is not None else _library_of(release)
    if library is not None:
        pin_handle = pinned(library, registry=reg)
        if pin_handle is not None and pin_handle not in parents:
            parents.append(pin_handle)
    _claim_address(address)
    releaser = _PointerRelease(release, address, library)
    handle = reg.track(
        ptr,
        releaser,
        kind=kind,
        depends_on=parents,
        exit_policy=exit_policy,
        name=name,
        timeout=timeout,
    )
    releaser.handle = _weakref(handle)
    if handle.state == "live":
        _bind_address(address, handle)
    return handle


def handle_of(ptr: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live handle tracking the address of ``ptr`` (a ctypes pointer or an int), or ``None``.

    Use it when C hands a pointer back (in a callback, from a getter) and
    you need its handle, e.g. to ``retain()`` it.  The lookup is by address,
    so any ctypes object pointing at the same place finds the same handle;
    it also finds libraries pinned with :func:`pin`.
    """
    return _adopt_handle_of(ptr, registry=registry)


def _lookup(obj: object, registry: Registry) -> Optional[Handle]:
    found = _pin_of(obj, registry)
    if found is not None:
        return found
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return _live_at(obj) if obj > 0 else None
    if isinstance(obj, (_c.c_void_p, _c.c_char_p, _c.c_wchar_p, _ctypes._Pointer)):
        address = _c.cast(obj, _c.c_void_p).value
        return _live_at(address) if address else None
    return None


_register_lookup(_lookup)


# ---------------------------------------------------------------------- libraries

#: id(library object) or raw handle int -> (library, live pin handle), held strongly:
#: a pin lives until released explicitly or by the teardown, not when dropped.
_pins: dict[object, tuple[object, Handle]] = {}


def _pin_key(lib: object) -> object:
    return ("handle", lib) if isinstance(lib, int) else id(lib)


def _pin_of(lib: object, registry: Registry) -> Optional[Handle]:
    entry = _pins.get(_pin_key(lib))
    if entry is None:
        return None
    obj, handle = entry
    if (obj is not lib and not isinstance(lib, int)) or handle.registry is not registry:
        return None
    if handle.state != "live" or not handle.owners:
        return None
    return handle


def pinned(lib: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live pin of ``lib`` (a ``CDLL`` or raw handle) in ``registry``, or ``None``."""
    return _pin_of(lib, _registry(registry))


class _LibraryCloser:
    """The release function of a ctypes pin."""

    __slots__ = ("close", "key", "lib_handle", "loader_ref")

    def __init__(self, key: object, lib_handle: int, loader_ref: Optional[int], close: bool):
        self.key = key
        self.lib_handle = lib_handle
        self.loader_ref = loader_ref
        self.close = close

    def __call__(self, lib: object) -> None:
        _pins.pop(self.key, None)
        if not self.close:
            _forever.append(lib)  # never unloaded by exitsafe: keep both references
            return
        ref, self.loader_ref = self.loader_ref, None
        try:
            if self.lib_handle:
                _close_library_handle(self.lib_handle)
        finally:
            if ref is not None:
                _close_library_handle(ref)


def pin(
    lib: object,
    *,
    registry: Optional[Registry] = None,
    close: bool = True,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Hold a loaded library until nothing depending on it lives; return its pin.

    The pin is a handle of kind ``"library"``.

    ``lib``: a ``CDLL`` / ``PyDLL`` / ``WinDLL`` / ``OleDLL`` instance, or a
    raw handle from ``_ctypes.dlopen`` / ``LoadLibrary``.  The pin takes one
    more loader reference on the library (``dlopen(RTLD_NOLOAD)`` of the same
    file; ``GetModuleHandleExW`` on Windows), so even an early
    ``dlclose`` of ``lib._handle`` by somebody else cannot unmap the code a
    dependent's release needs.

    ``close=True``: the pin owns closing the library handle: when the pin is
    released (explicitly after its last dependent, or at teardown, where
    libraries go last) ``lib._handle`` is closed (``dlclose`` /
    ``FreeLibrary``) and the extra reference dropped; do not close it
    yourself, and do not use the ``CDLL`` after that.  ``close=False``: the
    binding keeps closing its library on its own schedule; the pin holds its
    extra loader reference for the life of the process, so the code stays
    mapped whatever the binding closes.  Under a leak policy
    nothing is closed.  The pin is referenced by exitsafe until then:
    dropping it does not unpin.  Pinning the same library again in the same
    registry returns the existing pin with one more owner (``close`` must
    match).
    """
    if isinstance(lib, bool) or lib is None:
        raise TypeError(f"pin() needs a ctypes library or a raw handle, got {lib!r}")
    if isinstance(lib, int):
        lib_handle = lib
        path = None if _WINDOWS else _path_of_handle(lib)
    elif isinstance(lib, _c.CDLL):
        lib_handle = int(getattr(lib, "_handle", 0) or 0)
        lib_name = getattr(lib, "_name", None)
        path = None if _WINDOWS else (_path_of_handle(lib_handle) or lib_name)
        if lib_name is None:
            path = None  # CDLL(None): the main program, never unloaded
    else:
        raise TypeError(
            f"pin() needs a ctypes CDLL (or PyDLL / WinDLL) or a raw library handle, "
            f"got {type(lib).__name__}; use exitsafe.cffi.pin for cffi libraries"
        )
    reg = _registry(registry)
    existing = _pin_of(lib, reg)
    if existing is not None:
        closer = existing._fn
        if isinstance(closer, _LibraryCloser) and closer.close != bool(close):
            raise ValueError(
                f"{existing.name!r} is already pinned with close={closer.close}; "
                f"cannot pin it again with close={bool(close)}"
            )
        return existing.retain()
    if _WINDOWS:  # pragma: no cover - exercised on Windows only
        loader_ref = _loader_ref(address=lib_handle) if lib_handle else None
    else:
        loader_ref = _loader_ref(path=path) if path else None
    key = _pin_key(lib)
    closer = _LibraryCloser(key, lib_handle, loader_ref, bool(close))
    if name is None:
        label = getattr(lib, "_name", None) if not isinstance(lib, int) else None
        name = f"library {label}" if label else f"library 0x{lib_handle:x}"
    handle = reg.pin(lib, close=closer, name=name, timeout=timeout)
    if handle.state == "live":
        _pins[key] = (lib, handle)
    return handle


# ---------------------------------------------------------------------- callbacks

#: id(function pointer) -> its live callback handle, held strongly until retired.
_callbacks: dict[int, Handle] = {}


def _zero_result(restype: Any) -> Any:
    """The value a callback returns to C once teardown began, when none was given."""
    if restype is None:
        return None
    if isinstance(restype, type) and issubclass(restype, _ctypes._SimpleCData):
        return restype().value
    return None


class _CallbackRelease:
    """The release function of a callback handle: retire it."""

    __slots__ = ("after", "hook", "key")

    def __init__(self, key: int) -> None:
        self.key = key
        self.after: Optional[Any] = None
        self.hook: Optional[Handle] = None

    def __call__(self, raw: object) -> None:
        _callbacks.pop(self.key, None)
        after, self.after = self.after, None
        if after is not None:
            after.obj = None
        hook, self.hook = self.hook, None
        if hook is not None:
            hook.release()  # cancel the keep-forever hook; a no-op during teardown


def _with_onerror(fn: Callable[..., Any], onerror: OnError, default: Any) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as exc:  # handed to onerror, as cffi does
            result = onerror(type(exc), exc, exc.__traceback__)
            return default if result is None else result

    return call


def _register_callback(
    reg: Registry,
    cfunc: object,
    fn: Callable[..., Any],
    name: Optional[str],
    depends_on: tuple[Handle, ...],
    exit_policy: ExitPolicy,
) -> Handle:
    """Track a callback function pointer (shared with exitsafe.cffi)."""
    key = id(cfunc)
    releaser = _CallbackRelease(key)
    handle = reg.track(
        cfunc,
        releaser,
        kind="callback",
        depends_on=depends_on,
        exit_policy=exit_policy,
        name=name if name is not None else getattr(fn, "__qualname__", None),
    )
    if handle.state != "live":
        _keep_forever(cfunc)  # registered after teardown began: C may hold it for ever
        return handle
    _callbacks[key] = handle
    releaser.after, releaser.hook = _hook_after_leak(
        reg, handle, cfunc, _keep_forever, f"keep {handle.name} alive if leaked"
    )
    return handle


def callback(
    proto: type,
    fn: Callable[..., Any],
    *,
    default: Any = None,
    onerror: Optional[OnError] = None,
    registry: Optional[Registry] = None,
    name: Optional[str] = None,
    depends_on: Iterable[object] = (),
    exit_policy: ExitPolicy = "leak",
) -> Handle:
    """A C function pointer of type ``proto`` (a ``CFUNCTYPE``) calling ``fn``, kept alive
    while native code may call it, going quiet at teardown.  Returns a handle of kind
    ``"callback"``: pass ``handle.raw`` to C, ``handle.release()`` to retire it.

    Guard: once the registry's teardown has begun, every call returns
    ``default`` without calling ``fn`` (:func:`exitsafe.guard`), on whatever
    thread the native code calls from.  With ``default=None`` and a
    non-void result type the type's zero is returned.  ``onerror(exc_type,
    exc, tb)`` receives exceptions raised by ``fn`` and returns the result
    for C (``None``: ``default``); without it ctypes reports the exception
    and C receives a zeroed result.

    Lifetime: the function pointer (and its libffi trampoline) is
    referenced by exitsafe until you call ``release()`` on the handle, after
    unregistering it from the C side; dropping the handle does not free it.
    ``depends_on`` is rarely needed; rather, pass the callback handle in the
    ``depends_on`` of the native objects that call it, so they are released
    first.  At teardown the default ``exit_policy="leak"`` keeps the
    function pointer alive for the rest of the process (even through
    interpreter finalization), since a native thread may still call it;
    ``"release"`` frees it in dependency order.
    """
    if not (isinstance(proto, type) and issubclass(proto, _ctypes.CFuncPtr)):
        raise TypeError(
            f"proto must be a ctypes function type made by CFUNCTYPE / WINFUNCTYPE, got {proto!r}"
        )
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if onerror is not None and not callable(onerror):
        raise TypeError(f"onerror must be callable or None, got {type(onerror).__name__}")
    reg = _registry(registry)
    parents = _resolve(depends_on, reg, "depends_on")
    if default is None:
        default = _zero_result(getattr(proto, "_restype_", None))
    inner = fn if onerror is None else _with_onerror(fn, onerror, default)
    cfunc = proto(Guarded(inner, default, reg))
    return _register_callback(reg, cfunc, fn, name, parents, exit_policy)

"""exitsafe for ctypes bindings: [`track`][exitsafe.ctypes.track] pointers,
[`pin`][exitsafe.ctypes.pin] libraries, guarded
[`callback`][exitsafe.ctypes.callback] functions.

* [`track`][exitsafe.ctypes.track] owns a native pointer (``c_void_p``, ``POINTER(T)`` instance,
  ``c_char_p`` or a plain ``int`` address) and calls ``release(ptr)`` exactly
  once, in dependency order, or never when the handle is leaked.  It keeps
  the library of the release function alive and, when that library is
  pinned, depends on the pin automatically.
* [`pin`][exitsafe.ctypes.pin] holds a ``CDLL`` / ``PyDLL`` / ``WinDLL`` (or a raw ``dlopen``
  / ``LoadLibrary`` handle) loaded while anything depending on it lives,
  and closes it (``dlclose`` / ``FreeLibrary``) after the last dependent, or
  never under a leak policy.
* [`callback`][exitsafe.ctypes.callback] makes a ``CFUNCTYPE`` function pointer whose Python side
  returns a default once teardown began, and keeps it alive for as long as
  native code may call it (for ever, if it is still registered at exit).

Every function returns an [`exitsafe.Handle`][exitsafe.Handle]; the
[adapters page](../adapters.md) has before/after examples.
Thread rules: every function may be called from any thread; a release or
close runs on the thread dropping the last owner or on the teardown thread.
"""

from __future__ import annotations

import _ctypes
import ctypes as _c

from ._adapter import Adapter, BorrowingLibrary, LibraryInfo, check_library
from ._adapter import call as _call
from ._adopt import handle_of as _handle_of
from ._adopt import registry_arg
from ._core import speedups
from ._guard import Guarded
from ._handle import Handle
from ._lookup import resolve
from ._native import (
    WINDOWS,
    close_library_handle,
    is_loaded_handle,
    loader_ref,
    module_of_handle,
    path_of_handle,
)
from ._usage import (
    describe,
    explained,
    first_argument,
    not_a_foreign_function,
    not_a_function,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType
    from typing import Any, Callable, Optional

    from ._registry import ExitPolicy, Registry

    OnError = Callable[[type[BaseException], BaseException, Optional[TracebackType]], object]

__all__ = ["borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"]


def _is_prototype(proto: object) -> bool:
    return isinstance(proto, type) and issubclass(proto, _ctypes.CFuncPtr)

_POINTERS = (_c.c_void_p, _c.c_char_p, _c.c_wchar_p, _ctypes._Pointer)
#: The largest address a pointer holds here.
_ADDRESS_MAX = (1 << (8 * _c.sizeof(_c.c_void_p))) - 1


class _VoidPointerCall:
    """Calls a foreign function without ``argtypes`` with an int address as ``c_void_p``
    (passed as a C ``int`` it would be truncated to 32 bits)."""

    __slots__ = ("release",)

    def __init__(self, release: Callable[[Any], object]) -> None:
        self.release = release

    def __call__(self, raw: Any) -> object:
        if isinstance(raw, int):
            raw = _c.c_void_p(raw)
        return self.release(raw)


class _CtypesAdapter(Adapter):
    name = "ctypes"

    def pointer_address(self, ptr: object, ctx: Any) -> int:
        if isinstance(ptr, bool):
            raise TypeError("track() needs a pointer (or an int address), got a bool")
        if isinstance(ptr, int):
            # The key is an exact int: an int subclass's own __eq__ / __hash__ must neither
            # run inside a section nor make one address two keys.
            key = int.__index__(ptr)
            if key == 0:
                raise ValueError("track() got a NULL pointer (0): there is nothing to own")
            if key < 0:
                raise ValueError(f"track() got a negative address: {key}")
            if key > _ADDRESS_MAX:
                # ctypes would pass it truncated: a second key for the same object
                raise ValueError(
                    f"track() got an address beyond what a pointer holds here: 0x{key:x}"
                )
            return key
        if isinstance(ptr, _ctypes.CFuncPtr):
            raise TypeError(
                "track() got a ctypes function pointer: call the function for the pointer it "
                "returns (track(lib.thing_create(), lib.thing_free)); use "
                "exitsafe.ctypes.callback() for Python callbacks, and pin() for the library "
                "that owns native functions"
            )
        if isinstance(ptr, _POINTERS):
            # The pointer's own bytes, read in place (ctypes.cast calls through libffi).
            address = _c.c_void_p.from_buffer(ptr).value
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
                f"track() needs a pointer, got a {type(ptr).__name__} value; its memory "
                f"belongs to ctypes. Track the pointer C returned to you instead"
            )
        if ptr is None:
            hint = (
                ": a function whose restype is c_void_p returns None for a NULL pointer "
                "(did the C call fail?)"
            )
        else:
            hint = (
                "; set the function's restype to ctypes.c_void_p (or a POINTER type) so that "
                "it returns the pointer"
                if isinstance(ptr, (str, bytes, float)) else ""
            )
        raise TypeError(
            f"track() needs a ctypes pointer or an int address, got {describe(ptr)}{hint}"
        )

    def release_call(self, release: Callable[[Any], object]) -> Callable[[Any], object]:
        if isinstance(release, _ctypes.CFuncPtr) and getattr(release, "argtypes", None) is None:
            return _VoidPointerCall(release)
        return release

    def pin_for_release(self, release: object, ctx: Any, registry: Registry) -> Optional[Handle]:
        library = _library_of(release)
        if library is not None:
            return self.pin_of(library, registry)
        if not isinstance(release, _ctypes.CFuncPtr) or not self.has_pins():
            return None
        # A function pointer made from an address (``PROTO(address)``, or one read from a
        # struct): the library its code lies in, asked of the loader.  A CFUNCTYPE of a
        # Python callable points into libffi's trampolines, which belong to no library.
        return self.pin_of_function(release, _c.cast(release, _c.c_void_p).value or 0, registry)

    def names_of_library(self, lib: object) -> tuple[object, ...]:
        """A ``CDLL`` and the raw handle it holds: the loader returns one handle per loaded
        library, so a library pinned by its handle is found from its ``CDLL`` and its
        functions, and pinning the ``CDLL`` again shares that pin; a raw handle, and the
        pinned ``CDLL`` objects holding it, so that pinning the handle of a pinned ``CDLL``
        shares that pin too."""
        if isinstance(lib, _c.CDLL):
            lib_handle = _handle_value(lib)
            return (lib, lib_handle) if lib_handle else (lib,)
        if isinstance(lib, int) and not isinstance(lib, bool):
            holders = tuple(
                entry.lib
                for entry in tuple(self.pin_table().values())
                if isinstance(entry.lib, _c.CDLL) and _handle_value(entry.lib) == lib
            )
            return (lib, *holders)
        return (lib,)

    def same_library(self, pinned: object, lib: object) -> bool:
        """A raw handle closes the reference of the ``CDLL`` holding it (or the same
        handle given again); two ``CDLL`` objects each close their own reference."""
        if pinned is lib:
            return True
        if not (_is_raw_handle(pinned) or _is_raw_handle(lib)):
            return False
        value = _handle_value(lib)
        return bool(value) and _handle_value(pinned) == value

    def is_library(self, lib: object) -> bool:
        return isinstance(lib, _c.CDLL) or _is_raw_handle(lib)

    def describe_library(self, lib: object, ctx: Any) -> LibraryInfo:
        if isinstance(lib, bool) or lib is None:
            raise TypeError(
                f"pin() needs a ctypes library (what ctypes.CDLL() returned) or a raw handle, "
                f"got {lib!r}"
            )
        if isinstance(lib, int):
            lib_handle = int.__index__(lib)
            if not 0 < lib_handle <= _ADDRESS_MAX:
                raise ValueError(f"pin() got {lib!r}, which is not a library handle")
            if is_loaded_handle(lib_handle) is False:  # (dlinfo / dlclose would crash on it)
                raise ValueError(
                    f"pin() got 0x{lib_handle:x}, which is not the handle of a loaded library"
                )
            path = None if WINDOWS else path_of_handle(lib_handle)
            label = f"0x{lib:x}"
        elif isinstance(lib, _c.CDLL):
            lib_handle = int(getattr(lib, "_handle", 0) or 0)
            lib_name = getattr(lib, "_name", None)
            path = None if WINDOWS else (path_of_handle(lib_handle) or lib_name)
            if lib_name is None:
                path = None  # CDLL(None): the main program, never unloaded
            label = str(lib_name) if lib_name else f"0x{lib_handle:x}"
        else:
            hint = (
                f"; load it first: exitsafe.ctypes.pin(ctypes.CDLL({lib!r}))"
                if isinstance(lib, (str, bytes))
                else "; use exitsafe.cffi.pin(ffi, lib) for cffi libraries"
            )
            raise TypeError(
                f"pin() needs a ctypes CDLL (or PyDLL / WinDLL) or a raw library handle, "
                f"got {describe(lib)}{hint}"
            )
        if WINDOWS:  # pragma: no cover - exercised on Windows only
            ref = loader_ref(address=lib_handle) if lib_handle else None
        else:
            ref = loader_ref(path=path) if path else None
        # (the base finds the pin from a function pointer made from an address)
        found = module_of_handle(lib_handle) if lib_handle else None
        return LibraryInfo(
            self.pin_key(lib),
            label,
            _HandleCloser(lib_handle) if lib_handle else None,
            ref,
            found[0] if found is not None else None,
        )

    def lookup(self, obj: object, registry: Registry) -> Optional[Handle]:
        found = self.pin_of(obj, registry)
        if found is not None or isinstance(obj, bool):
            return found
        if isinstance(obj, int):
            key = int.__index__(obj)  # an exact int, as track() keys it
            return self.tracked(key) if key > 0 else None
        if isinstance(obj, _POINTERS):
            address = _c.cast(obj, _c.c_void_p).value
            return self.tracked(address) if address else None
        return None


def _is_raw_handle(lib: object) -> bool:
    return isinstance(lib, int) and not isinstance(lib, bool)


def _handle_value(lib: object) -> int:
    """The loader handle a ``CDLL`` holds, or a raw handle's value (0: none)."""
    if _is_raw_handle(lib):
        return int.__index__(lib)  # type: ignore[arg-type]
    value = getattr(lib, "_handle", 0) if isinstance(lib, _c.CDLL) else 0
    return value if _is_raw_handle(value) else 0


class _HandleCloser:
    """Closes the ``dlopen`` / ``LoadLibrary`` handle of a pinned library."""

    __slots__ = ("lib_handle",)

    def __init__(self, lib_handle: int) -> None:
        self.lib_handle = lib_handle

    def __call__(self, lib: object) -> None:
        close_library_handle(self.lib_handle)


_ADAPTER = _CtypesAdapter()


def _library_of(release: object) -> Optional[object]:
    """The ``CDLL`` a ctypes foreign function was loaded from (ctypes keeps it in _objects)."""
    if isinstance(release, _ctypes.CFuncPtr):
        objects = getattr(release, "_objects", None)
        if isinstance(objects, dict):
            lib = objects.get("0")
            if isinstance(lib, _c.CDLL):
                return lib
    return None


@explained(
    "exitsafe.ctypes.track",
    "exitsafe.ctypes.track(ptr, release)",
    needs={"ptr": "the pointer C returned (c_void_p, POINTER(T) or an int address)",
           "release": "the function that frees the pointer, such as lib.thing_free"},
)
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
    affinity: Optional[str] = None,
) -> Handle:
    """Own the native object at `ptr`: `release(ptr)` runs exactly once, or never if leaked.

    The ctypes counterpart of `ffi.gc`, with the lifetime rules of
    [`Registry.track`][exitsafe.Registry.track]: released when the handle's last owner lets
    go (`handle.release()`, `with`, or garbage collection of the handle) and no dependent
    lives, on that thread; at teardown in dependency order; never twice.  If `track` raises,
    `ptr` is still yours, but for a Ctrl-C as the handle is handed over (see
    `Registry.track`): an `except KeyboardInterrupt` around `track` must not release `ptr`.

    Args:
        ptr: a `c_void_p`, `c_char_p`, `POINTER(T)` instance or an `int` address;
            `handle.raw` returns it as given.
        release: the release function, usually `lib.thing_free`; when it has no `argtypes`
            an int address is passed as `c_void_p` (not truncated to a C int).
        registry: the registry to own it in; `None`: the default registry.
        lib: the library whose code `release` runs (kept referenced); if it, or the library
            of `release`, is pinned with [`pin`][exitsafe.ctypes.pin] in the same registry,
            the handle depends on the pin, so the library is closed only after this release
            ran.  The library of a foreign function loaded from a `CDLL` is that `CDLL`; of
            one made from an address (`PROTO(address)`), the library the loader says its
            code lies in.
        kind: a label (`"device"`, `"buffer"`...) for the ledger, the trace and exit
            policies; `"library"` makes the handle go last at teardown.
        depends_on: handles or objects exitsafe knows (pinned libraries, tracked pointers,
            adopted objects, wrappers) that must outlive this one.
        exit_policy: `"release"`, `"leak"` or a callable policy deciding at teardown (see
            [`exitsafe.policies`][exitsafe.policies]); `None`: the registry's default.
        name: the display name in the ledger and the trace; default `"<kind>#<n>"`.
        timeout: seconds the release may take at teardown before it is abandoned and the
            handle leaked; `None`: the registry's step timeout.
        affinity: `"creator"` or `"main"` runs the release only on that thread (GL contexts,
            some GPU and GUI objects): a release due elsewhere is queued for that thread's
            next exitsafe call or [`run_pending()`][exitsafe.lowlevel.run_pending]; see
            [`Registry.track`][exitsafe.Registry.track].  `None`: any thread.

    Returns:
        A [`Handle`][exitsafe.Handle] holding one owner; `handle.raw` raises
            [`HandleClosedError`][exitsafe.HandleClosedError] after release.

    Raises:
        ValueError: `ptr` is NULL.
        TypeError: `ptr` is not a pointer, or `release` is not callable.
        AlreadyTrackedError: the pointer is already tracked (by this or the cffi adapter).

    Example:
        ```python
        lib = ctypes.CDLL("libgpu.so")
        pin = exitsafe.ctypes.pin(lib)
        dev = exitsafe.ctypes.track(lib.device_create(), lib.device_free, kind="device")
        ```
    """
    # Without `lib=` the adapter finds the pin of the library `release` was loaded from
    # (pin_for_release) and remembers it for the compiled track.
    return _ADAPTER.track(  # (positions only: the cheapest call, see Adapter.track)
        None, ptr, release, registry, lib, kind, depends_on, exit_policy, name, timeout,
        affinity,
    )


@explained(
    "exitsafe.ctypes.handle_of",
    "exitsafe.ctypes.handle_of(ptr)",
    needs={"ptr": "the pointer (or library) whose handle to find"},
)
def handle_of(ptr: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live handle tracking the address of `ptr`, or `None`.

    Use it when C hands a pointer back (in a callback, from a getter) and you need its
    handle, e.g. to `retain()` it.

    Args:
        ptr: a ctypes pointer or an int address; any ctypes object pointing at the same
            place finds the same handle.  A library pinned with
            [`pin`][exitsafe.ctypes.pin] finds its pin.
        registry: where to look; `None`: the default registry.

    Returns:
        The live handle, or `None` (never tracked, or released or leaked since).
    """
    return _handle_of(ptr, registry=registry)


@explained(
    "exitsafe.ctypes.pinned",
    "exitsafe.ctypes.pinned(lib)",
    needs={"lib": "the library, what ctypes.CDLL() returned"},
)
def pinned(lib: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live pin of `lib` in `registry`, or `None`.

    A pin whose owners all released it (while handles still depend on it) is no longer
    returned: it ends with its last dependent, and new handles do not depend on it.

    Args:
        lib: a `CDLL` (or `PyDLL`, `WinDLL`, `OleDLL`) or a raw library handle; a `CDLL`
            also finds the pin of the raw handle it holds.
        registry: where to look; `None`: the default registry.

    Returns:
        The pin made by [`pin`][exitsafe.ctypes.pin], or `None`.
    """
    return _ADAPTER.pin_of(lib, registry_arg(registry))


@explained(
    "exitsafe.ctypes.pin",
    "exitsafe.ctypes.pin(lib)",
    needs={"lib": "the library, what ctypes.CDLL() returned"},
)
def pin(
    lib: object,
    *,
    registry: Optional[Registry] = None,
    close: bool = True,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Hold a loaded library until nothing depending on it lives; return its pin.

    The pin takes one more loader reference on the library (`dlopen(RTLD_NOLOAD)` of the
    same file; `GetModuleHandleExW` on Windows), so even an early `dlclose` of
    `lib._handle` by somebody else cannot unmap the code a dependent's release needs.  The
    pin is referenced by exitsafe until it is released: dropping it does not unpin.  Under
    a leak policy nothing is closed.

    Args:
        lib: a `CDLL` / `PyDLL` / `WinDLL` / `OleDLL` instance, or a raw handle from
            `_ctypes.dlopen` / `LoadLibrary` (a library pinned by its handle is also found
            from a `CDLL` holding that handle, and from that `CDLL`'s functions; pinning a
            `CDLL` and the handle it holds, in either order, gives one pin, and pins of
            them in two registries close that handle once).  `ValueError` for an int that
            is not the handle of a loaded library.
        registry: the registry to pin it in; `None`: the default registry.
        close: `True` (the default): the pin owns closing the library handle: when the pin
            is released (explicitly after its last dependent, or at teardown, where
            libraries go last) `lib._handle` is closed (`dlclose` / `FreeLibrary`) and the
            extra reference dropped; do not close it yourself, and do not use the `CDLL`
            after that.  In the process's exit, while another thread may still be running
            (any thread with a Python frame, not parked), the library is kept loaded
            instead, as with `False`, and exitsafe's logger says so.  `False`: the binding
            keeps closing its library on its own schedule; the pin holds its extra loader
            reference for the life of the process, so the code stays mapped whatever the
            binding closes.
        name: the display name; default `"library#<n>"`.
        timeout: seconds the close may take at teardown before it is abandoned; `None`: the
            registry's step timeout.

    Returns:
        The pin, a handle of kind `"library"`.  Pinning the same library again in the same
            registry returns the existing pin with one more owner.

    Raises:
        ValueError: the library is already pinned in this registry with a different
            `close`.
        TypeError: `lib` is not a library, or `close` is not a bool.
    """
    return _ADAPTER.pin(None, lib, registry=registry, close=close, name=name, timeout=timeout)


# ---------------------------------------------------------------------- callbacks


def _zero_result(restype: Any) -> Any:
    """The value a callback returns to C once teardown began, when none was given."""
    if restype is None:
        return None
    if isinstance(restype, type) and issubclass(restype, _ctypes._SimpleCData):
        return restype().value
    return None


def _with_onerror(fn: Callable[..., Any], onerror: OnError, default: Any) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as exc:  # handed to onerror, as cffi does
            result = onerror(type(exc), exc, exc.__traceback__)
            return default if result is None else result

    return call


@explained(
    "exitsafe.ctypes.callback",
    "exitsafe.ctypes.callback(ctypes.CFUNCTYPE(None, ctypes.c_int), fn)",
    diagnose=first_argument(
        _is_prototype,
        "the first argument must be the prototype (a ctypes.CFUNCTYPE(restype, *argtypes) "
        "type), before the function",
    ),
    needs={"fn": "the Python function C calls"},
)
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
    from_releases: bool = False,
) -> Handle:
    """A C function pointer of type `proto` calling `fn`, kept alive while native code may
    call it, going quiet at teardown.

    Guard: once the registry's teardown has begun, every call returns `default` without
    calling `fn` (as [`exitsafe.guard`][exitsafe.guard] does), on whatever thread the native
    code calls from, except, while the teardown runs, the calls made inside a borrowed native
    call it waits for (a comparison function called by `qsort`); with `from_releases=True`,
    the calls a release makes on the teardown's own thread (a destructor callback such as
    SQLite's `xDestroy`) also still reach `fn`.

    Lifetime: the function pointer (and its libffi trampoline) is referenced by exitsafe
    until you call `release()` on the handle, after unregistering it from the C side;
    dropping the handle does not free it.  Pass the callback handle in the `depends_on` of
    the native objects that call it, so they are released first.

    Args:
        proto: the function type, a `CFUNCTYPE(...)` (or `WINFUNCTYPE`, `PYFUNCTYPE`).
        fn: the Python function C calls.
        default: what a call returns once teardown has begun; with `None` and a non-void
            result type, the type's zero.
        onerror: `onerror(exc_type, exc, tb)` receives exceptions raised by `fn` and returns
            the result for C (`None`: `default`); without it ctypes reports the exception
            and C receives a zeroed result.
        registry: the registry whose teardown silences it; `None`: the default registry.
        name: the display name in the ledger and the trace.
        depends_on: handles or objects that must outlive the callback (rarely needed).
        exit_policy: at teardown, `"leak"` (the default) keeps the function pointer alive
            for the rest of the process (even through interpreter finalization), since a
            native thread may still call it; `"release"` frees it in dependency order.
        from_releases: while the teardown runs, let through the calls made on its own
            thread by the releases it runs (see [`exitsafe.guard`][exitsafe.guard]).

    Returns:
        A handle of kind `"callback"`: pass `handle.raw` to C, `handle.release()` to
            retire it.

    Example:
        ```python
        LOGFN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p)
        cb = exitsafe.ctypes.callback(LOGFN, on_log)
        lib.set_logger(cb.raw)
        ```
    """
    if not _is_prototype(proto):
        if _is_prototype(fn):
            hint = ": the prototype comes before the function. Write callback(proto, fn)"
        elif isinstance(proto, _ctypes.CFuncPtr):
            hint = (
                ": that is a function pointer already made from a prototype (PROTO(fn)); "
                "pass the prototype itself, callback(PROTO, fn)"
            )
        elif isinstance(proto, str):
            hint = (
                ": a C type as a string is cffi's form; for ctypes write the type, such as "
                "ctypes.CFUNCTYPE(None, ctypes.c_int)"
            )
        else:
            hint = ", such as ctypes.CFUNCTYPE(None, ctypes.c_int)"
        raise TypeError(
            f"proto must be a ctypes function type made by CFUNCTYPE / WINFUNCTYPE, got "
            f"{describe(proto)}{hint}"
        )
    if not callable(fn):
        raise TypeError(not_a_function("fn", fn))
    if onerror is not None and not callable(onerror):
        raise TypeError(f"onerror must be callable or None, got {type(onerror).__name__}")
    reg = registry_arg(registry)
    parents = resolve(depends_on, reg, "depends_on")
    if default is None:
        default = _zero_result(getattr(proto, "_restype_", None))
    inner = fn if onerror is None else _with_onerror(fn, onerror, default)
    cfunc = proto(Guarded(inner, default, reg, from_releases=from_releases))
    return _ADAPTER.register_callback(reg, cfunc, fn, name, parents, exit_policy)


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` with every handle among `args` borrowed for the call and passed as
    its `raw` object.

    A handle cannot be released, nor torn down, in the middle of a native call that uses
    it: a release waits for the call to end, a teardown waits for it (bounded), and once a
    teardown has begun the call does not start on another thread (the thread is parked, or
    gets [`HandleClosedError`][exitsafe.HandleClosedError] if it is a non-daemon thread).
    See the threads page.  Handles are borrowed left to right, let go in reverse order,
    and a Ctrl-C anywhere in the call leaves none borrowed (as `with handle.borrow():`).

    Args:
        fn: the foreign function (a function of a `ctypes.CDLL`).
        *args: its arguments; each [`Handle`][exitsafe.Handle] among them is borrowed and
            replaced by its `raw`, the others are passed as they are.

    Returns:
        What `fn` returns.

    Raises:
        HandleClosedError: a handle argument was released or leaked, or teardown has begun
            and the calling thread is a non-daemon thread.

    Example:
        ```python
        exitsafe.ctypes.call(lib.device_run, device, 10)
        ```
    """
    try:
        return _call(fn, *args)
    except TypeError:
        if callable(fn):
            raise
        raise TypeError(not_a_foreign_function("exitsafe.ctypes.call", fn, args)) from None


@explained(
    "exitsafe.ctypes.borrowing",
    "exitsafe.ctypes.borrowing(lib)",
    needs={"lib": "the library, what ctypes.CDLL() returned"},
)
def borrowing(lib: object) -> BorrowingLibrary:
    """A view of `lib` whose functions borrow their handle arguments, as
    [`call`][exitsafe.ctypes.call] does.

    Args:
        lib: the library (a `ctypes.CDLL`).

    Returns:
        An object whose attributes are `lib`'s functions wrapped like `call`; other
            attributes are `lib`'s own.

    Raises:
        TypeError: `lib` cannot be a library: `None`, a number (a raw library handle has no
            functions to wrap), a library's name (a str or bytes: load it with
            `ctypes.CDLL` first), a container or a handle.

    Example:
        ```python
        blib = exitsafe.ctypes.borrowing(lib)
        blib.device_run(device, 10)   # device (a handle) is borrowed for the call
        ```
    """
    check_library(
        lib, "exitsafe.ctypes.borrowing()", "a library: a ctypes.CDLL (or PyDLL, WinDLL)"
    )
    return BorrowingLibrary(lib)


if speedups is not None:
    # The compiled core's track: the common case (an int address, or a c_void_p /
    # POINTER(T) instance read in place; a release function that needs no wrapping and,
    # with libraries pinned, whose pin this function found before; no other dependency; no
    # option but `kind` and `registry`) without a Python frame; anything else calls the
    # function above, which checks and explains everything.
    speedups.set_doc("ctypes", "track", track.__doc__ or "")
    _track_py = track
    track = speedups.setup_ctypes(  # the same function, compiled
        _track_py,
        _ADAPTER.pin_table(),
        _ADAPTER.release_pin_table(),
        _c.c_void_p,
        _ctypes._Pointer,
        _ctypes.CFuncPtr,
    )

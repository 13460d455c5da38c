"""exitsafe for cffi bindings: [`track`][exitsafe.cffi.track] pointers, [`pin`][exitsafe.cffi.pin]
libraries, guarded
[`callback`][exitsafe.cffi.callback] functions.

* [`track`][exitsafe.cffi.track] is the registry-aware counterpart of ``ffi.gc(ptr, release)``:
  it owns a cdata pointer (ABI or API mode) and calls ``release(ptr)``
  exactly once, in dependency order, or never when the handle is leaked.
  It never attaches ``ffi.gc`` to the pointer, so nothing frees it from a
  finalizer during interpreter shutdown.
* [`pin`][exitsafe.cffi.pin] holds a library returned by ``ffi.dlopen`` loaded while
  anything depending on it lives, and ``ffi.dlclose``-s it after the last
  dependent (libraries go last at teardown), or never under a leak policy.
* [`callback`][exitsafe.cffi.callback] makes an ``ffi.callback`` whose Python side returns a
  default once teardown began, and keeps its cdata alive for as long as
  native code may call it.

Each returns an [`exitsafe.Handle`][exitsafe.Handle], not a cdata: ``handle.raw`` is the
cdata to pass to C, and raises [`HandleClosedError`][exitsafe.HandleClosedError] once the
handle was released, so a use after free becomes a Python exception instead
of a crash; [`handle_of`][exitsafe.cffi.handle_of] maps a cdata (any cdata with the same address)
back to its handle.  The [adapters page](../adapters.md) says why, with before/after
examples.

This module does not import cffi: it works on the ``ffi`` and ``lib``
objects you pass.  Thread rules: every function may be called from any
thread; a release or close runs on the thread dropping the last owner, or
on the teardown thread.
"""

from __future__ import annotations

import sys

from ._adapter import Adapter, BorrowingLibrary, LibraryInfo, check_library
from ._adapter import call as _call
from ._adopt import handle_of as _handle_of
from ._adopt import registry_arg
from ._core import speedups
from ._guard import Guarded
from ._handle import Handle
from ._lookup import resolve
from ._usage import (
    cffi_function_type,
    describe,
    explained,
    ffi_first,
    not_a_foreign_function,
    not_a_function,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from types import TracebackType
    from typing import Any, Callable, Optional

    from ._registry import ExitPolicy, Registry

    OnError = Callable[[type[BaseException], BaseException, Optional[TracebackType]], object]

__all__ = ["borrowing", "call", "callback", "handle_of", "pin", "pinned", "track"]


#: cdata classes whose memory cffi owns and frees itself.
_OWNED = {
    "__CDataOwn": "it was allocated by ffi.new() / ffi.new_handle() and cffi frees it",
    "__CDataOwnGC": "it was allocated by ffi.new() and cffi frees it",
    "__CDataFromBuf": "it comes from ffi.from_buffer() and points into a Python buffer",
    "__CDataGCP": (
        "it is the result of ffi.gc(), whose destructor would free it a second time; "
        "track the plain pointer C returned instead of wrapping it in ffi.gc()"
    ),
}


#: Classes whose instances passed `_check_ffi` once (cffi's FFI classes, usually two).
_FFI_TYPES: set[type] = set()


def _check_ffi(ffi: Any, usage: str) -> None:
    if type(ffi) in _FFI_TYPES:
        return
    for attr in ("typeof", "cast", "NULL", "CData"):
        if not hasattr(ffi, attr):
            raise TypeError(
                f"expected a cffi FFI object as first argument (the ffi = cffi.FFI() whose "
                f"cdef() declared the library), got {describe(ffi)}. Write {usage}"
            )
    if len(_FFI_TYPES) < 64:
        _FFI_TYPES.add(type(ffi))


class _CffiAdapter(Adapter):
    name = "cffi"

    def __init__(self) -> None:
        super().__init__()
        self._uintptr: Any = None
        #: What `pointer_address` learnt from pointers it accepted: the class of plain
        #: (not cffi-owned) cdata of cffi's C backend, and the C types of those pointers.
        self._plain_cdata: Optional[type] = None
        self._pointer_ctypes: set[object] = set()

    def pointer_address(self, ptr: object, ffi: Any) -> int:
        plain = self._plain_cdata
        if type(ptr) is plain and ffi.CData is plain:
            # A cdata of a class and a C type accepted before: only NULL is left to check.
            backend = sys.modules["_cffi_backend"]  # loaded: ptr is one of its objects
            if backend.typeof(ptr) in self._pointer_ctypes:
                address = int(backend.cast(self._uintptr, ptr))
                if address:
                    return address
        return self._checked_address(ptr, ffi)

    def _checked_address(self, ptr: object, ffi: Any) -> int:
        """Every check of a `track` pointer, with its error; remembers what passed."""
        if not isinstance(ptr, ffi.CData):
            hint = (
                "; an address as an int is ffi.cast('void *', address)"
                if isinstance(ptr, int) and not isinstance(ptr, bool)
                else ""
            )
            raise TypeError(f"track() needs a cffi cdata pointer, got {describe(ptr)}{hint}")
        ctype = ffi.typeof(ptr)
        if ctype.kind != "pointer":
            if ctype.kind == "function":
                hint = (
                    "a function pointer is not an owned object: call the function for the "
                    "pointer it returns (track(ffi, lib.thing_create(), lib.thing_free)), "
                    "and pin its library with exitsafe.cffi.pin(ffi, lib)"
                )
            elif ctype.kind == "array":
                hint = "arrays are owned by cffi"
            else:
                hint = "track the pointer C returned, not a value"
            raise TypeError(f"track() needs a pointer; got cdata of type {ctype.cname!r}: {hint}")
        reason = _OWNED.get(type(ptr).__name__)
        if reason is not None:
            raise TypeError(f"track(): the cdata {ptr!r} must not be tracked: {reason}")
        if ptr == ffi.NULL:
            raise ValueError(
                f"track() got a NULL pointer ({ctype.cname!r}): there is nothing to own "
                f"(did the C call fail?)"
            )
        address = int(ffi.cast("uintptr_t", ptr))
        self._learn(ptr, ffi, ctype, address)
        return address

    def _learn(self, ptr: object, ffi: Any, ctype: Any, address: int) -> None:
        """Remember an accepted pointer's class and C type, for cffi's C backend only."""
        backend = sys.modules.get("_cffi_backend")
        if backend is None or ffi.CData is not getattr(backend, "_CDataBase", None):
            return  # another backend (cffi's ctypes one): always the full checks
        if type(ptr) is not ffi.CData or backend.typeof(ptr) is not ctype:
            return
        if self._uintptr is None:
            self._uintptr = backend.new_primitive_type("uintptr_t")
        if len(self._pointer_ctypes) >= 4096:  # a program makes few pointer types
            self._pointer_ctypes.clear()
        self._pointer_ctypes.add(ctype)
        self._plain_cdata = ffi.CData
        if speedups is not None:  # the compiled track checks the same, from now on
            speedups.cffi_learned(
                ffi.CData, self._uintptr, backend.typeof, backend.cast,
                getattr(backend, "_C_API", None), ptr, address,
            )

    def describe_library(self, lib: object, ffi: Any) -> LibraryInfo:
        if lib is None or isinstance(lib, (str, bytes, int)):
            hint = (
                f"; load it first: exitsafe.cffi.pin(ffi, ffi.dlopen({lib!r}))"
                if isinstance(lib, (str, bytes)) else ""
            )
            raise TypeError(
                f"pin() needs the library object returned by ffi.dlopen(), got {lib!r}{hint}"
            )
        if isinstance(lib, ffi.CData):
            raise TypeError(
                f"pin() needs the library object returned by ffi.dlopen(), got {describe(lib)}"
            )
        if not self.is_library(lib):
            raise TypeError(
                f"pin() needs the library object returned by ffi.dlopen(), got "
                f"{type(lib).__name__}"
            )
        base: Optional[int] = None
        loader_ref: Optional[int] = None
        found = _own_file(ffi, lib)
        if found is not None:
            from ._native import loader_ref as take_loader_ref

            base = found[0]
            loader_ref = take_loader_ref(path=found[1]) if found[1] else None
        return LibraryInfo(id(lib), _library_label(lib), ffi.dlclose, loader_ref, base)

    def is_library(self, lib: object) -> bool:
        """An ``ffi.dlopen`` result: what ``ffi.dlclose`` closes (``__cffi_close__``), or
        the ``Lib`` of a compiled cffi module."""
        if callable(getattr(lib, "__cffi_close__", None)):
            return True
        backend = sys.modules.get("_cffi_backend")
        lib_type = getattr(backend, "Lib", None) if backend is not None else None
        return isinstance(lib_type, type) and isinstance(lib, lib_type)

    def pin_for_release(self, release: object, ffi: Any, registry: Registry) -> Optional[Handle]:
        if not self.has_pins() or not isinstance(release, ffi.CData):
            return None
        try:
            if ffi.typeof(release).kind != "function":
                return None
        except TypeError:
            return None
        return self.pin_of_function(release, int(ffi.cast("uintptr_t", release)), registry)

    def lookup(self, obj: object, registry: Registry) -> Optional[Handle]:
        found = self.pin_of(obj, registry)
        if found is not None or type(obj).__module__ != "_cffi_backend":
            return found
        backend = sys.modules.get("_cffi_backend")  # loaded, since obj is one of its objects
        if backend is None or not isinstance(obj, backend._CDataBase):
            return None
        try:
            if backend.typeof(obj).kind != "pointer":
                return None
            if self._uintptr is None:
                self._uintptr = backend.new_primitive_type("uintptr_t")
            address = int(backend.cast(self._uintptr, obj))
        except (TypeError, ValueError):
            return None
        return self.tracked(address) if address else None


_ADAPTER = _CffiAdapter()


#: How many declared symbols of a library `_own_file` looks at when it must count.
_SYMBOLS_COUNTED = 256


def _own_file(ffi: Any, lib: object) -> Optional[tuple[int, Optional[str]]]:
    """``(base address, path)`` of the file ``lib``'s own code is in, or ``None``.

    It is the file the name given to ``ffi.dlopen`` was loaded from (ABI mode, on POSIX),
    when none of ``lib``'s declared functions and variables is known yet or one of them is
    in it.  Else it is found from their addresses, though not every one of them is in
    that file: the loader resolves a name in the library's dependencies too (a binding
    that declares ``free`` next to the library's functions gets libc's).  So it is the file
    most of them are in (an API-mode module's ``lib``, Windows), the first one on a tie.
    """
    from ._native import module_of_address, module_of_loaded

    own = module_of_loaded(_dlopen_name(lib))
    counts: dict[int, int] = {}
    files: dict[int, tuple[int, Optional[str]]] = {}
    for address in _symbol_addresses(ffi, lib):
        found = module_of_address(address)
        if found is None:
            continue
        if own is not None and found[0] == own[0]:
            return found
        counts[found[0]] = counts.get(found[0], 0) + 1
        files.setdefault(found[0], found)
        if sum(counts.values()) >= _SYMBOLS_COUNTED:
            break
    if not counts:
        return own  # (nothing declared yet: the file it was opened from)
    return files[max(counts, key=counts.__getitem__)]  # (max keeps the first on a tie)


def _dlopen_name(lib: object) -> Optional[str]:
    """The name ``lib`` was opened with by cffi's ``ffi.dlopen`` (ABI mode), if known: cffi
    names the class of the object it returns ``FFILibrary_<name>``."""
    class_name = type(lib).__name__
    prefix = "FFILibrary_"
    return class_name[len(prefix) :] if class_name.startswith(prefix) else None


def _symbol_addresses(ffi: Any, lib: object) -> Iterator[int]:
    """The addresses of ``lib``'s declared functions and variables, in name order."""
    for symbol in dir(lib):
        if symbol.startswith("__"):
            continue
        try:
            addr = ffi.addressof(lib, symbol)
        except (AttributeError, TypeError, ValueError, NotImplementedError):
            continue  # a type, or a name declared but missing from the file
        if not isinstance(addr, ffi.CData):
            continue  # an integer constant (#define, enum): its value, not an address
        try:
            yield int(ffi.cast("uintptr_t", addr))
        except (TypeError, ValueError):
            continue


def _library_label(lib: object) -> str:
    text = repr(lib)
    start = text.find("'")
    end = text.rfind("'")
    if 0 <= start < end:
        return text[start + 1 : end]  # "<Lib object for '/path/libx.so'>"
    return type(lib).__name__


@explained(
    "exitsafe.cffi.track",
    "exitsafe.cffi.track(ffi, ptr, release)",
    diagnose=ffi_first("the pointer and its release"),
    needs={"release": "the function that frees the pointer, such as lib.thing_free"},
)
def track(
    ffi: Any,
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
    """Own the native object `ptr` points to: `release(ptr)` runs exactly once, or never.

    Use instead of `ffi.gc(ptr, release)`, with the lifetime rules of
    [`Registry.track`][exitsafe.Registry.track]: the release runs when the handle's last
    owner lets go (`handle.release()`, `with handle:`, or its garbage collection) and no
    dependent is alive; at teardown in dependency order (children first, libraries last);
    never twice; never after teardown (a late drop is a recorded no-op), on the thread
    dropping the last owner or the teardown's.  If `track` raises, `ptr` is still yours,
    but for a Ctrl-C as the handle is handed over (see `Registry.track`): an `except
    KeyboardInterrupt` around `track` must not release `ptr` itself.

    Args:
        ffi: the `FFI` instance the pointer comes from; kept referenced by the handle.
        ptr: a cdata pointer returned by C, from ABI or API mode.
        release: the release function, usually `lib.thing_free`; called as `release(ptr)`.
        registry: the registry to own it in; `None`: the default registry.
        lib: the library whose code `release` runs; when it is pinned with
            [`pin`][exitsafe.cffi.pin] in the same registry the handle depends on the pin,
            so the library is closed only after this release ran.  `None`: found
            automatically when `release` is a function of an `ffi.dlopen` library.
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
        A [`Handle`][exitsafe.Handle] holding one owner, not a cdata: `handle.raw` is the
            cdata to pass to C, and raises [`HandleClosedError`][exitsafe.HandleClosedError]
            once the handle was released.

    Raises:
        ValueError: `ptr` is NULL.
        TypeError: `ptr` is not a pointer, is owned by cffi (`ffi.new`, `ffi.from_buffer`)
            or is an `ffi.gc` result; or `release` is not callable.
        AlreadyTrackedError: the pointer is already tracked (by this or the ctypes adapter).

    Example:
        ```python
        lib = ffi.dlopen("libgpu.so")
        pin = exitsafe.cffi.pin(ffi, lib)
        dev = exitsafe.cffi.track(ffi, lib.device_create(), lib.device_free, kind="device")
        buf = exitsafe.cffi.track(ffi, lib.buffer_create(dev.raw), lib.buffer_free,
                                  kind="buffer", depends_on=[dev])
        ```
    """
    if type(ffi) not in _FFI_TYPES:  # (_check_ffi's own first test, on the hot path)
        _check_ffi(ffi, "exitsafe.cffi.track(ffi, ptr, release)")
    return _ADAPTER.track(  # (positions only: the cheapest call, see Adapter.track)
        ffi, ptr, release, registry, lib, kind, depends_on, exit_policy, name, timeout,
        affinity,
    )


@explained(
    "exitsafe.cffi.handle_of",
    "exitsafe.cffi.handle_of(ptr)",
    needs={"obj": "the cdata pointer (or library) whose handle to find"},
)
def handle_of(obj: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live handle for a cdata pointer (by address) or a pinned library, or `None`.

    `handle.raw` goes from a handle to its cdata; this goes back, e.g. when C hands a
    pointer to a callback and you need its handle.

    Args:
        obj: a cdata pointer (any cdata with the same address finds the handle, whatever
            its C type) or an `ffi.dlopen` library.
        registry: where to look; `None`: the default registry.

    Returns:
        The live handle, or `None` (never tracked, or released or leaked since).
    """
    return _handle_of(obj, registry=registry)


@explained(
    "exitsafe.cffi.pinned",
    "exitsafe.cffi.pinned(lib)",
    needs={"lib": "the library, what ffi.dlopen() returned"},
)
def pinned(lib: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live pin of `lib` in `registry`, or `None`.

    A pin whose owners all released it (while handles still depend on it) is no longer
    returned: it ends with its last dependent, and new handles do not depend on it.

    Args:
        lib: an `ffi.dlopen` result.
        registry: where to look; `None`: the default registry.

    Returns:
        The pin made by [`pin`][exitsafe.cffi.pin], or `None`.
    """
    return _ADAPTER.pin_of(lib, registry_arg(registry))


@explained(
    "exitsafe.cffi.pin",
    "exitsafe.cffi.pin(ffi, lib)",
    diagnose=ffi_first("the library"),
    needs={"lib": "the library, what ffi.dlopen() returned"},
)
def pin(
    ffi: Any,
    lib: object,
    *,
    registry: Optional[Registry] = None,
    close: bool = True,
    name: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Handle:
    """Hold a library returned by `ffi.dlopen` loaded while anything depending on it lives.

    Handles tracked with [`track`][exitsafe.cffi.track] whose release function comes from
    `lib` depend on the pin automatically.  The library's file is the one `ffi.dlopen` loaded
    (or, when that cannot be told, the one most of `lib`'s declared functions are in): a
    function declared in the same `cdef` but resolved in another library, such as libc's
    `free`, does not depend on this pin.  The pin keeps `lib` referenced (so cffi does not
    `dlclose` it when the object is collected) and takes one more loader reference on the
    library file (`dlopen(RTLD_NOLOAD)`; `GetModuleHandleExW` on Windows), so even an
    explicit `ffi.dlclose(lib)` by somebody else cannot unmap the code a dependent's release
    still needs.  The pin is referenced by exitsafe until it is released: dropping it does
    not unpin.  Under a leak policy nothing is closed.

    Args:
        ffi: the `FFI` instance that loaded `lib`.
        lib: the library, an `ffi.dlopen` result.
        registry: the registry to pin it in; `None`: the default registry.
        close: `True` (the default): `ffi.dlclose(lib)` runs, and the extra reference is
            dropped, when the pin is released: explicitly (deferred until its last dependent
            is released) or at teardown, where libraries go last.  In the process's exit,
            while another thread may still be running (any thread with a Python frame,
            not parked), the library is kept loaded instead, as with `False`, and
            exitsafe's logger says so: a thread inside one of its functions would crash
            when its code is unmapped.  `False`: the library stays loaded for the life of
            the process.
        name: the display name; default `"library#<n>"`.
        timeout: seconds the close may take at teardown before it is abandoned; `None`: the
            registry's step timeout.

    Returns:
        The pin, a handle of kind `"library"`.  Pinning the same `lib` again in the same
            registry returns the existing pin with one more owner.

    Raises:
        ValueError: `lib` is already pinned in this registry with a different `close`.
        TypeError: `lib` is not an `ffi.dlopen` library, or `close` is not a bool.
    """
    _check_ffi(ffi, "exitsafe.cffi.pin(ffi, lib)")
    return _ADAPTER.pin(ffi, lib, registry=registry, close=close, name=name, timeout=timeout)


# ---------------------------------------------------------------------- callbacks


def _zero_result(ffi: Any, ctype: Any) -> tuple[Any, object]:
    """The zero of a callback type's result (value, owner to keep alive)."""
    result = ctype.result
    if result.kind == "void":
        return None, None
    if result.kind in ("struct", "union"):
        owner = ffi.new(ffi.getctype(result, "*"))
        return owner[0], owner
    return ffi.new(ffi.getctype(result, "*"))[0], None


_SAME = object()


@explained(
    "exitsafe.cffi.callback",
    "exitsafe.cffi.callback(ffi, 'void(*)(int)', fn)",
    diagnose=ffi_first("the C type and the function"),
    needs={"ctype": "the C function pointer type, such as 'void(*)(int)'",
           "fn": "the Python function C calls"},
)
def callback(
    ffi: Any,
    ctype: object,
    fn: Callable[..., Any],
    *,
    default: Any = None,
    onerror: Optional[OnError] = None,
    error: Any = _SAME,
    registry: Optional[Registry] = None,
    name: Optional[str] = None,
    depends_on: Iterable[object] = (),
    exit_policy: ExitPolicy = "leak",
    from_releases: bool = False,
) -> Handle:
    """`ffi.callback(ctype, fn)` guarded for exit and kept alive while C may call it.

    Guard: once the registry's teardown has begun, every call returns `default` without
    calling `fn` (as [`exitsafe.guard`][exitsafe.guard] does), on whatever thread the native
    code calls from, except, while the teardown runs, the calls made inside a borrowed native
    call it waits for (a comparison function called by `qsort`); with `from_releases=True`,
    the calls a release makes on the teardown's own thread (a destructor callback such as
    SQLite's `xDestroy`) also still reach `fn`.

    Lifetime: the callback cdata (and its libffi trampoline) is referenced by exitsafe until
    you release the handle; dropping the handle does not free it, since C may still hold
    the pointer.  Pass the handle in the `depends_on` of the native objects that call it,
    so they are released first.  For API-mode `extern "Python"` functions use
    [`exitsafe.guard`][exitsafe.guard] inside the `@ffi.def_extern()` function instead.

    Args:
        ffi: the `FFI` instance.
        ctype: the C function pointer type (`"void(*)(int, const char *)"` or a ctype
            object); a function type (`"void(int, const char *)"`, or a typedef of one)
            stands for its pointer type, as in `ffi.callback`.
        fn: the Python function C calls.
        default: what a call returns once teardown has begun; with `None` and a non-void
            result type, the type's zero (`0`, `0.0`, `ffi.NULL`...), so the value always
            converts.
        onerror: passed to `ffi.callback`: a function receiving the exception when `fn`
            raises.
        error: passed to `ffi.callback`: the result when `fn` raises; default: `default`.
        registry: the registry whose teardown silences it; `None`: the default registry.
        name: the display name in the ledger and the trace.
        depends_on: handles or objects that must outlive the callback (rarely needed).
        exit_policy: at teardown, `"leak"` (the default) keeps the cdata alive for the rest
            of the process, even through interpreter finalization (a native thread may still
            call it); `"release"` frees it in dependency order.
        from_releases: while the teardown runs, let through the calls made on its own
            thread by the releases it runs (see [`exitsafe.guard`][exitsafe.guard]).

    Returns:
        A handle of kind `"callback"`: pass `handle.raw` (the callback cdata) to C; call
            `handle.release()` to retire it once the C side no longer calls it.

    Example:
        ```python
        cb = exitsafe.cffi.callback(ffi, "void(*)(int, const char *)", on_log)
        lib.set_logger(cb.raw)
        ctx = exitsafe.cffi.track(ffi, lib.ctx_create(), lib.ctx_free, depends_on=[cb])
        ```
    """
    _check_ffi(ffi, "exitsafe.cffi.callback(ffi, 'void(*)(int)', fn)")
    if not callable(fn):
        if callable(ctype) and isinstance(fn, (str, ffi.CType)):
            raise TypeError(
                f"fn must be callable, got {describe(fn)}: the C type comes before the "
                f"function. Write exitsafe.cffi.callback(ffi, {fn!r}, fn)"
            )
        raise TypeError(not_a_function("fn", fn))
    if onerror is not None and not callable(onerror):
        raise TypeError(f"onerror must be callable or None, got {type(onerror).__name__}")
    ctype_obj = ctype if isinstance(ctype, ffi.CType) else cffi_function_type(ffi, ctype)
    if ctype_obj.kind != "function":
        raise TypeError(
            f"callback() needs a function pointer type such as 'int(*)(int)', "
            f"got {ctype_obj.cname!r}"
        )
    reg = registry_arg(registry)
    parents = resolve(depends_on, reg, "depends_on")
    owner: object = None
    if default is None:
        default, owner = _zero_result(ffi, ctype_obj)
    guarded = Guarded(
        fn if owner is None else _KeepOwner(fn, owner), default, reg, from_releases=from_releases
    )
    cdata = ffi.callback(
        ctype_obj, guarded, error=default if error is _SAME else error, onerror=onerror
    )
    return _ADAPTER.register_callback(reg, cdata, fn, name, parents, exit_policy)


class _KeepOwner:
    """Calls ``fn``; references the memory behind a struct default value."""

    __slots__ = ("fn", "owner")

    def __init__(self, fn: Callable[..., Any], owner: object) -> None:
        self.fn = fn
        self.owner = owner

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` with every handle among `args` borrowed for the call and passed as
    its `raw` object.

    A handle cannot be released, nor torn down, in the middle of a native call that uses
    it: a release waits for the call to end, a teardown waits for it (bounded), and once a
    teardown has begun the call does not start on another thread (parked; see the threads
    page).  Borrowed left to right, let go in reverse order; a Ctrl-C leaves none borrowed.

    Args:
        fn: the foreign function (a function of an `ffi.dlopen` library).
        *args: its arguments; each [`Handle`][exitsafe.Handle] among them is borrowed and
            replaced by its `raw`, the others are passed as they are.

    Returns:
        What `fn` returns.

    Raises:
        HandleClosedError: a handle argument was released or leaked, or teardown has begun
            and the calling thread is a non-daemon thread.

    Example:
        ```python
        exitsafe.cffi.call(lib.device_run, device, 10)
        ```
    """
    try:
        return _call(fn, *args)
    except TypeError:
        if callable(fn):
            raise
        raise TypeError(not_a_foreign_function("exitsafe.cffi.call", fn, args)) from None


@explained(
    "exitsafe.cffi.borrowing",
    "exitsafe.cffi.borrowing(lib)",
    needs={"lib": "the library, what ffi.dlopen() returned"},
)
def borrowing(lib: object) -> BorrowingLibrary:
    """A view of `lib` whose functions borrow their handle arguments, as
    [`call`][exitsafe.cffi.call] does.

    Args:
        lib: the library (an `ffi.dlopen` result).

    Returns:
        An object whose attributes are `lib`'s functions wrapped like `call`; other
            attributes are `lib`'s own.

    Raises:
        TypeError: `lib` cannot be a library: `None`, a number, a library's name (a str or
            bytes: load it with `ffi.dlopen` first), a container, a handle, a cdata or the
            `ffi` object itself.

    Example:
        ```python
        blib = exitsafe.cffi.borrowing(lib)
        blib.device_run(device, 10)   # device (a handle) is borrowed for the call
        ```
    """
    refuse = None
    if lib is not None and not _ADAPTER.is_library(lib):
        if callable(getattr(lib, "dlopen", None)) and callable(getattr(lib, "cdef", None)):
            refuse = "the ffi object itself; pass the library its dlopen() returned"
        elif type(lib).__module__ == "_cffi_backend":
            refuse = f"a cdata ({type(lib).__name__}); pass the library ffi.dlopen() returned"
    check_library(
        lib,
        "exitsafe.cffi.borrowing()",
        "a library: the object ffi.dlopen() returns (or the lib of a compiled cffi module)",
        refuse,
    )
    return BorrowingLibrary(lib)


if speedups is not None:
    # The compiled core's track: the common case (a pointer of a cdata class and C type
    # the adapter accepted before; no pinned library, or the pin this release function
    # was found to need before; no other dependency; no option but `kind` and `registry`)
    # without a Python frame; anything else calls the function above, which checks and
    # explains everything.
    speedups.set_doc("cffi", "track", track.__doc__ or "")
    _track_py = track
    track = speedups.setup_cffi(  # the same function, compiled
        _track_py, _ADAPTER.pin_table(), _ADAPTER.release_pin_table(), _FFI_TYPES,
        _ADAPTER._pointer_ctypes,
    )

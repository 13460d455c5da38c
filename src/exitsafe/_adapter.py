"""What [`exitsafe.cffi`][exitsafe.cffi] and [`exitsafe.ctypes`][exitsafe.ctypes] share: one adapter
base.

An `Adapter` turns FFI objects into handles: native pointers (tracked by
address, so one native object cannot be owned twice and
[`exitsafe.lowlevel.handle_of`][exitsafe.lowlevel.handle_of] can map a pointer coming back from
C to its handle), loaded libraries (pinned: kept referenced, kept
mapped by one extra loader reference, closed after every dependent), and callbacks (kept alive while
native code may call them, silenced at teardown).

A subclass says only what differs between FFIs: how a pointer is validated
(`Adapter.pointer_address`), how a library is identified and closed
(`Adapter.describe_library`), which pin a release function's code lives in
(`Adapter.pin_for_release`), and how a pointer is recognised in
`Adapter.lookup`.  Like contextlib's ``_BaseExitStack`` under ``ExitStack`` and
``AsyncExitStack``.

The tables here are guarded by exitsafe's one lock (see `exitsafe._sync`); release
and close functions run outside it.
"""

from __future__ import annotations

import functools
from _weakref import ref as _weakref
from types import BuiltinFunctionType, FunctionType, MethodType

from . import _sync
from ._adopt import hook_after_leak, registry_arg
from ._closing import loaded_steps
from ._core import speedups
from ._errors import ExitsafeError, HandleClosedError
from ._gate import Borrow, borrow_enter, borrow_exit
from ._handle import Handle
from ._lookup import register_lookup, resolve
from ._pointers import addresses, already_tracked, pointer_release, undo_claimed_track
from ._process import keep_forever, process_ending
from ._registry import default_registry, state_of
from ._releases import first_error
from ._report import log_if_loaded
from ._threads import running_elsewhere, thread_name
from ._usage import describe, release_not_callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional

    from ._registry import ExitPolicy, Registry

#: id(callback function pointer) -> its live handle, held strongly until it is retired.
_callbacks: dict[int, Handle] = {}



class LibraryInfo:
    """How an adapter identifies one loaded library (see `Adapter.describe_library`).

    ``key``: the pin table's key; ``label``: for the pin's default name;
    ``close``: closes the library when the pin is released (or ``None``);
    ``loader_ref``: an extra loader reference taken on the file (or ``None``);
    ``base``: the library's base address, to find it from a function (or ``None``).
    """

    __slots__ = ("base", "close", "key", "label", "loader_ref")

    def __init__(
        self,
        key: object,
        label: str,
        close: Optional[Callable[[Any], object]],
        loader_ref: Optional[int],
        base: Optional[int],
    ) -> None:
        self.key = key
        self.label = label
        self.close = close
        self.loader_ref = loader_ref
        self.base = base

    def drop_loader_ref(self) -> None:
        """Drop the extra loader reference, if any is still held (once: it is forgotten
        first, so a second call, or an interrupt after the first, closes nothing twice)."""
        ref, self.loader_ref = self.loader_ref, None
        if ref is not None:
            from ._native import close_library_handle

            close_library_handle(ref)


class _Pin:
    """One pinned library: the object, its pin handle, its base address, its close flag and
    the pin's release function."""

    __slots__ = ("base", "close", "closer", "handle", "lib")

    def __init__(
        self, lib: object, handle: Handle, base: Optional[int], close: bool,
        closer: _LibraryCloser,
    ) -> None:
        self.lib = lib
        self.handle = handle
        self.base = base
        self.close = close
        self.closer = closer


class _LibraryCloser:
    """The release function of a pin: forget the pin, close the library (or keep it)."""

    __slots__ = ("adapter", "close", "info", "key")

    def __init__(self, adapter: Adapter, info: LibraryInfo, close: bool, key: object) -> None:
        self.adapter = adapter
        self.info = info
        self.close = close
        self.key = key  # its entry in the adapter's pin table

    def __call__(self, lib: object) -> None:
        info = self.info
        # Another live pin of the same object (a newer one, or one of another registry)
        # keeps it open: its own close closes it later.
        still_pinned = self.adapter._forget_pin(self.key, self, lib)
        if not self.close or (not still_pinned and _threads_may_be_inside(lib)):
            # Never unloaded by exitsafe's doing: keep the object and one extra loader
            # reference for the life of the process (one per library, however many
            # pins of it ended: a program pinning and releasing it in a loop keeps one).
            kept = (lib,)
            if self.adapter._kept_open.setdefault(info.key, kept) is kept:  # (atomic)
                keep_forever(lib)
            else:
                info.drop_loader_ref()
            return
        try:
            if info.close is not None and not still_pinned:
                info.close(lib)
        finally:
            info.drop_loader_ref()


class _CallbackRelease:
    """The release function of a callback handle: retire it."""

    __slots__ = ("after", "hook", "key")

    def __init__(self, key: int) -> None:
        self.key = key
        self.after: Optional[Any] = None
        self.hook: Optional[Handle] = None

    def __call__(self, raw: object) -> None:
        _callbacks.pop(self.key, None)  # one atomic pop
        after, self.after = self.after, None
        if after is not None:
            after.obj = None
        hook, self.hook = self.hook, None
        if hook is not None:
            hook.release()  # cancel the keep-forever hook; a no-op during teardown


class Adapter:
    """The shared half of an FFI adapter (see the module documentation)."""

    #: The adapter's name in messages ("cffi", "ctypes").
    name = ""

    def __init__(self) -> None:
        #: (library key, id(registry)) -> the pin of a library in a registry, held
        #: strongly: a pin lives until released explicitly or by the teardown, not when its
        #: handle is dropped.  Written under exitsafe's lock.
        self._pins: dict[object, _Pin] = {}
        #: For the compiled tracks: what `track` found for a foreign function given
        #: without `lib=` while libraries were pinned, by id(release): ``(release, (pin,))``
        #: (the compiled path checks the pin is still live, owned and of the registry asked
        #: for), or ``(release, (), id(registry state))``: no pin of its library in that registry.
        #: Emptied whenever a pin is made or forgotten, and beyond 1,024 entries; written
        #: under exitsafe's lock, only when no pin changed since the lookup (see
        #: `_remember_pin`).
        self._release_pins: dict[int, tuple[object, ...]] = {}
        #: Incremented, under exitsafe's lock, each time the pin table changes.
        self._pins_changed = 0
        #: Libraries whose close=False pin ended, by pin key -> (the library,): kept loaded
        #: for ever with one loader reference (see _LibraryCloser).
        self._kept_open: dict[object, tuple[object]] = {}
        #: id(foreign function) -> (that function, base address of its library or None):
        #: what `pin_of_function` found with the loader, at most 1,024 functions.
        self._function_bases: dict[int, tuple[object, Optional[int]]] = {}
        register_lookup(self.lookup)

    # ------------------------------------------------------------------ per FFI

    def pointer_address(self, ptr: object, ctx: Any) -> int:
        """Validate a pointer argument of ``track``; return its address.

        Raises ``TypeError`` for what is not an owned pointer, ``ValueError`` for NULL.
        """
        raise NotImplementedError

    def describe_library(self, lib: object, ctx: Any) -> LibraryInfo:
        """Validate a library argument of ``pin``; say how to identify and close it."""
        raise NotImplementedError

    def pin_for_release(
        self, release: object, ctx: Any, registry: Registry
    ) -> Optional[Handle]:
        """The live pin of the library ``release``'s code lives in, if any."""
        raise NotImplementedError

    def release_call(self, release: Callable[[Any], object]) -> Callable[[Any], object]:
        """The function to call with the raw pointer (a subclass may adapt arguments)."""
        return release

    def lookup(self, obj: object, registry: Registry) -> Optional[Handle]:
        """The live handle ``obj`` stands for in ``registry`` (for
        [`exitsafe.lowlevel.handle_of`][exitsafe.lowlevel.handle_of])."""
        return self.pin_of(obj, registry)

    # ------------------------------------------------------------------ pointers

    @staticmethod
    def tracked(address: int) -> Optional[Handle]:
        """The live handle owning ``address``, tracked by either adapter, or ``None``."""
        return addresses.get(address)

    def track(
        self,
        ctx: Any,
        ptr: object,
        release: Callable[[Any], object],
        registry: Optional[Registry],
        lib: object,
        kind: str,
        depends_on: Iterable[object],
        exit_policy: Optional[ExitPolicy],
        name: Optional[str],
        timeout: Optional[float],
        affinity: Optional[str] = None,
    ) -> Handle:
        """Own the native object at ``ptr``: the body of ``exitsafe.<ffi>.track``.  (No
        keyword-only parameter, and the public functions call it with positions only:
        CPython makes the cheapest call then, which the pure-Python core's hot path
        feels.)"""
        if not callable(release):
            raise TypeError(release_not_callable(
                ptr, release,
                f"exitsafe.{self.name}.track("
                + ("ffi, ptr, release)" if self.name == "cffi" else "ptr, release)"),
            ))
        address = self.pointer_address(ptr, ctx)
        reg = default_registry() if registry is None else registry_arg(registry)
        parents = (
            () if type(depends_on) is tuple and not depends_on
            else resolve(depends_on, reg, "depends_on")
        )
        if lib is not None and not self.is_library(lib):
            raise TypeError(
                f"lib must be a library of {self.name} or None, got {type(lib).__name__}"
            )
        pin = self.pin_of(lib, reg) if lib is not None else None
        if pin is None and self._pins:  # (the pin of release's own library, if any)
            pins_changed = self._pins_changed
            pin = self.pin_for_release(_unwrapped(release), ctx, reg)
            if (
                speedups is not None  # (only the compiled track reads what is remembered)
                and self.has_pins()
                and self.is_foreign_function(release, ctx)
                and not _sync.reentered()  # (then reg.track refuses, naming track())
            ):
                # (before the claim: queued work run on leaving its section may raise, and
                # nothing may be registered then)
                self._remember_pin(release, pin, reg, pins_changed)
        deps = (*parents, pin) if pin is not None and pin not in parents else parents
        while True:
            claimed: list[object] = []
            handle = None
            bound = False
            try:  # (the claim inside: an interrupt anywhere leaves nothing claimed or tracked)
                addresses.claim(address, None, already_tracked, claimed)
                releaser = pointer_release(self.release_call(release), address, (ctx, lib))
                handle = reg.track(  # (by keyword: a subclass may take **options)
                    ptr,
                    releaser,
                    kind=kind,
                    depends_on=deps,
                    exit_policy=exit_policy,
                    name=name,
                    timeout=timeout,
                    affinity=affinity,
                )
                releaser.handle = _weakref(handle)
                addresses.bind(address, handle)
                bound = True
                return handle
            except BaseException as exc:
                if claimed:
                    undo_claimed_track(handle, address, bound)
                # The library's pin lost its last owner on another thread since it was
                # found: as a track just after that, the handle depends on no pin.
                if (not isinstance(exc, HandleClosedError) or handle is not None
                        or deps is parents or pin is None or pin.owners):
                    raise
            deps = parents

    def is_foreign_function(self, release: object, ctx: Any) -> bool:
        """Whether the compiled track looks ``release`` up among the pins found by release
        function (it does not for a Python function, builtin or method, which belongs to
        no library)."""
        return not isinstance(release, (FunctionType, BuiltinFunctionType, MethodType))

    def _remember_pin(
        self, release: object, pin: Optional[Handle], registry: Registry, pins_changed: int
    ) -> None:
        """Remember for the compiled track which pin (or none) a track of ``release`` in
        ``registry`` depends on, unless the pin table changed since ``pins_changed`` was
        read (then a pin made meanwhile could be missed: the next track looks again)."""
        entry = (release, (pin,)) if pin is not None else (release, (), id(state_of(registry)))

        def remember() -> None:
            if self._pins_changed != pins_changed:
                return
            found = self._release_pins
            if len(found) >= 1024:
                found.clear()
            found[id(release)] = entry

        _sync.locked("pin()", remember)

    # ------------------------------------------------------------------ libraries

    def pin_table(self) -> dict[object, _Pin]:
        """The pins by key, for the compiled core (it takes the Python path whenever
        there is any).  Never replaced."""
        return self._pins

    def pin_of(self, lib: object, registry: Registry) -> Optional[Handle]:
        """The live pin of ``lib`` in ``registry``, or ``None``."""
        entry = self._live_pin(lib, registry)
        return None if entry is None else entry.handle

    def _live_pin(self, lib: object, registry: Registry) -> Optional[_Pin]:
        return self._live_pin_among(self.names_of_library(lib), registry)

    def _live_pin_among(self, names: tuple[object, ...], registry: Registry) -> Optional[_Pin]:
        """The live, owned pin in ``registry`` of one of ``names`` (a library's names, see
        `names_of_library`).  Reads the table only: may run inside a section."""
        for name in names:
            entry = self._pins.get((self.pin_key(name), id(registry)))
            if entry is None or (entry.lib is not name and not isinstance(name, int)):
                continue
            handle = entry.handle
            if handle.registry is registry and handle.state == "live" and handle.owners:
                return entry
        return None

    def names_of_library(self, lib: object) -> tuple[object, ...]:
        """``lib`` and the other objects a pin of the same library may have been made on,
        in the order they are looked up (ctypes: a ``CDLL`` and its raw handle)."""
        return (lib,)

    def same_library(self, pinned: object, lib: object) -> bool:
        """Whether the pin of ``pinned`` closes what a pin of ``lib`` would close (one
        library reference): then only the last of them to end closes it."""
        return pinned is lib

    def is_library(self, lib: object) -> bool:
        """Whether ``lib`` is a library object this adapter can pin (checked before a pin,
        and for ``track(lib=)``)."""
        raise NotImplementedError

    def pin_key(self, lib: object) -> object:
        """The pin table's key for ``lib`` (its identity, or a raw handle's value)."""
        return ("handle", lib) if isinstance(lib, int) and not isinstance(lib, bool) else id(lib)

    def pin_of_function(
        self, fn: object, address: int, registry: Registry
    ) -> Optional[Handle]:
        """The live pin in ``registry`` (as `pins_at`) of the library whose code the
        foreign function ``fn``, at ``address``, lies in.  The library is asked of the
        loader (``dladdr``) once per function, then remembered while ``fn`` lives."""
        cached = self._function_bases.get(id(fn))
        if cached is not None and cached[0] is fn:
            base = cached[1]
        else:
            from ._native import module_of_address

            found = module_of_address(address) if address else None
            base = found[0] if found is not None else None
            if len(self._function_bases) >= 1024:
                self._function_bases.clear()
            self._function_bases[id(fn)] = (fn, base)
        return None if base is None else self.pins_at(base, registry)

    def pins_at(self, base: int, registry: Registry) -> Optional[Handle]:
        """The live pin in ``registry`` of the library whose base address is ``base`` (as
        `pin_of`, one that still has an owner: a released pin waiting for its dependents
        takes no new one)."""
        for entry in tuple(self._pins.values()):
            handle = entry.handle
            if (
                entry.base == base
                and handle.registry is registry
                and handle.state == "live"
                and handle.owners
            ):
                return handle
        return None

    def has_pins(self) -> bool:
        return bool(self._pins)

    def _forget_pin(self, key: object, closer: _LibraryCloser, lib: object) -> bool:
        """Forget the pin whose release function is ``closer`` (a newer pin of the same
        library in the same registry may have taken its key); whether another pin of the
        object ``lib`` is still in the table."""

        def forget() -> bool:
            entry = self._pins.get(key)
            if entry is not None and entry.closer is closer:
                del self._pins[key]
            self._pins_changed += 1
            self._release_pins.clear()
            return any(self.same_library(other.lib, lib) for other in self._pins.values())

        return _sync.locked("pin()", forget)

    def release_pin_table(self) -> dict[int, tuple[object, ...]]:
        """The pins found for release functions, for the compiled core.  Never replaced."""
        return self._release_pins

    def pin(
        self,
        ctx: Any,
        lib: object,
        *,
        registry: Optional[Registry],
        close: bool,
        name: Optional[str],
        timeout: Optional[float],
    ) -> Handle:
        """Hold ``lib`` loaded while anything depending on it lives: ``exitsafe.<ffi>.pin``."""
        if not isinstance(close, bool):
            raise TypeError(
                f"close must be True or False, got {describe(close)}: the pin closes the library "
                f"itself (close=True, the default), or keeps it loaded (close=False)"
            )
        reg = registry_arg(registry)
        names = self.names_of_library(lib)
        existing = self._live_pin_among(names, reg)
        if existing is not None:  # before describe_library, which takes a loader reference
            return self._share_pin(existing, close)
        info = self.describe_library(lib, ctx)
        key = (info.key, id(reg))
        closer = _LibraryCloser(self, info, close, key)
        try:
            handle = reg.pin(
                lib,
                close=closer,
                name=name if name is not None else f"library {info.label}",
                timeout=timeout,
            )
        except BaseException:  # refused (a bad name or timeout, re-entry): nothing pinned
            info.drop_loader_ref()
            raise
        if handle.state == "live":

            def add() -> Optional[_Pin]:
                # (another thread may have pinned the same library since the lookup above)
                found = self._live_pin_among(names, reg)
                if found is None:
                    self._pins[key] = _Pin(lib, handle, info.base, close, closer)
                    self._pins_changed += 1
                    self._release_pins.clear()  # a release function may be of this library
                return found

            existing = _sync.locked("pin()", add)
            if existing is not None:
                self._undo_pin(handle, info)
                return self._share_pin(existing, close)
        elif info.loader_ref is not None:
            keep_forever(info.loader_ref)  # registered after teardown: keep it mapped
        return handle

    def _share_pin(self, existing: _Pin, close: bool) -> Handle:
        """``pin()`` of a library already pinned in the registry: that pin, one owner more."""
        if existing.close != close:
            raise ValueError(
                f"{existing.handle.name!r} is already pinned with close={existing.close}; "
                f"cannot pin it again with close={close}"
            )
        return existing.handle.retain()

    def _undo_pin(self, handle: Handle, info: LibraryInfo) -> None:
        """Undo a pin made while another thread pinned the same library: detached (it
        never closes anything), its loader reference dropped."""
        try:
            handle.detach()
        except ExitsafeError:  # the teardown began meanwhile and took it (RegistryClosedError):
            return  # it closes nothing while the other pin lives (see _LibraryCloser)
        info.drop_loader_ref()

    # ------------------------------------------------------------------ callbacks

    def register_callback(
        self,
        reg: Registry,
        cfunc: object,
        fn: Callable[..., Any],
        name: Optional[str],
        depends_on: tuple[Handle, ...],
        exit_policy: ExitPolicy,
    ) -> Handle:
        """Track a callback function pointer: kept referenced until it is released, kept
        alive for ever (even through interpreter finalization) if its handle leaks."""
        from ._native import immortalize

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
            immortalize(cfunc)  # registered after teardown began: C may hold it for ever
            return handle
        _callbacks[key] = handle  # one atomic store
        releaser.after, releaser.hook = hook_after_leak(
            reg, handle, cfunc, immortalize, f"keep {handle.name} alive if leaked"
        )
        return handle


# ---------------------------------------------------------------------- automatic borrows


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call the native function ``fn`` with ``args``, each handle among them borrowed for
    the duration of the call and passed as its ``raw`` object.

    The counterpart of .NET's ``SafeHandle`` marshaling: a handle cannot be released
    in the middle of a native call that uses it (a release request waits for the call
    to end; a teardown waits for it, bounded), and once a teardown has begun the call
    does not start on another thread (parked; `HandleClosedError` on a non-daemon one).
    A handle no longer usable raises `HandleClosedError` before the call.  Handles are
    borrowed left to right and let go in reverse order.
    """
    for arg in args:
        if isinstance(arg, Handle):
            break
    else:
        return fn(*args)
    # Each `Borrow` is listed before it is entered, and ended only if open; each is ended
    # even if ending another raised: a Ctrl-C anywhere leaves none open (those one at the
    # ending loop's own steps skips, their finalizers end).
    borrows: list[tuple[Handle, Borrow]] = []
    raws = list(args)
    try:
        for index, arg in enumerate(args):
            if not isinstance(arg, Handle):  # (not "if handle: ...": CPython 3.12 and 3.13
                continue  # leave that loop's backward jump out of the try, and a Ctrl-C
            borrow = Borrow(arg)  # there skipped the borrows' end:
            borrows.append((arg, borrow))  # tests/adversarial/test_try_coverage.py)
            raws[index] = borrow_enter(arg, borrow)
        return fn(*raws)
    finally:
        error = None
        for handle, borrow in reversed(borrows):
            try:
                borrow_exit(handle, borrow)
            except BaseException as exc:  # (ended all the same: the others end too)
                error = first_error(error, exc)
        if error is not None:
            try:
                raise error  # (an interrupt first, else the first: a release failed)
            finally:
                error = None  # (no frame of ours keeps it)


#: What can never be a library whose attributes are functions: refused by `borrowing()`.
_NOT_LIBRARIES = (
    str, bytes, bytearray, memoryview, int, float, complex, list, tuple, dict, set, frozenset,
)


def check_library(lib: object, function: str, accepts: str, refuse: Optional[str] = None) -> None:
    """Refuse at once an argument of ``function`` (an adapter's ``borrowing()``) that cannot
    be a library: ``None``, a number, a string or bytes (a library's *name*: it must be
    loaded first), a container, a handle, or whatever the adapter says (``refuse``: why, or
    ``None``).  The TypeError names what ``function`` accepts (``accepts``).  Any other
    object is taken as a library: its callable attributes are the functions wrapped."""
    reason = refuse
    if lib is None or isinstance(lib, _NOT_LIBRARIES) or isinstance(lib, Handle):
        reason = f"{lib!r} ({type(lib).__name__})"
        if isinstance(lib, (str, bytes)):
            reason += "; a library's name must be loaded first"
    if reason is not None:
        raise TypeError(f"{function} needs {accepts}, got {reason}")


class BorrowingLibrary:
    """A view of a library whose functions go through `call`.

    ``lib = exitsafe.cffi.borrowing(ffi.dlopen(...))``: ``lib.device_run(dev, 10)`` with
    ``dev`` a handle borrows it for the call.  Attributes that are not callable (a
    constant, a global variable) are returned as they are.  Made by the adapters'
    ``borrowing()``, which check the library first (see `check_library`).
    """

    __slots__ = ("_functions", "_library")

    def __init__(self, library: object) -> None:
        self._library = library
        self._functions: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._functions[name]
        except KeyError:
            pass
        value = getattr(self._library, name)
        if not callable(value):
            return value
        wrapped = _Borrowing(value)
        self._functions[name] = wrapped
        return wrapped

    def __repr__(self) -> str:
        return f"<exitsafe borrowing view of {self._library!r}>"


class _Borrowing:
    """One function of a `BorrowingLibrary`."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return call(self.fn, *args)


def _unwrapped(release: object) -> object:
    """The function a wrapped release calls: through ``__wrapped__`` (``exitsafe.checked``,
    ``functools.wraps``) and ``functools.partial``, a few levels at most.  A lambda or a plain
    function calling the library shows nothing to follow (``track(lib=)`` names the library)."""
    for _ in range(8):
        inner = getattr(release, "__wrapped__", None)
        if inner is None and isinstance(release, functools.partial):
            inner = release.func
        if inner is None or inner is release:
            break
        release = inner
    return release


def _threads_may_be_inside(lib: object) -> bool:
    """In the process's exit, whether another thread may still be running code of ``lib``:
    then its pin keeps it loaded, as with ``close=False``, since unmapping the library under
    a thread inside one of its functions (a call with no handle to borrow, such as a
    constructor) crashes it.  Said on exitsafe's logger.  Outside an exit, never."""
    if not process_ending():
        return False
    steps = loaded_steps()  # (the teardown's idle step workers run no code of the library)
    workers = steps.idle_worker_idents() if steps is not None else set()
    running = [ident for ident in running_elsewhere() if ident not in workers]
    if not running:
        return False
    logger = log_if_loaded()
    if logger is not None:
        logger.info(
            "exitsafe: %r kept loaded at exit: %s still running and may be inside it",
            lib,
            ", ".join(repr(thread_name(ident)) for ident in running),
        )
    return True

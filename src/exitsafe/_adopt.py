"""Third-party objects in the handle graph: [`adopt`][exitsafe.adopt],
[`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit].

Bindings you do not own often wrap a native handle in a Python object with a
``close()`` method and a ``__del__`` that calls native code.  At interpreter
shutdown that ``__del__`` may run after the library it calls into was
unloaded, after the module globals it uses were cleared, or after a parent
object it depends on was freed.  Two ways out, each one call:

* [`adopt`][exitsafe.adopt] puts the object into the handle graph: exitsafe owns its
  end and calls its close method exactly once, in dependency order, when you
  release the returned handle or at teardown (before the interpreter starts
  finalizing modules), or never when its exit policy leaks it.
* [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit] leaves the object alone while
  the program runs and, when teardown begins, sets the attribute holding its native handle to
  a null value, so the object's own ``__del__`` / ``close()`` does nothing
  later (the fix of the WinML ``EpCatalog`` crash, as one call).
  [`neutralize`][exitsafe.lowlevel.neutralize] does the same immediately.

[`handle_of`][exitsafe.lowlevel.handle_of] finds the handle exitsafe keeps for an object (a
handle, an adopted object, a [`exitsafe.NativeObject`][exitsafe.NativeObject], a pinned library or
a tracked pointer of [`exitsafe.cffi`][exitsafe.cffi] / [`exitsafe.ctypes`][exitsafe.ctypes]); every
``depends_on`` / ``before`` / ``after`` argument of this module and of the FFI
adapters accepts any of those.

Thread rules: every function here may be called from any thread.  The close
method of an adopted object runs on the thread that drops the handle's last
owner, or on the thread running the teardown; neutralization at exit runs on
the teardown thread.

`adopt` is public in `exitsafe`; `neutralize_at_exit`, `neutralize` and `handle_of` in
`exitsafe.lowlevel` (escape hatches for objects exitsafe does not own, and a lookup).
"""

from __future__ import annotations

from _weakref import ref as _weakref

from . import _early, _quiesce, _users
from ._claims import ClaimTable
from ._errors import NeutralizeError
from ._handle import Handle
from ._lookup import find, register_lookup, resolve
from ._process import process_ending
from ._registry import Registry, default_registry
from ._report import log
from ._usage import explained

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Callable, Optional, Union

    from ._registry import ExitPolicy

    Attrs = Union[str, Sequence[str]]

__all__ = [
    "adopt",
    "handle_of",
    "neutralize",
    "neutralize_at_exit",
]


def _adopted_lookup(obj: object, registry: Registry) -> Optional[Handle]:
    """The adoption handle of ``obj`` (see `exitsafe._lookup`)."""
    return _adopted.get(id(obj), obj)


#: id(obj) -> the live adoption handle of obj (obj is referenced, so ids cannot be reused).
_adopted = ClaimTable(strong=True)
register_lookup(_adopted_lookup)
#: The hooks of neutralize_at_exit objects collected since the last call: appended by the
#: weak reference's callback (from a collection, any thread, maybe inside a section: an
#: atomic append, no lock), cancelled by the next call.  Each hook is handled once, so a
#: call costs O(1) amortized however many objects are pending (each call swept them all).
_collected: list[Handle] = []


def registry_arg(registry: Optional[Registry]) -> Registry:
    """The ``registry=`` argument of a public function: a Registry, or the default one."""
    if registry is None:
        return default_registry()
    if not isinstance(registry, Registry):
        raise TypeError(
            f"registry must be an exitsafe.Registry or None, got {type(registry).__name__}"
        )
    return registry


def handle_of(obj: object, *, registry: Optional[Registry] = None) -> Optional[Handle]:
    """The live exitsafe handle standing for `obj` in `registry`, or `None`.

    Handles that were released or leaked are not returned.  Thread-safe; never calls
    native code.

    Args:
        obj: a [`Handle`][exitsafe.Handle] (returned as is), an object adopted with
            [`adopt`][exitsafe.adopt], any object with an `__exitsafe_handle__` attribute
            (such as a [`NativeObject`][exitsafe.NativeObject]), or, once
            [`exitsafe.cffi`][exitsafe.cffi] / [`exitsafe.ctypes`][exitsafe.ctypes] are
            imported, a library pinned with their `pin` or a pointer tracked with their
            `track` (looked up by address).
        registry: where to look; `None`: the default registry.

    Returns:
        The handle, or `None` when exitsafe has no live handle for `obj` there.
    """
    found = find(obj, registry_arg(registry))
    return found  # type: ignore[return-value]


# ---------------------------------------------------------------------- neutralization


def _attr_names(attr: Attrs, what: str = "attr") -> tuple[str, ...]:
    """The attribute names ``attr`` gives: one name, or a sequence (list, tuple...) of
    names; anything else (a number, ``None``, bytes, an empty sequence) is a TypeError
    naming the argument ``what``."""
    if isinstance(attr, str):
        names: tuple[object, ...] = (attr,)
    elif isinstance(attr, (bytes, bytearray)) or not hasattr(type(attr), "__iter__"):
        names = ()
    else:
        names = tuple(attr)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(
            f"{what} must be an attribute name (a non-empty str) or a sequence of names, "
            f"got {attr!r}"
        )
    return names  # type: ignore[return-value]


def _lookup_descriptor(cls: type, name: str) -> object:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


_MISSING = object()


def _check_settable(obj: object, name: str) -> None:
    """Raise [`NeutralizeError`][exitsafe.lowlevel.NeutralizeError] now if ``obj.name = null``
    cannot work later."""
    cls = type(obj)
    what = f"{cls.__qualname__}.{name}"
    desc = _lookup_descriptor(cls, name)
    if isinstance(desc, property):
        if desc.fset is None:
            raise NeutralizeError(f"cannot neutralize {what}: it is a read-only property")
        return  # calling the setter now could run native code; trust it
    is_data_descriptor = desc is not _MISSING and hasattr(type(desc), "__set__")
    try:
        current = getattr(obj, name)
    except AttributeError:
        raise NeutralizeError(
            f"cannot neutralize {what}: the object has no such attribute (is the name right?)"
        ) from None
    custom_setattr = cls.__setattr__ is not object.__setattr__
    if not (is_data_descriptor or custom_setattr):
        # A plain attribute: assignment works iff the instance has a __dict__ or a slot.
        if hasattr(obj, "__dict__"):
            return
        raise NeutralizeError(
            f"cannot neutralize {what}: it is a class attribute and instances of "
            f"{cls.__qualname__} have no __dict__ to shadow it"
        )
    # A slot, a C-level descriptor or a custom __setattr__ (frozen objects): write the
    # current value back, which changes nothing and shows whether assignment works.
    try:
        setattr(obj, name, current)
    except (AttributeError, TypeError) as exc:
        raise NeutralizeError(
            f"cannot neutralize {what}: assignment is refused "
            f"({type(exc).__name__}: {exc}); the object may be frozen or the attribute read-only"
        ) from exc


def neutralize(obj: object, attr: Attrs = "_handle", null: Any = None) -> dict[str, Any]:
    """Set `obj.<attr> = null` now, so that the object's own `close()` / `__del__` does nothing.

    Works for `__slots__` attributes and properties with a setter.  Not atomic with respect
    to other threads using `obj`.  To do it at exit instead, use
    [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit].

    Args:
        obj: the object of another library.
        attr: the attribute holding the native handle, or a sequence of such names.
        null: the value to set (what the object's finalizer reads as "already closed").

    Returns:
        The previous values (name -> value), which you now own: exitsafe does not release
            them.

    Raises:
        NeutralizeError: an attribute is missing, a read-only property, or the object
            refuses assignment; nothing was changed.
    """
    names = _attr_names(attr)
    for name in names:
        _check_settable(obj, name)
    old: dict[str, Any] = {}
    for name in names:
        old[name] = getattr(obj, name)
        setattr(obj, name, null)
    return old


class _Neutralizer:
    """The hook of one [`neutralize_at_exit`][exitsafe.lowlevel.neutralize_at_exit] call."""

    __slots__ = ("get", "names", "null")

    def __init__(self, get: Callable[[], object], names: tuple[str, ...], null: Any) -> None:
        self.get = get
        self.names = names
        self.null = null

    def __call__(self) -> None:
        obj = self.get()
        if obj is None:
            return  # collected while the program ran: its own finalizer already ran
        for name in self.names:
            setattr(obj, name, self.null)


def _strong(obj: object) -> Callable[[], object]:
    return lambda: obj


class _OnCollected:
    """The callback of a neutralize_at_exit object's weak reference: queues its hook (held
    weakly: the registry owns it) for cancelling."""

    __slots__ = ("hook",)

    def __init__(self) -> None:
        self.hook: Optional[Callable[[], Optional[Handle]]] = None

    def __call__(self, _ref: object) -> None:
        hook = self.hook() if self.hook is not None else None
        if hook is not None:
            _collected.append(hook)


def _cancel_collected() -> None:
    """Cancel the hooks of neutralize_at_exit objects collected meanwhile (once each)."""
    while _collected:
        try:
            hook = _collected.pop()
        except IndexError:  # another thread took the last one
            return
        hook.release()  # a no-op once teardown began


def neutralize_at_exit(
    obj: object,
    attr: Attrs = "_handle",
    null: Any = None,
    *,
    registry: Optional[Registry] = None,
    before: Iterable[object] = (),
    after: Iterable[object] = (),
    name: Optional[str] = None,
) -> Handle:
    """At teardown, set `obj.<attr> = null` so the object's own `__del__` / `close()` becomes
    a no-op; the native object is leaked on purpose and the OS reclaims it.

    This is the fix of the `EpCatalog` crash at exit (`catalog._handle = None` after use) as
    one call, made at the time you create the object.  The checks happen now, not at exit.

    The object is referenced weakly when it supports weak references (if it is collected
    before exit, its own finalizer runs then, while everything is loaded, and nothing
    happens at exit); otherwise strongly, so it then lives until exit.  The neutralization
    is a teardown hook that runs on the teardown thread; it also runs in a forked child's
    exit.

    Args:
        obj: the object of another library whose finalizer must not run late.
        attr: the attribute holding the native handle, or a sequence of such names.
        null: the value to set.
        registry: the registry whose teardown runs the hook; `None`: the default registry.
        before: handles or objects exitsafe knows (see [`handle_of`][exitsafe.lowlevel.handle_of])
            that must still be alive when the hook runs.  Without `before` / `after` the hook
            runs among the first steps of the teardown.
        after: handles or objects exitsafe knows that must be released before the hook runs.
        name: the hook's display name in the ledger and the trace.

    Returns:
        The hook's handle: `release()` on it cancels the neutralization.

    Raises:
        NeutralizeError: the attribute is missing or read-only, or the object is frozen.

    Example:
        ```python
        catalog = thirdparty.EpCatalog()
        exitsafe.lowlevel.neutralize_at_exit(catalog, "_handle")
        ```
    """
    names = _attr_names(attr)
    for attr_name in names:
        _check_settable(obj, attr_name)
    reg = registry_arg(registry)
    before_h = resolve(before, reg, "before")
    after_h = resolve(after, reg, "after")
    on_collected = _OnCollected()
    try:
        get: Callable[[], object] = _weakref(obj, on_collected)
    except TypeError:
        get = _strong(obj)  # (lives until exit: its hook is never cancelled)
    _cancel_collected()
    hook_name = name if name is not None else f"neutralize {type(obj).__qualname__}.{names[0]}"
    hook = reg.on_teardown(
        _Neutralizer(get, names, null), before=before_h, after=after_h, name=hook_name,
        in_child="run",  # pure Python: a forked child neutralizes its copy too
    )
    on_collected.hook = _weakref(hook)
    return hook


# ---------------------------------------------------------------------- adoption


class _AfterLeak:
    """A teardown hook that runs ``action(obj)`` if ``handle`` ended leaked."""

    __slots__ = ("action", "handle_ref", "obj")

    def __init__(self, obj: object, action: Callable[[Any], object]) -> None:
        self.obj: object = obj
        self.action = action
        self.handle_ref: Optional[Callable[[], Optional[Handle]]] = None

    def __call__(self) -> None:
        obj, self.obj = self.obj, None
        handle = self.handle_ref() if self.handle_ref is not None else None
        if obj is not None and handle is not None and handle.state == "leaked":
            self.action(obj)


def hook_after_leak(
    registry: Registry, handle: Handle, obj: object, action: Callable[[Any], object], name: str
) -> tuple[_AfterLeak, Handle]:
    """Register a hook running after ``handle`` at teardown: ``action(obj)`` if it leaked."""
    after = _AfterLeak(obj, action)
    after.handle_ref = _weakref(handle)
    hook = registry.on_teardown(after, after=[handle], name=name, in_child="run")
    return after, hook


class _Adoption:
    """The release function of an adopted object: close it, forget it."""

    __slots__ = ("after", "close", "early", "handle_ref", "hook", "key", "use_wait")

    def __init__(
        self, close: Union[str, Callable[[Any], object], None], key: int,
        timeout: Optional[float] = None,
    ) -> None:
        self.close = close
        self.key = key
        #: How long the exit teardown waits for other threads to stop using the object
        #: (half the close's own bound, so that the wait ends first).
        self.use_wait = _users.USE_WAIT if timeout is None else min(_users.USE_WAIT, timeout / 2)
        self.after: Optional[_AfterLeak] = None
        self.hook: Optional[Handle] = None
        #: The early hook closing it in the early phase (``adopt(early=True)``).
        self.early: Optional[Handle] = None
        #: The adoption's handle, weakly (it references this function).
        self.handle_ref: Optional[Callable[[], Optional[Handle]]] = None

    def __call__(self, obj: object) -> None:
        if self.close is not None and process_ending() and _users.in_a_teardown():
            # The exit's teardown: never close it under a thread still using it (raises
            # InUse, recorded leaked_in_use; the entry and the leak hooks stay).
            # (close=None runs no code of the object: letting go of it is always safe.)
            try:
                _users.wait_until_unused(obj, self.use_wait, park=True)
            except _users.InUse:
                # Nor neutralize it: that write would land under the thread too (its
                # next call would hand the null value to the library).
                after = self.after
                if after is not None:
                    after.obj = None
                raise
        # Its entry goes: the table must not keep a closed object alive (nor one adopted
        # again meanwhile be forgotten: the entry is dropped only if it is this handle's).
        ref = self.handle_ref
        _adopted.forget(self.key, ref() if ref is not None else None)
        close = self.close
        try:
            if isinstance(close, str):
                getattr(obj, close)()
            elif close is not None:
                close(obj)
        except BaseException:
            # The handle ends release_failed (a leak): neutralize now, so the object's own
            # finalizer does not retry the failed close later.
            self._neutralize()
            raise
        else:
            # Closed: neutralize too, so a finalizer that is not idempotent (one that reads
            # back or releases again whatever its state) finds nothing to act on.
            self._neutralize()
            if close is not None and (process_ending() or _early.ran()):
                # Closed by the exit (its early phase or its teardown): the object's own
                # __del__ must not act again during finalization, when what it needs may
                # be gone.  (A __del__ that was the close: below.)
                if close is not getattr(type(obj), "__del__", None):
                    _finalized(obj, quiet=True)
        finally:
            if close is not None and close is getattr(type(obj), "__del__", None):
                _finalized(obj)  # (its __del__ was the close: never a second time)
            after, self.after = self.after, None
            if after is not None:
                after.obj = None
            hook, self.hook = self.hook, None
            if hook is not None:
                hook.release()  # cancel the leak hook; a no-op during teardown
            early, self.early = self.early, None
            if early is not None:
                early.release()  # cancel the early close; a no-op once it ran


    def _neutralize(self) -> None:
        after = self.after
        if after is not None and after.obj is not None:
            after.action(after.obj)


class _EarlyClose:
    """The early hook of ``adopt(early=True)``: release the adoption's handle."""

    __slots__ = ("handle_ref",)

    def __init__(self, handle: Handle) -> None:
        self.handle_ref = _weakref(handle)

    def __call__(self) -> None:
        handle = self.handle_ref()
        if handle is not None and handle.state == "live":
            handle.release()


def _check_arguments(obj: object, close: object, early: object) -> None:
    """`adopt`'s checks of ``obj``, ``close`` and ``early``, in this order."""
    if obj is None:
        raise TypeError("adopt() needs an object, got None")
    if not isinstance(early, bool):
        raise TypeError(f"early must be True or False, got {type(early).__name__}")
    if isinstance(obj, Handle):
        raise TypeError("adopt() takes a third-party object, not an exitsafe Handle")
    if isinstance(close, str):
        method = getattr(obj, close, None)
        if method is None or not callable(method):
            raise TypeError(
                f"adopt(): {type(obj).__qualname__} has no callable {close!r} method; "
                f"pass close=<method name> or close=<callable taking the object>"
            )
    elif close is not None and not callable(close):
        raise TypeError(f"close must be a method name, a callable or None, got {close!r}")


@explained(
    "exitsafe.adopt",
    "exitsafe.adopt(obj, close='close')",
    needs={"obj": "the object of another library to close at exit"},
)
def adopt(
    obj: object,
    *,
    close: Union[str, Callable[[Any], object], None] = "close",
    kind: Optional[str] = None,
    depends_on: Iterable[object] = (),
    exit_policy: Optional[ExitPolicy] = None,
    name: Optional[str] = None,
    registry: Optional[Registry] = None,
    neutralize: Optional[Attrs] = None,
    null: Any = None,
    timeout: Optional[float] = None,
    affinity: Optional[str] = None,
    early: bool = False,
) -> Handle:
    """Hand `obj`, an object of another library, to exitsafe: it is closed exactly once, in
    dependency order, when its handle is released or at teardown, or leaked by policy.

    Ownership: exitsafe references `obj` strongly until its handle is released or teardown
    decides its fate, so the object is not collected (and its own `__del__` does not run)
    earlier, even if you drop both `obj` and the handle.  Release it with `handle.release()`
    (the close method runs on that thread once no dependent is alive), or leave it to
    teardown.  After a close the object's own `__del__` usually finds it closed and does
    nothing.  Once the *exit* has closed it (its early phase or its teardown), that
    `__del__` does not run at all: the object's class, if its `__del__` is a Python
    function, is swapped for a twin subclass of the same name whose `__del__` does nothing
    (`isinstance` still holds, `type(obj) is cls` no longer does), so a finalizer that is
    not idempotent cannot act again during finalization, when what it needs may be gone.
    Whatever else that `__del__` does is skipped too (a spool file it removes stays): put
    it in the close (`close=` a callable).  A class whose own hooks would see the twin
    (an `__init_subclass__` in its MRO, a metaclass other than `type` or `ABCMeta`) is
    left as it is, as is every class while the program runs (a close it asks for).

    Threads at exit: the exit teardown never closes `obj` under another thread that may be
    using it.  A thread still alive whose Python stack refers to `obj` (a local, a module
    global its code names, or what those reach in up to three steps through attributes,
    items of built-in containers and bound methods), and that exitsafe does not already
    hold back (`quiesce()`, a
    parked thread), is first *parked* if it is the program's own (its target is the
    program's code, not a library's): at its next safe point, as
    [`quiesce`][exitsafe.quiesce] parks a thread (never inside a library or a native call,
    never where it holds a lock its code refers to, never inside a method of `obj`), for
    good; then `obj` is closed.  Such
    a thread also counts when it runs code of the installed package `obj` comes from, or
    refers to any object of it (an h5py `Dataset` of an adopted `File`).  Any other such
    thread, or one not parked within 1 s (or half of `timeout`), makes the close wait that
    long; if the thread still refers to it then, `obj` is not closed and its handle ends
    `leaked_in_use`, the thread named in the ledger and in a warning.  A parked thread never
    runs again: one that an `atexit` callback registered before `import exitsafe` joins
    would never end (stop it in an [`on_early_exit`][exitsafe.on_early_exit] hook).  A
    release the program makes itself is never held back.

    Args:
        obj: the object to own.
        close: the name of a method to call (default `"close"`; checked now), a callable
            `close(obj)`, or `None` (exitsafe only orders and references the object;
            releasing the handle just lets go of it).  `type(obj).__del__` (for a class
            with no close method) runs the destructor once: once it has run, the object's
            class is swapped for a twin subclass of the same name whose `__del__` does
            nothing, so the interpreter does not run it again when it collects the object.
        kind: the label in the ledger and the trace; `None`: the object's class name.
            `"library"` makes it go last at teardown.
        depends_on: handles or objects exitsafe knows (see
            [`handle_of`][exitsafe.lowlevel.handle_of]) that must outlive `obj`; `obj` can in
            turn be named in other handles' `depends_on`.
        exit_policy: `"release"`, `"leak"` or a callable policy, as for
            [`Registry.track`][exitsafe.Registry.track]; `None`: the registry's default.
        name: the display name; default `"<kind>#<n>"`.
        registry: the registry to own it in; `None`: the default registry.
        neutralize: an attribute name (or names, checked now) to set to `null` once
            exitsafe is done with the object: right after its close (on the thread that
            closed it), or when the handle ends leaked (`exit_policy="leak"`,
            `EXITSAFE_AT_EXIT=leak`, a timeout, a failed close, a leaked dependent), after
            the handle's step; so that the object's own finalizer does nothing afterwards,
            during interpreter finalization included (one that is not idempotent, that
            reads back or releases again, included).  Not when it ends `leaked_in_use`
            because another thread still uses it, nor while threads that
            [`quiesce`][exitsafe.quiesce] could not park are running: the write would
            land under that thread (its next call would pass `null` to the library), so
            the object is left as it is.  `None`: nothing is neutralized.
        null: the value `neutralize` sets.
        timeout: seconds the close may take at teardown before it is abandoned and the
            handle leaked; `None`: the registry's step timeout.
        affinity: `"creator"` or `"main"` runs the close only on that thread (GL contexts,
            some GPU and GUI objects): a close due elsewhere is queued for that thread's
            next exitsafe call or [`run_pending()`][exitsafe.lowlevel.run_pending]; see
            [`Registry.track`][exitsafe.Registry.track].  `None`: any thread.
        early: close it in the *early phase* of the exit (with the
            [`on_early_exit`][exitsafe.on_early_exit] hooks: before the interpreter joins
            its threads and before every `atexit` callback, those a library registered at
            import included), not in the teardown: for an executor or a connection that a
            library's own exit handler would otherwise wait on.  The close runs then if no
            dependent of it is alive, else once the last one is released.

    Returns:
        The handle standing for `obj`, holding one owner.

    Raises:
        AlreadyTrackedError: `obj` already has a live adoption handle
            (`err.handle.retain()` shares it).
        TypeError: the close method is missing or not callable.
        NeutralizeError: an attribute named in `neutralize` cannot be neutralized.

    Example:
        ```python
        conn = exitsafe.adopt(thirdparty.connect(), close="close", depends_on=[ctx])
        ```
    """
    _check_arguments(obj, close, early)
    names = _attr_names(neutralize, "neutralize") if neutralize is not None else ()
    for attr_name in names:
        _check_settable(obj, attr_name)
    reg = registry_arg(registry)
    parents = resolve(depends_on, reg, "depends_on")
    if kind is None:
        kind = type(obj).__name__
    key = id(obj)

    def describe(_key: object, existing: Optional[Handle]) -> str:
        what = f"as {existing.name!r}" if existing is not None else "by another thread"
        return (
            f"{type(obj).__qualname__} object is already adopted {what}; "
            f"use exitsafe.lowlevel.handle_of(obj).retain() to share ownership"
        )

    _adopted.claim(key, obj, describe)
    adoption = _Adoption(close, key, timeout)
    try:
        handle = reg.track(
            obj,
            adoption,
            kind=kind,
            depends_on=parents,
            exit_policy=exit_policy,
            name=name,
            timeout=timeout,
            affinity=affinity,
        )
    except BaseException:
        _adopted.cancel(key)
        raise
    adoption.handle_ref = _weakref(handle)
    _adopted.bind(key, handle)
    if handle.state != "live":
        # Registered after teardown began: leaked at once and never closed; neutralize
        # now so the object's own finalizer cannot call native code later.
        for attr_name in names:
            setattr(obj, attr_name, null)
        return handle
    if early:
        adoption.early = reg.on_early_exit(_EarlyClose(handle), name=f"close {handle.name}")
    if names:
        null_value = null

        def _neutralize(target: object) -> None:
            if _quiesce.still_running():
                return  # (threads the quiescing left running may use it: left as it is)
            for attr_name in names:
                setattr(target, attr_name, null_value)

        adoption.after, adoption.hook = hook_after_leak(
            reg, handle, obj, _neutralize, f"neutralize {handle.name} if leaked"
        )
    return handle


#: class -> its twin whose ``__del__`` does nothing (`_finalized`), made once per class.
_finalized_twins: dict[type, type] = {}


def _no_finalizer(self: object) -> None:
    """The ``__del__`` of an object whose own ``__del__`` already ran as its close."""


def _twin_is_quiet(cls: type) -> bool:
    """Whether a twin of ``cls`` can be made, unasked, without running code of the
    program's: ``cls`` has a ``__del__`` that is a Python function, its metaclass is
    ``type`` or ``abc.ABCMeta``, and no class of its MRO defines ``__init_subclass__``
    (a plugin registry's hook would see the twin as a new subclass, or refuse it)."""
    import abc

    if type(cls) is not type and type(cls) is not abc.ABCMeta:
        return False
    mro = type.__dict__["__mro__"].__get__(cls, type)
    own_dicts = [type.__dict__["__dict__"].__get__(klass, type) for klass in mro[:-1]]
    if any("__init_subclass__" in namespace for namespace in own_dicts):
        return False
    finalizer = next((ns["__del__"] for ns in own_dicts if "__del__" in ns), None)
    return type(finalizer).__name__ == "function"


def _finalized(obj: object, quiet: bool = False) -> None:
    """``obj``'s own ``__del__`` must not run when the object is collected: it ran as its
    close (``adopt(obj, close=type(obj).__del__)``: a destructor that frees or reads back
    twice), or, ``quiet``, the exit's teardown closed the object (its ``__del__`` would
    act again during finalization, when what it needs may be gone).  So the object's
    class becomes a twin subclass, made once per class with the same name and layout
    (``__slots__ = ()``), whose ``__del__`` does nothing: ``isinstance`` still holds,
    ``type(obj) is cls`` no longer does.  ``quiet`` acts only where `_twin_is_quiet`
    (an extension type's finalizer is its own; a class hook's, its own business).  Where
    no twin can be made or assigned (a final class, a metaclass that refuses), a warning
    says that the ``__del__`` may run again; ``quiet``, nothing is said: the object was
    closed, and most finalizers do nothing on a closed object."""
    cls = type(obj)
    if quiet and not _twin_is_quiet(cls):
        return
    twin = _finalized_twins.get(cls)
    try:
        if twin is None:
            namespace = {"__slots__": (), "__del__": _no_finalizer,
                         "__module__": cls.__module__, "__qualname__": cls.__qualname__}
            metaclass: Any = type(cls)  # (the class's own: an ABCMeta's twin is one too)
            twin = _finalized_twins[cls] = metaclass(cls.__name__, (cls,), namespace)
        obj.__class__ = twin
    except Exception as exc:  # (the class's own rules or hooks: reported, never raised)
        if not quiet:
            log().warning(
                "exitsafe: %s.__del__ ran as the close of an adopted object and may run "
                "again when the object is collected (its class cannot be given a twin "
                "without __del__: %r)", cls.__qualname__, exc,
            )

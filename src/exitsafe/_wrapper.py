"""A base class for new bindings: wrapper objects whose lifetime is an exitsafe handle.

A binding author subclasses [`NativeObject`][exitsafe.NativeObject], creates the native object in
``__init__`` and hands it to ``super().__init__`` with its release function
and its parent.  The wrapper then has ``raw``, ``close()``, ``closed``,
context-manager support, ``borrow()``, a parent link and a ``repr``, and it
needs no ``__del__`` of its own:

```python
class Device(NativeObject, kind="device", release=lambda raw: lib.device_free(raw)):
    def __init__(self, instance: Instance) -> None:
        super().__init__(lib.device_create(instance.raw), parent=instance)

    def compute(self) -> int:
        return lib.device_compute(self.raw)
```

Lifetime: the wrapper holds one owner of its [`Handle`][exitsafe.Handle].
``close()`` drops it; so does garbage collection of the wrapper (the
handle's own collection counts as one ``release()``, see
[`exitsafe.Handle`][exitsafe.Handle]).  The native release then runs once no child
handle depends on this one any more (children before parents, like a
``shared_ptr`` held by each child), or at teardown in dependency order, or
never under a leak policy.  After teardown every close / collection is a
recorded no-op, so a wrapper collected during interpreter finalization never
calls native code.  Using ``raw`` after ``close()`` raises
[`HandleClosedError`][exitsafe.HandleClosedError] instead of passing a dangling pointer
to C.

Thread rules: ``close()``, ``raw`` and ``borrow()`` may be called from any
thread; the release function runs on the thread that drops the last owner,
or on the thread running the teardown.
"""

from __future__ import annotations

from ._adopt import registry_arg
from ._handle import Handle
from ._lookup import resolve
from ._registry import Registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType
    from typing import Any, Callable, ClassVar, NoReturn, Optional, TypeVar

    from ._gate import Borrow
    from ._registry import ExitPolicy

    Self = TypeVar("Self", bound="NativeObject")

__all__ = ["NativeObject"]


class NativeObject:
    """Base class of a Python wrapper around one native object, whose lifetime is an exitsafe
    handle.

    A binding author subclasses it, creates the native object in `__init__` and hands it to
    `super().__init__` with its release function and its parent.  The wrapper then has
    `raw`, `close()`, `closed`, context-manager support, `borrow()`, a parent link and a
    `repr`, and needs no `__del__` of its own.

    Class keywords (all optional) set defaults for the subclass: `kind` (default: the class
    name), `release` (a callable `release(raw)`; it must not reference the wrapper itself),
    `exit_policy`, `registry`.

    Lifetime: the wrapper holds one owner of its [`Handle`][exitsafe.Handle].  `close()`
    drops it; so does garbage collection of the wrapper.  The native release then runs once
    no child handle depends on this one any more (children before parents), or at teardown
    in dependency order, or never under a leak policy.  After teardown every close /
    collection is a recorded no-op, so a wrapper collected during interpreter finalization
    never calls native code.

    Thread rules: `close()`, `raw` and `borrow()` may be called from any thread; the
    release function runs on the thread that drops the last owner, or on the thread running
    the teardown.  Subclasses may define `__slots__` or not.  A subclass that overrides
    [`close`][exitsafe.NativeObject.close] must call `super().close()`.  Wrappers cannot be
    pickled or copied.

    Args:
        raw: the native object to own (not `None`); omit it when passing `handle`.
        release: the release function, called as `release(raw)`; overrides the class
            default.
        handle: instead of `raw`, an existing live handle to wrap, for example one returned
            by [`exitsafe.cffi.track`][exitsafe.cffi.track] or
            [`exitsafe.ctypes.track`][exitsafe.ctypes.track], which validate pointers first.
        parent: another wrapper (or anything
            [`exitsafe.lowlevel.handle_of`][exitsafe.lowlevel.handle_of] knows) that must outlive
            this one: the wrapper keeps it referenced ([`parent`][exitsafe.NativeObject.parent])
            and its handle depends on the parent's.
        depends_on: more handles or objects this one depends on (a pinned library, a
            callback).
        kind: the label in the ledger and the trace; `None`: the class keyword, else the
            class name.
        name: the display name; default `"<kind>#<n>"`.
        exit_policy: `"release"`, `"leak"` or a callable policy; `None`: the class keyword,
            else the registry's default.
        registry: the registry to own it in; `None`: the class keyword, else the default
            registry.
        timeout: seconds the release may take at teardown before it is abandoned.

    Raises:
        TypeError: `raw` is `None` without `handle`, both `raw` and `handle` are given,
            `handle` is not live, or there is no release function.

    Example:
        ```python
        class Device(NativeObject, kind="device", release=lambda raw: lib.device_free(raw)):
            def __init__(self, instance: Instance) -> None:
                super().__init__(lib.device_create(instance.raw), parent=instance)

            def compute(self) -> int:
                return lib.device_compute(self.raw)
        ```
    """

    __slots__ = ("__weakref__", "_es_handle", "_es_owner", "_es_parent")

    _es_kind: ClassVar[Optional[str]] = None
    _es_release: ClassVar[Optional[tuple[Callable[[Any], object]]]] = None
    _es_exit_policy: ClassVar[Optional[ExitPolicy]] = None
    _es_registry: ClassVar[Optional[Registry]] = None

    def __init_subclass__(
        cls,
        *,
        kind: Optional[str] = None,
        release: Optional[Callable[[Any], object]] = None,
        exit_policy: Optional[ExitPolicy] = None,
        registry: Optional[Registry] = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if kind is not None:
            if type(kind) is not str:
                raise TypeError(f"kind must be a str, got {type(kind).__name__}")
            cls._es_kind = kind
        if release is not None:
            if not callable(release):
                raise TypeError(f"release must be callable, got {type(release).__name__}")
            cls._es_release = (release,)  # a tuple, so it is never bound as a method
        if exit_policy is not None:
            cls._es_exit_policy = exit_policy
        if registry is not None:
            cls._es_registry = registry_arg(registry)

    def __init__(
        self,
        raw: object = None,
        release: Optional[Callable[[Any], object]] = None,
        *,
        handle: Optional[Handle] = None,
        parent: object = None,
        depends_on: Iterable[object] = (),
        kind: Optional[str] = None,
        name: Optional[str] = None,
        exit_policy: Optional[ExitPolicy] = None,
        registry: Optional[Registry] = None,
        timeout: Optional[float] = None,
    ) -> None:
        cls = type(self)
        if handle is not None:
            if not isinstance(handle, Handle):
                raise TypeError(f"handle must be an exitsafe Handle, got {type(handle).__name__}")
            if raw is not None or release is not None:
                raise TypeError("pass either raw (and release) or handle=, not both")
            if handle.state != "live" or not handle.owners:
                raise TypeError(f"handle {handle.name!r} is no longer live")
            reg = handle.registry
            if parent is not None or depends_on:
                handle.add_dependency(
                    *resolve(parent, reg, "parent"), *resolve(depends_on, reg, "depends_on")
                )
        else:
            if raw is None:
                raise TypeError(f"{cls.__qualname__}() needs the raw native object (got None)")
            if release is None:
                if cls._es_release is None:
                    raise TypeError(
                        f"{cls.__qualname__} has no release function: pass release= to "
                        f"__init__ or declare class {cls.__qualname__}(NativeObject, release=...)"
                    )
                release = cls._es_release[0]
            reg = registry_arg(registry if registry is not None else cls._es_registry)
            parents = resolve(parent, reg, "parent") if parent is not None else ()
            parents += resolve(depends_on, reg, "depends_on")
            handle = reg.track(
                raw,
                release,
                kind=kind if kind is not None else (cls._es_kind or cls.__name__),
                depends_on=parents,
                exit_policy=exit_policy if exit_policy is not None else cls._es_exit_policy,
                name=name,
                timeout=timeout,
            )
        self._es_handle = handle
        # The one owner this wrapper holds; list.pop() takes it atomically in close().
        self._es_owner = [True]
        self._es_parent = parent

    # ------------------------------------------------------------------ access

    @property
    def raw(self) -> Any:
        """The native object; raises [`HandleClosedError`][exitsafe.HandleClosedError] once
        closed."""
        return self._es_handle.raw

    @property
    def handle(self) -> Handle:
        """The exitsafe handle: pass it (or the wrapper) in ``depends_on`` of other handles."""
        return self._es_handle

    @property
    def __exitsafe_handle__(self) -> Handle:
        """Lets [`exitsafe.lowlevel.handle_of`][exitsafe.lowlevel.handle_of] and every
        ``depends_on`` accept the wrapper."""
        return self._es_handle

    @property
    def parent(self) -> Any:
        """The parent given at construction (kept referenced by this wrapper), or ``None``."""
        return self._es_parent

    @property
    def closed(self) -> bool:
        """Whether this wrapper can no longer use its native object (closed, released, leaked)."""
        handle = self._es_handle
        return not self._es_owner or handle.state != "live" or handle.owners == 0

    def borrow(self) -> Borrow:
        """Mark the object in use for the duration of a `with` block (see
        [`Handle.borrow`][exitsafe.Handle.borrow]).

        A teardown that finds it borrowed leaks it instead of releasing it under a running
        call; a `close()` from another thread waits for the borrow to end before the native
        release runs.

        Returns:
            A context manager whose `__enter__` returns [`raw`][exitsafe.NativeObject.raw].

        Example:
            ```python
            with device.borrow() as raw:
                lib.device_run(raw, 10)
            ```
        """
        return self._es_handle.borrow()

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Drop this wrapper's ownership; idempotent and thread-safe.

        The native release runs now, on this thread, unless child handles still depend on this
        one (then right after the last of them is released), the object is borrowed, or
        teardown has already begun (then it is a recorded no-op).

        Raises:
            Exception: whatever the release function raised.
        """
        try:
            self._es_owner.pop()
        except IndexError:
            return  # already closed by this wrapper: never drop someone else's owner
        self._es_handle.release()

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError(f"{type(self).__qualname__} wraps a native object and cannot be pickled")

    def __copy__(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__qualname__} wraps a native object and cannot be copied; "
            f"share the wrapper itself"
        )

    def __deepcopy__(self, memo: Any) -> NoReturn:
        self.__copy__()

    def __repr__(self) -> str:
        handle = self._es_handle
        state = "closed" if self.closed and handle.state == "live" else handle.state
        return f"<{type(self).__qualname__} {handle.name!r} {state}>"

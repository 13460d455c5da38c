"""The user-facing handle ([`Handle`][exitsafe.Handle]), the policy's view of it
([`HandleInfo`][exitsafe.lowlevel.HandleInfo])
and the borrow context manager.

A [`Handle`][exitsafe.Handle] is its own record (`exitsafe._record.Record`); its methods
hand every state change to the module that makes it (`exitsafe._releases`,
`exitsafe._gate`, the registry's state).  Reads of ``state``, ``owners``, ``raw`` and the
like take no lock: each reads one field, which is atomic.
"""

from __future__ import annotations

from . import _record, _sync
from ._collected import collected
from ._core import speedups
from ._gate import Borrow, refuse_raw
from ._lookup import parents, resolve
from ._record import LIVE, STATE_NAMES, Record, display_name
from ._releases import detach, drop_owner, retain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, NoReturn, Optional

    from ._registry import Registry


__all__ = ["Handle", "HandleInfo"]


class Handle(Record):
    """One owned native object: what `track`, `pin`, `on_teardown` (and the adapters'
    `track`, `pin`, `callback`) return.

    Never construct one directly.

    **Owners.**  `track` starts with one owner; [`retain`][exitsafe.Handle.retain] adds one
    and [`release`][exitsafe.Handle.release] removes one.  When the count reaches zero the
    native release runs on the calling thread, unless handles depending on this one are
    still alive (then it runs right after the last of them is released) or the handle is
    borrowed (then it runs when the last borrow ends).

    **Garbage collection.**  When the last Python reference to a handle disappears, every
    remaining owner is dropped at once (nobody can release it any more); with the usual
    single owner that is exactly one [`release`][exitsafe.Handle.release].  A handle keeps
    the handles it depends on referenced, so a parent lives at least as long as its
    dependents, like a `shared_ptr` held by each child.

    **Threads.**  Every method may be called from any thread.  A release function runs on
    the thread that drops the last owner (or the teardown thread), never while exitsafe
    holds its lock.  Called from a finalizer or signal handler that interrupted exitsafe
    itself on the same thread, [`release`][exitsafe.Handle.release] is queued and done right
    after exitsafe's interrupted step, while the methods that must answer at once raise
    [`ReentrancyError`][exitsafe.lowlevel.ReentrancyError].

    The handle is a context manager: `with registry.track(...) as h:` releases one owner
    when the block ends.

    Example:
        ```python
        with exitsafe.track(lib.ctx_create(), lib.ctx_free, kind="context") as ctx:
            with ctx.borrow() as raw:      # not released while the call runs
                lib.ctx_run(raw)
        # the block's end released the owner: ctx_free ran (no dependent is alive)
        ```
    """

    __slots__ = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        """Refuse direct construction: handles are made by exitsafe.

        Args:
            *args: ignored.
            **kwargs: ignored.

        Raises:
            TypeError: always.
        """
        raise TypeError(
            "exitsafe.Handle objects are created by track(), pin() and on_teardown() "
            "(or the adapters' track/pin/callback), not directly"
        )

    @property
    def raw(self) -> Any:
        """The tracked raw object.

        Raises [`HandleClosedError`][exitsafe.HandleClosedError] once the handle was released,
        leaked or detached, or once its last owner let go (even while its native
        release is still deferred behind live dependents).  A daemon thread reading it
        after the exit's teardown released it (or claimed it) is parked instead, as at
        [`borrow`][exitsafe.Handle.borrow]: it blocks until the process ends, so no
        traceback is printed during the exit and no native call starts with a freed
        object.  Reading `raw` does not hold the release back: a call in flight needs
        `borrow()`.
        """
        if self._state == LIVE and self._refs:
            return self._raw
        refuse_raw(self)

    @property
    def kind(self) -> str:
        """The kind given at registration (``"handle"``, ``"library"``, ``"hook"`` ...)."""
        return self._kind

    @property
    def name(self) -> str:
        """The name given at registration, or ``"<kind>#<n>"``."""
        return display_name(self)

    @property
    def state(self) -> str:
        """``"live"``, ``"released"`` or ``"leaked"``: what happened to the native object.

        A handle whose release is running on some thread is still ``"live"``; a
        detached one is ``"leaked"`` (exitsafe will never release it).
        """
        return STATE_NAMES[self._state]

    @property
    def owners(self) -> int:
        """The current owner count (0 once every owner let go)."""
        return self._refs

    @property
    def registry(self) -> Registry:
        """The registry this handle belongs to."""
        registry: Registry = self._registry.facade
        return registry

    @property
    def borrowed(self) -> bool:
        """Whether some thread is inside [`borrow`][exitsafe.Handle.borrow] for this handle."""
        return self._borrows > 0

    @property
    def thread_id(self) -> int:
        """The ident of the thread that created the handle."""
        return self._thread_id

    @property
    def inherited(self) -> bool:
        """Whether the handle was created before a fork that produced this process."""
        return self._gen != _sync.generation

    @property
    def created_on_main_thread(self) -> bool:
        """Whether the creating thread was the interpreter's main thread."""
        import threading

        return self._thread_id == threading.main_thread().ident

    @property
    def depends_on(self) -> tuple[Handle, ...]:
        """The handles this one depends on (empty once it ended)."""
        return self._parents  # type: ignore[return-value]

    def retain(self) -> Handle:
        """Add one owner and return this handle.

        Returns:
            This handle, so that `other = h.retain()` reads as taking a share.

        Raises:
            HandleClosedError: the handle has no owner left (it is released, leaked, or its
                release is already pending).
        """
        retain(self)
        return self

    def release(self) -> None:
        """Remove one owner; release natively when none is left and no dependent lives.

        Calls beyond the last owner are no-ops, so releasing twice is safe.  The native release
        runs on this thread, then, iteratively, those of any parents it was the last dependent
        of.  After the registry's teardown began this is a recorded no-op (a *late request*).

        Raises:
            Exception: whatever the release function raised, after the bookkeeping is done (the
                handle ends as `release_failed` and the handles it depends on are leaked rather
                than released from under it).
            LiveDependentsError: strict mode only, when the last owner is dropped while
                dependents live; nothing changed.
        """
        drop_owner(self)

    def borrow(self) -> Borrow:
        """Mark the handle in use for the duration of a `with` block; the block gets `raw`.

        While borrowed, the native release never runs: a release request waits for the borrow
        to end, and a teardown waits for the borrows in flight on other threads (bounded by
        the step timeout, or 5 s), then releases the handle; one still borrowed at the bound,
        or borrowed by the teardown's own thread, is leaked (`leaked_in_use`, and what it
        depends on `leaked_dependent`) rather than released under a running call.  Once the
        teardown began, a new borrow on another thread does not enter: a daemon thread is
        parked, a non-daemon one gets `HandleClosedError` (see the threads page).  Borrows
        may nest and come from several threads.

        Returns:
            A context manager whose `__enter__` returns [`raw`][exitsafe.Handle.raw].

        Raises:
            HandleClosedError: on entering, if the handle is no longer usable.

        Example:
            ```python
            with device.borrow() as raw:
                lib.device_run(raw, 10)
            ```
        """
        return Borrow(self)

    def borrowing(self) -> Any:
        """A view of [`raw`][exitsafe.Handle.raw] whose every use borrows this handle.

        For an object that threads use through code you do not change (a writer a daemon
        thread calls `write()` on, a file a worker indexes): hand them the view instead of
        the object, and each method call, attribute access, `[]`, `len`, `in`, iteration
        step, call or `with` made through it runs inside [`borrow`][exitsafe.Handle.borrow].
        So a release waits for the call in flight, the exit teardown waits for it (bounded)
        and then parks a daemon thread at its next call instead of closing the object
        under it.  A callable result (a method, a function the object holds) comes back as
        a call that borrows; a result that belongs to the same library as the object (its
        type's top-level module: an h5py `Dataset` from an h5py `File`) as a view borrowing
        this same handle; anything else (a number, an array) as it is.

        The view is not the object: `isinstance` and identity see the view; pass
        `handle.raw` where a function needs the object itself (the view forwards every
        attribute, `raw` included, to the object).

        Returns:
            The view (a new one each call; views hold no state of their own).

        Raises:
            HandleClosedError: the handle is no longer usable (also at each later use
                through the view, as `borrow()` raises).

        Example:
            ```python
            writer = exitsafe.adopt(cv2.VideoWriter(path, fourcc, 30, size),
                                    close="release").borrowing()
            threading.Thread(target=lambda: [writer.write(f) for f in frames()],
                             daemon=True).start()
            ```
        """
        from ._view import view_of

        return view_of(self)

    def detach(self) -> Any:
        """Stop owning the object without releasing it; return `raw`.

        Like `ffi.gc(ptr, None)` or `weakref.finalize.detach()`: the release function will
        never be called, by anyone, and the program owns the object again.  The ledger records
        `detached`.  The handles this one depends on no longer wait for it (they are released
        when their own owners let go).

        Returns:
            The raw object, now the caller's to release.

        Raises:
            LiveDependentsError: handles depending on this one are alive (they still need it).
            HandleClosedError: the handle is not live, has no owner left or is borrowed.
            RegistryClosedError: the registry's teardown began.
        """
        return detach(self)

    def add_dependency(self, *others: object) -> None:
        """Declare that this handle depends on `others`: they will outlive it.

        All edges are added or none.

        Args:
            *others: handles of the same registry, or objects exitsafe knows (see
                [`exitsafe.lowlevel.handle_of`][exitsafe.lowlevel.handle_of]): each is released
                only after this handle.

        Raises:
            DependencyCycleError: an edge would close a cycle (the error names it).
            ForeignHandleError: a handle belongs to another registry.
            HandleClosedError: a handle is no longer usable.
        """
        state = self._registry
        found = parents(resolve(others, state.facade, "add_dependency"), state, "add_dependency")
        state.add_dependencies(self, found)

    def __enter__(self) -> Handle:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()

    def __copy__(self) -> NoReturn:
        raise TypeError(
            f"exitsafe.Handle {display_name(self)!r} cannot be copied: a copy would release "
            f"its native object a second time.  Share the handle itself; to add an owner, "
            f"use handle.retain() (and release() once per owner)"
        )

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__copy__()

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(
            f"exitsafe.Handle {display_name(self)!r} cannot be pickled: its native object "
            f"belongs to this process.  Share the handle itself within the process; to add "
            f"an owner, use handle.retain() (and release() once per owner)"
        )

    def __repr__(self) -> str:
        return (
            f"<exitsafe.Handle {self._kind} {display_name(self)!r} {STATE_NAMES[self._state]}"
            f" owners={self._refs} registry={self._registry.name!r}>"
        )


if speedups is None:

    class OwnedHandle(Handle):
        """The class of a pure-Python handle: a `Handle` with the finalizer that releases
        it when its last reference is dropped (the compiled record has the same finalizer
        in C, and its handles are plain `Handle` objects)."""

        __slots__ = ()

        def __del__(self) -> None:
            # No module globals here: during interpreter finalization they may be None.
            # An interrupt can land anywhere but at this frame's entry (see
            # exitsafe._sync.locked on `try` lines): `collected` then goes on from where
            # it stopped, and CPython reports the interrupt as an exception ignored in a
            # finalizer.  At the entry itself, which CPython 3.11+ checks for signals
            # (and where a tracer's first line event comes on 3.9 and 3.10, before the
            # try is set up), the finalizer is lost with it: see the pure-Python core's
            # limits in docs/architecture.md (the compiled core's finalizer is C code).
            try: self._collected(self)  # noqa: E701  (one line: no line of its own)
            except BaseException:
                self._collected(self)
                raise

        #: Reached through the class: module globals may be None when this runs.
        _collected = staticmethod(collected)

    _record.finalizer_free(OwnedHandle, Handle)

else:
    OwnedHandle = Handle  # type: ignore[misc,assignment]


if speedups is not None:
    # The compiled core's common cases; each hands every other case to the functions of
    # exitsafe._releases (drop_owner, retain), so both cores keep one semantics.
    speedups.set_doc("Node", "release", Handle.release.__doc__ or "")
    speedups.set_doc("Node", "retain", Handle.retain.__doc__ or "")
    Handle.release = speedups.Node.release  # type: ignore[method-assign]
    Handle.retain = speedups.Node.retain  # type: ignore[method-assign]
else:
    # The pure-Python core: Handle.release *is* exitsafe._releases.drop_owner (a copy
    # named and documented as the method), one Python call fewer on the hot path.
    _doc = Handle.release
    _function: Any = type(drop_owner)
    _release = _function(drop_owner.__code__, drop_owner.__globals__, "release")
    _release.__doc__, _release.__qualname__ = _doc.__doc__, _doc.__qualname__
    _release.__module__ = _doc.__module__
    Handle.release = _release  # type: ignore[method-assign]
    del _doc, _release, _function


class HandleInfo:
    """What an exit policy sees of a handle: a read-only snapshot taken at teardown.

    Made by exitsafe and passed to a callable `exit_policy` (see
    [`exitsafe.policies`][exitsafe.policies]); never constructed by user code.

    Attributes:
        raw: the raw object, still unreleased (do not release it from the policy).
        kind: the kind given at registration.
        name: the display name.
        registry: the name of the registry the handle belongs to.
        thread_id: the ident of the thread that created the handle.
        created_on_main_thread: whether that thread was the interpreter's main thread.
        inherited: whether the handle was created before a fork that produced this process.
        owners: how many owners it still had when the teardown reached it.
    """

    __slots__ = (
        "created_on_main_thread",
        "inherited",
        "kind",
        "name",
        "owners",
        "raw",
        "registry",
        "thread_id",
    )

    def __init__(self, node: Record, generation: int, main_ident: Optional[int]) -> None:
        """Take the snapshot (exitsafe's own use).

        Args:
            node: the handle's record.
            generation: the fork generation of this process.
            main_ident: the ident of the main thread, or `None`.
        """
        self.raw: Any = node._raw
        self.kind: str = node._kind
        self.name: str = display_name(node)
        self.registry: str = node._registry.name
        self.thread_id: int = node._thread_id
        self.created_on_main_thread: bool = node._thread_id == main_ident
        self.inherited: bool = node._gen != generation
        self.owners: int = node._refs

    def __repr__(self) -> str:
        return (
            f"<exitsafe.lowlevel.HandleInfo {self.kind} {self.name!r}"
            f" registry={self.registry!r}>"
        )

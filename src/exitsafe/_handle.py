"""The user-facing handle ([`Handle`][exitsafe.Handle]), the policy's view of it
([`HandleInfo`][exitsafe.HandleInfo])
and the borrow context manager.

A [`Handle`][exitsafe.Handle] is its own record (`Node`); every state change
goes through its registry, except the pure-Python core's lock-free release of a simple
handle, here (`_release_simple`; see ``_node.SIMPLE``).  Reads of ``state``, ``owners``,
``raw`` and the like take no lock: each reads one field, which is atomic.
"""

from __future__ import annotations

import sys

from . import _sync, _threads
from ._core import LOCK_FREE, speedups
from ._errors import HandleClosedError
from ._ledger import Outcome
from ._node import (
    DETACHED,
    LEAKED,
    LIVE,
    RELEASED,
    RELEASING,
    SIMPLE,
    STATE_NAMES,
    Node,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Any, Callable, NoReturn, Optional

    from ._registry import Registry

__all__ = ["Handle", "HandleInfo"]


class Handle(Node):
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
    [`ReentrancyError`][exitsafe.ReentrancyError].

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
        release is still deferred behind live dependents).
        """
        if self._state == LIVE and self._refs:
            return self._raw
        raise HandleClosedError(closed_message(self))

    @property
    def kind(self) -> str:
        """The kind given at registration (``"handle"``, ``"library"``, ``"hook"`` ...)."""
        return self._kind

    @property
    def name(self) -> str:
        """The name given at registration, or ``"<kind>#<n>"``."""
        return self._display_name()

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
        return self._registry

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
        from . import _sync

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
        self._registry._retain(self)
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
        self._registry._drop_owner(self)

    def borrow(self) -> Borrow:
        """Mark the handle in use for the duration of a `with` block; the block gets `raw`.

        While borrowed, the native release never runs: a release request waits for the borrow
        to end, and a teardown leaks the handle (and what it depends on) rather than release it
        under a running call.  Borrows may nest and come from several threads.

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
        return self._registry._detach(self)

    def add_dependency(self, *others: object) -> None:
        """Declare that this handle depends on `others`: they will outlive it.

        All edges are added or none.

        Args:
            *others: handles of the same registry, or objects exitsafe knows (see
                [`exitsafe.handle_of`][exitsafe.handle_of]): each is released only after this
                handle.

        Raises:
            DependencyCycleError: an edge would close a cycle (the error names it).
            ForeignHandleError: a handle belongs to another registry.
            HandleClosedError: a handle is no longer usable.
        """
        self._registry._add_dependencies(self, others)

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
            f"exitsafe.Handle {self._display_name()!r} cannot be copied: a copy would release "
            f"its native object a second time.  Share the handle itself; to add an owner, "
            f"use handle.retain() (and release() once per owner)"
        )

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__copy__()

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(
            f"exitsafe.Handle {self._display_name()!r} cannot be pickled: its native object "
            f"belongs to this process.  Share the handle itself within the process; to add "
            f"an owner, use handle.retain() (and release() once per owner)"
        )

    def __repr__(self) -> str:
        return (
            f"<exitsafe.Handle {self._kind} {self._display_name()!r} {STATE_NAMES[self._state]}"
            f" owners={self._refs} registry={self._registry.name!r}>"
        )


if speedups is None:

    class OwnedHandle(Handle):
        """The class of a pure-Python handle until it ends: a `Handle` with the finalizer
        that releases it when its last reference is dropped (the compiled record has the
        same finalizer in C, and its handles are plain `Handle` objects).

        A handle the lock-free release ended becomes a plain `Handle` (``__class__`` is
        assigned; the layouts are the same), whose collection then costs no Python call.
        """

        __slots__ = ()

        def __del__(self) -> None:
            # No module globals here: during interpreter finalization they may be None.
            try:
                refs = self._refs
            except AttributeError:  # never initialized (a failed direct construction)
                return
            if refs:
                self._registry._collected(self)

else:
    OwnedHandle = Handle  # type: ignore[misc,assignment]


class HookHandle(Handle):
    """The handle of a teardown hook: owned by its registry, not by Python references."""

    __slots__ = ()

    def release(self) -> None:
        """Cancel the hook: it will not run.  A no-op once it ran or teardown began."""
        self._registry._cancel_hook(self)

    def __del__(self) -> None:
        # The registry keeps hooks until teardown; dropping the handle changes nothing.
        pass


if LOCK_FREE:
    _LOCK = _sync.LOCK
    _is_owned = type(_LOCK)._is_owned  # _LOCK._is_owned(): CPython calls this form cheaply
    _deferred = _sync._deferred
    _affine = _threads.pending
    _getframe = sys._getframe
    _RELEASED = Outcome.RELEASED

    def _release_simple(self: Handle) -> None:
        # The pure-Python core's Handle.release: a simple node (see _node.SIMPLE) is
        # claimed by deleting its key from the unclaimed dict, and released with no lock;
        # every other case goes to Registry._drop_owner, under the lock.
        registry = self._registry
        if registry._phase or _is_owned(_LOCK):  # a teardown began; a finalizer or a
            registry._drop_owner(self)  # signal handler interrupted a section here
            return
        unclaimed = registry._unclaimed
        seq = self._seq
        try:
            del unclaimed[seq]  # the claim: one delete succeeds, whoever else tries
        except KeyError:  # an ordinary node, ended, or being released by another thread
            registry._drop_owner(self)
            return
        # No call from the claim to the release function: CPython acts on a signal (a
        # KeyboardInterrupt) only after a call, so none can land between them (a claimed
        # node nobody releases would stay "releasing" for good).  _releaser stays SIMPLE:
        # released_here() finds this frame, by its local `claimed`, when it matters (a
        # teardown or a fork on this thread during the release), which keeps a call off
        # the hot path.  (A frame that lost the claim has no `claimed`: the locked path it
        # took may run queued work, a teardown or a fork, while another thread releases.)
        claimed = self  # noqa: F841  (read through this frame by released_here)
        self._refs = 0
        self._state = RELEASING
        try:
            self._fn(self._raw)  # type: ignore[misc]
        except BaseException as exc:  # recorded, then re-raised to the caller
            error = registry._leaf_failed(self, exc)
            del exc
            try:
                raise error
            finally:
                del error  # (no frame of ours keeps it: see Registry._release_chain)
        try:
            del registry._live[seq]  # ended: whoever removes the entry records the end
        except KeyError:
            pass  # a teardown gave up waiting for this release and recorded it
        else:
            self._state = RELEASED  # (no call from the delete to the record: an
            self._releaser = 0  # interrupt cannot separate them)
            records = registry._records
            records.append((seq, self._kind, self._name, _RELEASED, None, False))
            if len(records) > registry._cap:
                registry._trim_ledger()
        self._raw = self._fn = None  # this may run the object's __del__
        self.__class__ = Handle  # ended: no finalizer needed any more (see OwnedHandle)
        if _deferred or _affine:
            registry._after_release()

    def released_here(node: Node) -> bool:
        """Whether a lock-free release of ``node`` (claimed, ``_releaser`` still
        ``SIMPLE``) is running on this thread: a frame of it that made the claim is on
        this thread's stack."""
        code = _release_simple.__code__
        frame: Optional[FrameType] = _getframe(1)
        while frame is not None:
            if frame.f_code is code and frame.f_locals.get("claimed") is node:
                return True
            frame = frame.f_back
        return False

    _release_simple.__doc__ = Handle.release.__doc__
    _release_simple.__name__ = _release_simple.__qualname__ = "release"
    Handle.release = _release_simple  # type: ignore[method-assign]

else:

    def released_here(node: Node) -> bool:
        """Whether a lock-free release of ``node`` runs on this thread: never, here (no
        lock-free release in this core)."""
        return False


if speedups is not None:
    # The compiled core's common cases; each hands every other case to the methods above
    # (through the registry's _drop_owner and _retain), so both cores keep one semantics.
    speedups.set_doc("Node", "release", Handle.release.__doc__ or "")
    speedups.set_doc("Node", "retain", Handle.retain.__doc__ or "")
    Handle.release = speedups.Node.release  # type: ignore[method-assign]
    Handle.retain = speedups.Node.retain  # type: ignore[method-assign]

_new = object.__new__
_init = Node._init


def make_handle(
    cls: type[Handle],
    registry: Registry,
    raw: object,
    fn: Optional[Callable[[Any], object]],
    kind: str,
    name: Optional[str],
    parents: tuple[Node, ...],
    policy: Any,
    timeout: Optional[float],
    role: int,
    gen: int,
    thread_id: int,
) -> Handle:
    """Create a handle (``Handle.__init__`` refuses direct construction)."""
    handle: Handle = _new(cls)
    _init(handle, registry, raw, fn, kind, name, parents, policy, timeout, role, gen, thread_id)
    return handle


class Borrow:
    """Context manager returned by [`Handle.borrow`][exitsafe.Handle.borrow]:
    `with h.borrow() as raw:`.
    """

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node

    def __enter__(self) -> Any:
        return self._node._registry._borrow_enter(self._node)

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._node._registry._borrow_exit(self._node)


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

    def __init__(self, node: Node, generation: int, main_ident: Optional[int]) -> None:
        """Take the snapshot (exitsafe's own use).

        Args:
            node: the handle's record.
            generation: the fork generation of this process.
            main_ident: the ident of the main thread, or `None`.
        """
        self.raw: Any = node._raw
        self.kind: str = node._kind
        self.name: str = node._display_name()
        self.registry: str = node._registry.name
        self.thread_id: int = node._thread_id
        self.created_on_main_thread: bool = node._thread_id == main_ident
        self.inherited: bool = node._gen != generation
        self.owners: int = node._refs

    def __repr__(self) -> str:
        return f"<exitsafe.HandleInfo {self.kind} {self.name!r} registry={self.registry!r}>"


def closed_message(node: Node) -> str:
    """Why ``node``'s raw object must not be used any more (no import here: this may run
    from a finalizer late in interpreter shutdown)."""
    state = node._state
    if state == RELEASED:
        what = "was released"
    elif state == LEAKED:
        what = "was leaked"
    elif state == DETACHED:
        what = "was detached (the program owns it again)"
    elif state == RELEASING or node._releaser == SIMPLE:  # (SIMPLE: claimed, see _node)
        what = "is being released"
    else:
        what = "has no owner left (its release is pending"
        if node._children:
            what += f" until {node._children} dependent(s) are released"
        what += ")"
    return f"{node._kind} {node._display_name()!r} {what}; its native object must not be used"


def enter_borrow(handle: Handle) -> Any:
    """``handle.borrow().__enter__()`` without the context manager (automatic borrows)."""
    return handle._registry._borrow_enter(handle)


def exit_borrow(handle: Handle) -> None:
    """The matching end of `enter_borrow`."""
    handle._registry._borrow_exit(handle)

"""The lifetime core: handle graph, explicit owner counts, ordered teardown, ledger.

A :class:`Registry` owns a graph of native handles.  Each handle has a release
function, a kind, an owner count, and the handles it *depends on* (which must
outlive it).  The native release of a handle runs exactly once, when its owner
count is zero **and** no handle depending on it is still alive, or never when
the handle is leaked.

At process exit (an :mod:`atexit` callback, so after non-daemon threads were
joined and before the interpreter finalizes modules) every registry still
holding live handles runs its **teardown**: hooks and handles in dependency
order, each handle released or leaked according to its exit policy.  After
teardown the registry is *closed*: every later release request, from any
thread and from finalizers running during interpreter shutdown, is a recorded
no-op that never calls native code.

Thread rules: every public method may be called from any thread.  Release
functions, hooks and policies run *outside* the registry's lock, on the thread
that caused them (the thread dropping the last owner, or the thread running
the teardown; with a step timeout, a teardown worker thread).  They may call
back into exitsafe.

Fork: a child created by ``os.fork()`` never releases handles it inherited;
they end as ``leaked_inherited`` there.  Handles the child creates itself are
released normally.
"""

from __future__ import annotations

import _thread
import time
from _weakref import ref as _weakref

from . import _config, _states
from ._errors import (
    DependencyCycleError,
    ForeignHandleError,
    HandleClosedError,
    LiveDependentsError,
    RegistryClosedError,
)
from ._ledger import LedgerEntry, Outcome
from ._planner import ROLE_HANDLE, ROLE_HOOK, ROLE_LIBRARY, dependency_path, unique
from ._process import default_registry, register, registries
from ._report import emit, log, quote
from ._states import CLOSED as _CLOSED
from ._states import LEAKED as _LEAKED
from ._states import LIVE as _LIVE
from ._states import OPEN as _OPEN
from ._states import RELEASED as _RELEASED
from ._states import RELEASING as _RELEASING
from ._states import STATE_NAMES as _STATE_NAMES
from ._states import TAINTING as _TAINTING
from ._states import TEARING as _TEARING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType
    from typing import Any, Callable, Optional, Union

    ExitPolicy = Union[str, Callable[["HandleInfo"], str]]

__all__ = [
    "Handle",
    "HandleInfo",
    "Registry",
    "default_registry",
    "registries",
]

_get_ident = _thread.get_ident
_monotonic = time.perf_counter
_sleep = time.sleep

#: How often a thread yields to the holder of a registry lock before it blocks on it.
_YIELDS_BEFORE_BLOCKING = 100


def _wait_for(lock: Any) -> None:
    """Take ``lock``, which another thread holds, without queueing on it at first.

    The hot path (track, retain, release) takes its registry's lock with
    ``acquire(False)`` and calls this only when that fails.  Blocking at once
    would hand the lock and the GIL back and forth with a context switch each
    time (a lock convoy: two threads then got a quarter of one thread's
    throughput); yielding the GIL lets the holder finish its short section.
    After ``_YIELDS_BEFORE_BLOCKING`` tries (a long section, such as a teardown
    recording 10^6 outcomes) it blocks.
    """
    for _ in range(_YIELDS_BEFORE_BLOCKING):
        _sleep(0)
        if lock.acquire(False):
            return
    lock.acquire()


def _check_policy(policy: object, what: str) -> None:
    if policy in ("release", "leak") or callable(policy):
        return
    raise ValueError(f"{what} must be 'release', 'leak' or a callable, got {policy!r}")


def _check_timeout(timeout: object, what: str) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {type(timeout).__name__}")
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {timeout!r}")
    from . import _steps  # imported on first use: importing exitsafe stays cheap

    _steps.prepare()  # a worker thread must exist before shutdown forbids starting one
    return float(timeout)


def _call_no_arg(fn: Callable[[], object]) -> Callable[[object], object]:
    return lambda _unused: fn()


class _Borrow:
    """Context manager returned by :meth:`Handle.borrow`."""

    __slots__ = ("_handle",)

    def __init__(self, handle: Handle) -> None:
        self._handle = handle

    def __enter__(self) -> Any:
        handle = self._handle
        registry = handle._registry
        with registry._lock:
            if handle._state != _LIVE or not handle._refs:
                raise HandleClosedError(registry._closed_message(handle))
            handle._borrows += 1
            raw = handle._raw
        registry._after_unlock()
        return raw

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._handle._registry._end_borrow(self._handle)


class Handle:
    """One owned native object: its raw value plus the registry's bookkeeping.

    Created by :meth:`Registry.track`, :meth:`Registry.pin` (kind
    ``"library"``) or :meth:`Registry.on_teardown` (kind ``"hook"``); never
    construct one directly.

    Owners: ``track`` starts with one owner; :meth:`retain` adds one and
    :meth:`release` removes one.  When the count reaches zero the native
    release runs on the calling thread, unless handles depending on this one
    are still alive (then it runs right after the last of them is released) or
    the handle is borrowed (then it runs when the last borrow ends).

    Garbage collection: the registry refers to a handle only weakly, so when
    the last Python reference to it disappears every remaining owner is
    dropped at once (nobody can release it any more); with the usual single
    owner that is exactly one :meth:`release`.  A handle that others depend on
    is referenced by each dependent, so it lives at least as long as they do,
    like a ``shared_ptr`` held by each child.

    The handle is a context manager: ``with registry.track(...) as h:``
    releases one owner when the block ends.  Exit policies receive the handle
    itself and may read ``raw``, ``kind``, ``name``, ``thread_id``,
    ``created_on_main_thread`` and ``inherited``.
    """

    __slots__ = (
        "__weakref__",
        "_borrows",
        "_children",
        "_fn",
        "_gen",
        "_name",
        "_parents",
        "_policy",
        "_raw",
        "_refs",
        "_registry",
        "_role",
        "_seq",
        "_state",
        "_taint",
        "_timeout",
        "kind",
        "thread_id",
    )

    def __init__(
        self,
        registry: Registry,
        raw: object,
        fn: Optional[Callable[[Any], object]],
        kind: str,
        name: Optional[str],
        parents: tuple[Handle, ...],
        policy: Optional[ExitPolicy],
        timeout: Optional[float],
        role: int,
    ) -> None:
        self._registry = registry
        self._raw = raw
        self._fn = fn
        self.kind = kind
        self._name = name
        self._parents = parents
        self._policy = policy
        self._timeout = timeout
        self._role = role
        self._refs = 1
        self._children = 0
        self._borrows = 0
        self._state = _LIVE
        self._taint: Optional[str] = None
        self._seq = 0
        self._gen = _states.fork_generation
        self.thread_id = _get_ident()

    @property
    def raw(self) -> Any:
        """The tracked raw object.

        Raises :class:`HandleClosedError` once the handle was released, leaked,
        or once its last owner let go (even while its native release is still
        deferred behind live dependents).
        """
        if self._state == _LIVE and self._refs:
            return self._raw
        raise HandleClosedError(self._registry._closed_message(self))

    @property
    def name(self) -> str:
        """The name given at registration, or ``"<kind>#<n>"``."""
        name = self._name
        return name if name is not None else f"{self.kind}#{self._seq}"

    @property
    def state(self) -> str:
        """``"live"``, ``"released"`` or ``"leaked"``: what happened to the native object."""
        return _STATE_NAMES[self._state]

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
        """Whether some thread is inside :meth:`borrow` for this handle."""
        return self._borrows > 0

    @property
    def inherited(self) -> bool:
        """Whether the handle was created before a fork that produced this process."""
        return self._gen != _states.fork_generation

    @property
    def created_on_main_thread(self) -> bool:
        """Whether the creating thread was the interpreter's main thread."""
        import threading

        return self.thread_id == threading.main_thread().ident

    @property
    def depends_on(self) -> tuple[Handle, ...]:
        """The handles this one depends on (empty once it ended)."""
        return self._parents

    def retain(self) -> Handle:
        """Add one owner and return this handle.

        Raises :class:`HandleClosedError` when the handle has no owner left
        (it is released, leaked, or its release is already pending).
        """
        registry = self._registry
        lock = registry._lock
        if not lock.acquire(False):
            _wait_for(lock)
        try:
            if self._state != _LIVE or not self._refs:
                raise HandleClosedError(registry._closed_message(self))
            self._refs += 1
        finally:
            lock.release()
        registry._after_unlock()
        return self

    def release(self) -> None:
        """Remove one owner; release natively when none is left and no dependent lives.

        Calls beyond the last owner are no-ops, so releasing twice is safe.
        The native release runs on this thread, then, iteratively, those of
        any parents it was the last dependent of.  If a release function
        raises, the exception propagates here after the bookkeeping is done
        (the handle ends as ``release_failed`` and the handles it depends on
        are leaked rather than released from under it).  After the registry's
        teardown began this is a recorded no-op.  In strict mode, dropping the
        last owner while dependents live raises :class:`LiveDependentsError`
        and changes nothing.
        """
        self._registry._drop_owner(self)

    def borrow(self) -> _Borrow:
        """Mark the handle in use for the duration of a ``with`` block; yields ``raw``.

        While borrowed, the native release never runs: a release request
        waits for the borrow to end, and a teardown leaks the handle (and
        what it depends on) rather than release it under a running call.
        Raises :class:`HandleClosedError` if the handle is no longer usable.
        """
        return _Borrow(self)

    def add_dependency(self, *others: Handle) -> None:
        """Declare that this handle depends on ``others``: they will outlive it.

        Raises :class:`DependencyCycleError` (naming the cycle) when an edge
        would close a cycle, :class:`ForeignHandleError` for a handle of
        another registry, :class:`HandleClosedError` for a handle no longer
        usable.  All edges are added or none.
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

    def __del__(self) -> None:
        # Uses no module globals: during interpreter finalization they may already be None.
        if self._refs:
            self._registry._collected(self)

    def __repr__(self) -> str:
        return (
            f"<exitsafe.Handle {self.kind} {self.name!r} {_STATE_NAMES[self._state]}"
            f" owners={self._refs} registry={self._registry.name!r}>"
        )


#: Exit policies receive the handle itself; the name documents that role.
HandleInfo = Handle


class _HookHandle(Handle):
    """The handle of a teardown hook: owned by the registry, not by Python references."""

    __slots__ = ()

    def release(self) -> None:
        """Cancel the hook: it will not run.  A no-op once it ran or teardown began."""
        self._registry._cancel_hook(self)

    def __del__(self) -> None:
        # The registry holds hooks strongly until teardown; nothing to do here.
        pass


def _disown(node: Handle) -> None:
    """Forget a handle whose registration was refused: the caller still owns its object.

    Its finalizer then finds no owner and never calls ``release``.
    """
    node._refs = 0
    node._state = _LEAKED
    node._raw = None
    node._fn = None
    node._parents = ()


class Registry:
    """An independent graph of handles with its own teardown.

    ``name`` labels the registry in the ledger and the trace.  ``strict``
    turns misuse that is otherwise absorbed into exceptions:
    :class:`LiveDependentsError` for releasing a handle with live dependents,
    :class:`RegistryClosedError` for registering after teardown.
    ``exit_policy`` is the default for handles that name none (``"release"``,
    ``"leak"`` or a callable ``(Handle) -> "release" | "leak"``).
    ``step_timeout`` / ``teardown_timeout`` bound one teardown step / the
    whole teardown in seconds (``EXITSAFE_STEP_TIMEOUT`` and
    ``EXITSAFE_TEARDOWN_TIMEOUT`` apply where these are ``None``).
    ``ledger_limit`` caps how many ledger entries are kept (oldest dropped
    first; :meth:`ledger_counts` stays exact); ``None`` keeps all.

    Every registry is torn down at process exit, newest registry first, each
    in its own dependency order.
    """

    def __init__(
        self,
        name: str = "registry",
        *,
        strict: bool = False,
        exit_policy: ExitPolicy = "release",
        step_timeout: Optional[float] = None,
        teardown_timeout: Optional[float] = None,
        ledger_limit: Optional[int] = 100_000,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        _check_policy(exit_policy, "exit_policy")
        if ledger_limit is not None and (
            isinstance(ledger_limit, bool) or not isinstance(ledger_limit, int) or ledger_limit < 0
        ):
            raise ValueError(
                f"ledger_limit must be a non-negative int or None, got {ledger_limit!r}"
            )
        self.name = name
        self.strict = bool(strict)
        self.exit_policy: ExitPolicy = exit_policy
        self._step_timeout = _check_timeout(step_timeout, "step_timeout")
        self._teardown_timeout = _check_timeout(teardown_timeout, "teardown_timeout")
        self._ledger_limit = ledger_limit
        self._lock = _thread.allocate_lock()
        self._teardown_lock = _thread.allocate_lock()
        self._teardown_thread: Optional[int] = None
        self._phase = _OPEN
        self._seq = 0
        # Handles are referenced weakly (dropping the last reference releases them);
        # hooks strongly (they are owned by the registry until teardown).
        self._live: dict[int, Any] = {}
        self._hooks: dict[int, Handle] = {}
        self._gc_queue: list[Handle] = []
        self._entries: list[tuple[int, str, Optional[str], str, Optional[str], bool]] = []
        self._dropped_entries = 0
        self._counts: dict[str, int] = {}
        self._late_requests = 0
        self._trace = False
        self._is_closed = False
        register(self)

    @property
    def step_timeout(self) -> Optional[float]:
        """Seconds one teardown step may take before it is abandoned and leaked (or ``None``)."""
        return self._step_timeout

    @step_timeout.setter
    def step_timeout(self, value: Optional[float]) -> None:
        self._step_timeout = _check_timeout(value, "step_timeout")

    @property
    def teardown_timeout(self) -> Optional[float]:
        """Seconds the whole teardown may take; steps after that are leaked (or ``None``)."""
        return self._teardown_timeout

    @teardown_timeout.setter
    def teardown_timeout(self, value: Optional[float]) -> None:
        self._teardown_timeout = _check_timeout(value, "teardown_timeout")

    # ------------------------------------------------------------------ registration

    def track(
        self,
        raw: object,
        release: Callable[[Any], object],
        *,
        kind: str = "handle",
        depends_on: Iterable[Handle] = (),
        exit_policy: Optional[ExitPolicy] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Start owning ``raw``; ``release(raw)`` is called exactly once, or never if leaked.

        ``depends_on``: handles (or pins) of this registry that must outlive
        this one.  ``exit_policy`` overrides the registry's default for this
        handle at teardown.  ``timeout`` bounds its release step at teardown.
        ``kind="library"`` makes it a library: released after everything
        else at teardown.  After teardown began, the new handle is leaked at
        once (``leaked_after_close``; strict mode raises
        :class:`RegistryClosedError`).
        """
        if not callable(release):
            raise TypeError(f"release must be callable, got {type(release).__name__}")
        if type(kind) is not str:
            raise TypeError(f"kind must be a str, got {type(kind).__name__}")
        if name is not None and type(name) is not str:
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        if exit_policy is not None:
            _check_policy(exit_policy, "exit_policy")
        if timeout is not None:
            timeout = _check_timeout(timeout, "timeout")
        role = ROLE_LIBRARY if kind == "library" else ROLE_HANDLE
        if depends_on:
            parents = self._parent_nodes(depends_on, "depends_on")
            node = Handle(self, raw, release, kind, name, parents, exit_policy, timeout, role)
            return self._register_node(node)
        # Fast path (no dependencies): nothing to validate under the lock.
        node = Handle(self, raw, release, kind, name, (), exit_policy, timeout, role)
        lock = self._lock
        if not lock.acquire(False):
            _wait_for(lock)
        try:
            if self._phase:
                is_open = False
            else:
                is_open = True
                seq = self._seq = self._seq + 1
                node._seq = seq
                self._live[seq] = _weakref(node)
        finally:
            lock.release()
        if not is_open:
            return self._registered_after_close(node)
        if self._gc_queue:
            self._drain_gc_queue()
        return node

    def pin(
        self,
        library: object,
        *,
        close: Optional[Callable[[Any], object]] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Hold a loaded library so it is not unloaded while anything depending on it lives.

        Returns a handle of kind ``"library"``: pass it in ``depends_on`` of
        every handle whose release runs the library's code.  At teardown
        libraries go last.  ``close(library)`` (for example ``ffi.dlclose``)
        runs when the pin is released; without ``close`` the library object
        stays referenced for the rest of the process, so it is never
        unloaded by exitsafe's doing.
        """
        if library is None:
            raise TypeError("pin() needs a loaded library object, got None")
        if close is None:
            release: Callable[[Any], object] = _states.kept_alive.append
        elif callable(close):
            release = close
        else:
            raise TypeError(f"close must be callable or None, got {type(close).__name__}")
        return self.track(library, release, kind="library", name=name, timeout=timeout)

    def on_teardown(
        self,
        fn: Callable[[], object],
        *,
        before: Iterable[Handle] = (),
        after: Iterable[Handle] = (),
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Register ``fn()`` to run once during this registry's teardown.

        The hook is a node of the same graph: it runs before every handle in
        ``before`` is released (e.g. "flush the queue" before the buffers go)
        and after every handle in ``after`` is released or leaked.  Hooks with
        no such constraint run first.  An exception is logged and recorded
        (``hook_failed``); a hook overrunning ``timeout`` is abandoned
        (``hook_timeout``) and the handles in ``before`` are then leaked.
        ``release()`` on the returned handle cancels the hook; dropping the
        handle does not.

        Until it runs or is cancelled, the hook refers to the handles in
        ``before``: dropping your last reference to one of them does not
        release it before the hook (garbage collection cannot reach it), while
        an explicit ``release()`` on it still releases it at once (the edge
        orders the teardown; it does not defer releases).
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if name is not None and type(name) is not str:
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        if timeout is not None:
            timeout = _check_timeout(timeout, "timeout")
        parents = self._parent_nodes(before, "before") if before else ()
        children = self._parent_nodes(after, "after") if after else ()
        hook_name = name if name is not None else getattr(fn, "__qualname__", None)
        node = _HookHandle(
            self, None, _call_no_arg(fn), "hook", hook_name, parents, None, timeout, ROLE_HOOK
        )
        return self._register_node(node, children)

    def _parent_nodes(self, handles: Iterable[Handle], what: str) -> tuple[Handle, ...]:
        if isinstance(handles, Handle):
            handles = (handles,)
        try:
            items = tuple(handles)
        except TypeError:
            raise TypeError(
                f"{what} must be a Handle or an iterable of Handles, got {type(handles).__name__}"
            ) from None
        nodes = []
        for item in items:
            if not isinstance(item, Handle):
                raise TypeError(
                    f"{what} must contain exitsafe Handles (from track/pin/on_teardown), "
                    f"got {type(item).__name__}"
                )
            node = item
            if node._registry is not self:
                raise ForeignHandleError(
                    f"{what}: {node.name!r} belongs to registry {node._registry.name!r}, "
                    f"not {self.name!r}; dependencies cannot cross registries"
                )
            nodes.append(node)
        return unique(nodes)

    def _register_node(self, node: Handle, children: tuple[Handle, ...] = ()) -> Handle:
        parents = node._parents
        with self._lock:
            if self._phase == _OPEN:
                error: Optional[Exception] = None
                for parent in parents:
                    if parent._state != _LIVE or not parent._refs:
                        error = HandleClosedError("depends_on: " + self._closed_message(parent))
                        break
                for child in children if error is None else ():
                    if child._state != _LIVE:
                        error = HandleClosedError("after: " + self._closed_message(child))
                        break
                    for parent in parents:
                        path = dependency_path(parent, child)
                        if path is not None:
                            error = self._cycle_error(node, path)
                            break
                    if error is not None:
                        break
                if error is not None:
                    _disown(node)
                    raise error
                self._seq += 1
                node._seq = self._seq
                if node._role != ROLE_HOOK:
                    # A hook's "before" edges order the teardown only; they must not keep
                    # those handles alive during normal operation.
                    for parent in parents:
                        parent._children += 1
                for child in children:
                    child._parents = (*child._parents, node)
                    node._children += 1
                self._live[node._seq] = _weakref(node)
                if node._role == ROLE_HOOK:
                    self._hooks[node._seq] = node
                is_open = True
            else:
                is_open = False
        if not is_open:
            return self._registered_after_close(node)
        if self._gc_queue:
            self._drain_gc_queue()
        return node

    def _registered_after_close(self, node: Handle) -> Handle:
        if self.strict:
            _disown(node)
            raise RegistryClosedError(
                f"registry {self.name!r} is closed (its teardown began); "
                f"cannot register {node.kind} {node.name!r}"
            )
        with self._lock:
            self._seq += 1
            node._seq = self._seq
            node._state = _LEAKED
            node._refs = 0
            self._record(node, Outcome.LEAKED_AFTER_CLOSE, "registered after teardown began", True)
            if node._raw is not None:
                _states.kept_alive.append(node._raw)
        self._after_unlock()
        log().info("%s %r registered after teardown began: leaked", node.kind, node.name)
        return node

    def _cycle_error(self, new: Handle, path: list[Handle]) -> DependencyCycleError:
        # path: before-target ... -> after-handle; the new hook closes it.
        names = [new.name, *(n.name for n in path), new.name]
        return DependencyCycleError(
            "dependency cycle: " + " -> ".join(names) + " (each depends on the next)", names
        )

    def _add_dependencies(self, node: Handle, others: tuple[Handle, ...]) -> None:
        parents = self._parent_nodes(others, "add_dependency")
        with self._lock:
            if node._state != _LIVE or not node._refs:
                raise HandleClosedError(self._closed_message(node))
            if self._phase != _OPEN:
                raise RegistryClosedError(f"registry {self.name!r} is closed")
            new = []
            for parent in parents:
                if parent._state != _LIVE or not parent._refs:
                    raise HandleClosedError("add_dependency: " + self._closed_message(parent))
                if parent in node._parents:
                    continue
                path = dependency_path(parent, node)
                if path is not None:
                    names = [node.name, *(n.name for n in path)]
                    raise DependencyCycleError(
                        "dependency cycle: " + " -> ".join(names) + " (each depends on the next)",
                        names,
                    )
                new.append(parent)
            if node._role != ROLE_HOOK:  # a hook's edges only order the teardown
                for parent in new:
                    parent._children += 1
            node._parents = (*node._parents, *new)
        self._after_unlock()

    # ------------------------------------------------------------------ releasing

    def _closed_message(self, node: Handle) -> str:
        state = node._state
        if state == _RELEASED:
            what = "was released"
        elif state == _LEAKED:
            what = "was leaked"
        elif state == _RELEASING:
            what = "is being released"
        else:
            what = "has no owner left (its release is pending"
            if node._children:
                what += f" until {node._children} dependent(s) are released"
            what += ")"
        return f"{node.kind} {node.name!r} {what}; its native object must not be used"

    def _drop_owner(self, node: Handle) -> None:
        if self._is_closed:
            # Checked first and through an attribute only: this may run from a finalizer
            # during interpreter shutdown, when module globals can already be None.
            self._late_requests += 1
            if self._trace:
                self._trace_late(node)
            return
        lock = self._lock
        if not lock.acquire(False):
            _wait_for(lock)
        try:
            if node._state != _LIVE or not node._refs:
                target = None
            elif self.strict and node._refs == 1 and node._children:
                raise LiveDependentsError(
                    f"{node.kind} {node.name!r} still has live dependents: "
                    + ", ".join(self._dependent_names(node))
                    + "; release them first",
                    self._dependent_names(node),
                )
            else:
                node._refs -= 1
                if node._refs or node._children or node._borrows or self._phase:
                    target = None  # deferred (or left to the running teardown)
                else:
                    node._state = _RELEASING
                    target = node
        finally:
            lock.release()
        if target is None:
            error = None
        elif target._parents or target._taint is not None or target._gen != _states.fork_generation:
            error = self._release_chain(target)
        else:
            # Fast path: nothing depends on the outcome, so no chain to follow.
            try:
                target._fn(target._raw)  # type: ignore[misc]
            except BaseException as exc:  # recorded, then re-raised to the caller
                with self._lock:
                    self._finish_locked(target, Outcome.RELEASE_FAILED, repr(exc), False)
                error = exc
            else:
                if not lock.acquire(False):
                    _wait_for(lock)
                try:
                    self._finish_released_locked(target)
                finally:
                    lock.release()
                error = None
        if self._gc_queue:
            self._drain_gc_queue()
        if error is not None:
            raise error

    def _after_unlock(self) -> None:
        """Release what garbage collection queued while the lock was held (see _collected)."""
        if self._gc_queue:
            self._drain_gc_queue()

    def _finish_released_locked(self, node: Handle) -> None:
        """:meth:`_finish_locked` for a handle without dependencies released by its owners."""
        node._state = _RELEASED
        del self._live[node._seq]
        counts = self._counts
        counts["released"] = counts.get("released", 0) + 1
        if self._ledger_limit != 0:
            entries = self._entries
            entries.append((node._seq, node.kind, node._name, "released", None, False))
            if self._ledger_limit is not None and len(entries) > 2 * self._ledger_limit:
                self._trim_entries()
        else:
            self._dropped_entries += 1
        node._raw = node._fn = None

    def _trim_entries(self) -> None:
        limit = self._ledger_limit
        assert limit is not None
        drop = len(self._entries) - limit
        del self._entries[:drop]
        self._dropped_entries += drop

    def _dependent_names(self, node: Handle) -> list[str]:
        return [n.name for n in self._snapshot() if node in n._parents and n._state <= _RELEASING]

    def _snapshot(self) -> list[Handle]:
        """The handles and hooks not yet ended, oldest first (caller holds the lock)."""
        found = [r() for r in self._live.values()]
        return [n for n in found if n is not None]

    def _collected(self, node: Handle) -> None:
        # Called from Handle.__del__, on any thread, possibly while this very thread is
        # inside one of our critical sections (GC can run on any allocation).  So never
        # block on the lock here: queue the node; whoever holds the lock drains the
        # queue right after releasing it.
        if self._is_closed and node._state:
            self._late_requests += 1
            if self._trace:
                self._trace_late(node)
            return
        if node._state:
            return
        # Live: either an ordinary drop, or, once teardown has begun, a handle its
        # snapshot never saw (a cyclic collection had cleared our weak reference to it
        # before the snapshot and ran __del__ after it); the drain leaks the latter.
        self._gc_queue.append(node)
        self._drain_gc_queue()

    def _drain_gc_queue(self) -> None:
        # The queue is one list for the registry's life, emptied with pop(): swapping
        # in a new list would lose a node that a finalizer on another thread appends
        # to the old one between its load of the attribute and the append.
        lock = self._lock
        queue = self._gc_queue
        while queue:
            if not lock.acquire(False):
                return  # the holder drains after releasing
            try:
                targets = []
                while queue:
                    node = queue.pop()
                    if node._state == _LIVE and node._refs:
                        if self._phase:
                            self._leak_missed_locked(node)
                            continue
                        node._refs = 0
                        if not (node._children or node._borrows or self._phase):
                            node._state = _RELEASING
                            targets.append(node)
            finally:
                lock.release()
            for node in targets:
                error = self._release_chain(node)
                if error is not None:
                    # Log the repr, not the exception: a handler that keeps records
                    # (pytest's caplog, a MemoryHandler) would otherwise keep its
                    # traceback, and through its frames every handle they refer to.
                    log().error(
                        "release of %s %r failed after its last reference was dropped: %s",
                        node.kind,
                        node.name,
                        repr(error),
                    )
                    error = None

    def _leak_missed_locked(self, node: Handle) -> None:
        # Teardown claims every handle of its snapshot in the section that begins it,
        # so a handle still live after that was not in the snapshot (a collection had
        # cleared our weak reference to it).  Native code must not run any more: leak
        # it, so that it still ends in exactly one outcome, and taint its parents.
        node._refs = 0
        self._finish_locked(
            node, Outcome.LEAKED_AFTER_CLOSE, "collected while teardown began, unseen by it", True
        )

    def _end_borrow(self, node: Handle) -> None:
        with self._lock:
            node._borrows -= 1
            if node._state == _LIVE and not (
                node._refs or node._children or node._borrows or self._phase
            ):
                node._state = _RELEASING
                target = node
            else:
                target = None
        error = self._release_chain(target) if target is not None else None
        if self._gc_queue:
            self._drain_gc_queue()
        if error is not None:
            raise error

    def _cancel_hook(self, node: Handle) -> None:
        with self._lock:
            if node._state == _LIVE and self._phase == _OPEN:
                self._finish_locked(node, Outcome.HOOK_CANCELLED, None, False)
        if self._gc_queue:
            self._drain_gc_queue()

    def _release_chain(self, first: Handle) -> Optional[BaseException]:
        """Release ``first`` (already claimed) and every parent it frees, iteratively."""
        pending = [first]
        error: Optional[BaseException] = None
        while pending:
            node = pending.pop()
            if node._gen != _states.fork_generation:
                outcome, detail = Outcome.LEAKED_INHERITED, "inherited from the parent process"
            elif node._taint is not None:
                outcome, detail = Outcome.LEAKED_DEPENDENT, node._taint
            else:
                fn = node._fn
                assert fn is not None
                try:
                    fn(node._raw)
                except BaseException as exc:  # recorded, then re-raised to the caller
                    outcome, detail = Outcome.RELEASE_FAILED, repr(exc)
                    if error is None:
                        error = exc
                else:
                    outcome, detail = Outcome.RELEASED, None
            lock = self._lock
            if not lock.acquire(False):
                _wait_for(lock)
            try:
                pending.extend(self._finish_locked(node, outcome, detail, False))
            finally:
                lock.release()
        return error

    def _finish_locked(
        self, node: Handle, outcome: str, detail: Optional[str], at_exit: bool
    ) -> list[Handle]:
        """Record ``node``'s outcome; return the parents it was the last obstacle for."""
        tainting = outcome in _TAINTING
        node._state = _LEAKED if tainting else _RELEASED
        self._live.pop(node._seq, None)
        if node._role == ROLE_HOOK:
            self._hooks.pop(node._seq, None)
        self._record(node, outcome, detail, at_exit)
        if tainting:
            if node._raw is not None:
                _states.kept_alive.append(node._raw)
            reason = f"{node.kind} {node.name!r} depending on it ended {outcome}"
        node._raw = None
        node._fn = None
        parents, node._parents = node._parents, ()
        ready: list[Handle] = []
        if node._role == ROLE_HOOK:
            # A hook's edges are soft (they never kept anything alive), but a hook that
            # was abandoned may still touch what it was to run before: leak that.
            if tainting:
                for parent in parents:
                    if parent._taint is None:
                        parent._taint = reason
            return ready
        open_ = self._phase == _OPEN
        for parent in parents:
            parent._children -= 1
            if tainting and parent._taint is None:
                parent._taint = reason
            if (
                open_
                and parent._state == _LIVE
                and not (parent._children or parent._refs or parent._borrows)
            ):
                parent._state = _RELEASING
                ready.append(parent)
        return ready

    def _record_teardown(self, records: list[tuple[Handle, str, Optional[str]]]) -> None:
        """Record the outcomes a teardown decided (caller holds the lock)."""
        live = self._live
        hooks = self._hooks
        for node, outcome, detail in records:
            seq = node._seq
            live.pop(seq, None)
            if node._role == ROLE_HOOK:
                hooks.pop(seq, None)
            self._record(node, outcome, detail, True)

    def _record(self, node: Handle, outcome: str, detail: Optional[str], at_exit: bool) -> None:
        counts = self._counts
        counts[outcome] = counts.get(outcome, 0) + 1
        limit = self._ledger_limit
        if limit == 0:
            self._dropped_entries += 1
            return
        entries = self._entries
        entries.append((node._seq, node.kind, node._name, outcome, detail, at_exit))
        if limit is not None and len(entries) > 2 * limit:
            self._trim_entries()

    # ------------------------------------------------------------------ teardown

    @property
    def closed(self) -> bool:
        """Whether teardown has completed: every release request is now a no-op."""
        return self._phase == _CLOSED

    @property
    def tearing_down(self) -> bool:
        """Whether teardown has begun (guarded callbacks are already no-ops)."""
        return self._phase != _OPEN

    def teardown(self, reason: str = "explicit") -> None:
        """Release or leak every live handle in dependency order, run the hooks, then close.

        Order: a step runs only after every handle depending on it is done;
        among ready steps hooks go first, libraries last, newest first
        otherwise.  Each handle is released or leaked by its exit policy,
        the registry's default, or ``EXITSAFE_AT_EXIT``; a borrowed handle is
        leaked (``leaked_in_use``), and whatever a leaked handle depends on is
        leaked too.  A release that raises is logged and recorded and
        teardown goes on.  Idempotent: a second call returns at once; a call
        from another thread while a teardown runs waits for it to finish.
        Runs automatically at process exit.
        """
        from . import _teardown  # imported on first use: importing exitsafe stays cheap

        me = _get_ident()
        with self._lock:
            phase = self._phase
            if phase == _OPEN:
                self._phase = _TEARING
                self._teardown_thread = me
                self._teardown_lock.acquire()
                snapshot = self._snapshot()
                elsewhere = _teardown.claim(snapshot)
        if phase != _OPEN:
            if phase == _TEARING and self._teardown_thread != me:
                total = self._total_timeout()
                if self._teardown_lock.acquire(True, -1 if total is None else total):
                    self._teardown_lock.release()
            return
        try:
            _teardown.execute(self, snapshot, elsewhere, reason)
        finally:
            with self._lock:
                self._phase = _CLOSED
                self._is_closed = True
                self._teardown_thread = None
            self._teardown_lock.release()
            self._after_unlock()

    def _total_timeout(self) -> Optional[float]:
        if self.teardown_timeout is not None:
            return self.teardown_timeout
        return _config.seconds("EXITSAFE_TEARDOWN_TIMEOUT")

    def _trace_late(self, node: Handle) -> None:
        try:
            emit(
                f"exitsafe: late-release registry={quote(self.name)} kind={quote(node.kind)}"
                f" name={quote(node.name)}"
            )
        except Exception:
            # Late in interpreter finalization this module's globals may be None; the
            # trace line is best effort and must never turn into shutdown noise.
            pass

    # ------------------------------------------------------------------ inspection

    def ledger(self) -> list[LedgerEntry]:
        """The recorded outcomes, oldest first (at most ``ledger_limit`` of the newest)."""
        with self._lock:
            entries = list(self._entries)
            limit = self._ledger_limit
        self._after_unlock()
        if limit is not None and len(entries) > limit:
            entries = entries[len(entries) - limit :]
        registry = self.name
        return [
            LedgerEntry(
                registry,
                seq,
                kind,
                name if name is not None else f"{kind}#{seq}",
                outcome,
                detail,
                at_exit,
            )
            for seq, kind, name, outcome, detail, at_exit in entries
        ]

    def ledger_counts(self) -> dict[str, int]:
        """How many handles ended in each outcome (exact, never truncated)."""
        with self._lock:
            counts = dict(self._counts)
        self._after_unlock()
        return counts

    @property
    def late_requests(self) -> int:
        """How many release requests arrived after close and were ignored."""
        return self._late_requests

    def live_handles(self) -> list[Handle]:
        """A snapshot of the records of every handle and hook not yet ended, oldest first."""
        with self._lock:
            found = [n for n in self._snapshot() if n._state <= _RELEASING]
        self._after_unlock()
        return found

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        phase = ("open", "tearing down", "closed")[self._phase]
        return f"<exitsafe.Registry {self.name!r} {phase} live={len(self._live)}>"

    def _as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counts": self.ledger_counts(),
            "late_requests": self._late_requests,
            "dropped_entries": self._dropped_entries,
            "entries": [e.as_dict() for e in self.ledger()],
        }

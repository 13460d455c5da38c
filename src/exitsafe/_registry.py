"""The registry: the coordinator of one graph of handles, its owners, ledger and teardown.

A [`Registry`][exitsafe.Registry] owns a graph of native handles.  Each handle has a release
function, a kind, an owner count, and the handles it *depends on* (which must outlive
it).  The native release of a handle runs exactly once, when its owner count is zero
**and** no handle depending on it is still alive, or never when the handle is leaked.

At process exit (before the interpreter finalizes modules) every registry runs its
**teardown**: hooks and handles in dependency order, each handle released or leaked
according to its exit policy.  After teardown the registry is *closed*: every later
release request, from any thread and from finalizers running during interpreter
shutdown, is a recorded no-op that never calls native code.

Layers: the registry refers to its handles (each its own
`Node` record) weakly, hooks strongly, changes them only under
`exitsafe._sync.LOCK` following the lock discipline written there, asks
`exitsafe._graph` about edges, records outcomes in its
`Ledger`, and hands the teardown to `exitsafe._teardown`.
"""

from __future__ import annotations

import _thread
import sys

from . import _graph, _sync, _threads
from ._borrowing import Borrowing
from ._checks import check_name, check_policy, check_timeout
from ._closing import Closing
from ._core import speedups
from ._errors import (
    DependencyCycleError,
    ForeignHandleError,
    HandleClosedError,
    LiveDependentsError,
    RegistryClosedError,
)
from ._handle import Handle, HandleInfo, OwnedHandle, closed_message
from ._hooks import HookRegistration
from ._inspection import Inspection
from ._ledger import Ledger, Outcome, quote
from ._live import LiveTable
from ._node import (
    DETACHED,
    ENDED_AT_EXIT,
    HANDLE,
    HOOK,
    LEAKED,
    LIBRARY,
    LIVE,
    RELEASED,
    RELEASING,
    TAINTING,
)
from ._node import Node as _Node
from ._pending import _run_mine_quietly
from ._phase import CLOSED, OPEN
from ._process import keep_forever
from ._report import error_from_finalizer, log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional, Union

    ExitPolicy = Union[str, Callable[[HandleInfo], str]]

__all__ = ["Registry"]


_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_release = _sync.release
_wait = _sync.wait
_enter_to_record = _sync.enter_to_record
_deferred = _sync._deferred  # the queue itself: a cheap truthiness test on the hot path
_run_deferred = _sync.run_deferred
_defer = _sync.defer
_refused = _sync.refused
_RELEASED = Outcome.RELEASED
_affine = _threads.pending  # owner thread -> queued releases: a cheap truthiness test
_new_handle = object.__new__


def _emit_late_release(
    registry: str, kind: str, name: str, _quote: Any = quote, _sys: Any = sys
) -> None:
    """Print the trace line of a late release request, best effort.

    It may run from a finalizer late in interpreter shutdown, when module globals can
    already be None: what it needs comes in through its default arguments.
    """
    try:
        stream = _sys.stderr
        if stream is not None:
            stream.write(
                f"exitsafe: late-release registry={_quote(registry)} kind={_quote(kind)}"
                f" name={_quote(name)}\n"
            )
            stream.flush()
    except Exception:  # a closed or broken stderr at exit: the trace must never add noise
        pass


if TYPE_CHECKING or speedups is None:

    class _RegistryBase:
        """The pure-Python core: the registry's fields are ordinary attributes."""

        __slots__ = ()

else:
    # The compiled core keeps the hot path's fields (_phase, _seq, _live...) in C.
    _RegistryBase = speedups.RegistryCore


class Registry(_RegistryBase, HookRegistration, Borrowing, Closing, Inspection):
    """An independent graph of handles with its own teardown.

    Every registry is torn down at process exit, newest registry first, each in its own
    dependency order.  A registry created once the exit teardown has begun is torn down by
    it too, or, once it has finished, is closed at once.  A registry with teardown hooks is
    kept alive by exitsafe until its teardown.  Most programs use the process-wide
    [`default_registry()`][exitsafe.default_registry] through the module-level functions; a
    registry of your own tears down on its own and can be torn down early.

    Thread rules: every method may be called from any thread.  Release functions, hooks and
    policies run on the thread that caused them (the thread dropping the last owner, or the
    thread running the teardown; with a timeout, a teardown worker thread), never while
    exitsafe holds its lock, and may call back into exitsafe.

    Args:
        name: labels the registry in the ledger and the trace.
        strict: turn misuse that is otherwise absorbed into exceptions:
            [`LiveDependentsError`][exitsafe.LiveDependentsError] for releasing a handle with
            live dependents, [`RegistryClosedError`][exitsafe.RegistryClosedError] for
            registering after teardown.
        exit_policy: the default for handles that name none: `"release"`, `"leak"` or a
            callable taking a [`HandleInfo`][exitsafe.HandleInfo] and returning one of them
            (see [`exitsafe.policies`][exitsafe.policies]).
        step_timeout: seconds one teardown step may take before it is abandoned and leaked;
            `None`: `EXITSAFE_STEP_TIMEOUT`, else no bound.
        teardown_timeout: seconds the whole teardown may take; steps after that are leaked.
            `None`: `EXITSAFE_TEARDOWN_TIMEOUT`, else no bound.
        ledger_limit: how many ledger entries are kept (oldest dropped first;
            [`ledger_counts`][exitsafe.Registry.ledger_counts] stays exact); `None` keeps all.

    Attributes:
        name: the registry's name.
        strict: whether misuse raises.

    Example:
        ```python
        gpu = exitsafe.Registry("gpu", exit_policy="leak", step_timeout=2.0)
        dev = gpu.track(lib.device_create(), lib.device_free, kind="device")
        ```
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
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        check_policy(exit_policy, "exit_policy")
        if ledger_limit is not None and (
            isinstance(ledger_limit, bool) or not isinstance(ledger_limit, int) or ledger_limit < 0
        ):
            raise ValueError(
                f"ledger_limit must be a non-negative int or None, got {ledger_limit!r}"
            )
        self.name = name
        self.strict = strict
        self._exit_policy: ExitPolicy = exit_policy
        self._step_timeout = check_timeout(step_timeout, "step_timeout")
        self._teardown_timeout = check_timeout(teardown_timeout, "teardown_timeout")
        self._ledger = Ledger(ledger_limit)
        self._records = self._ledger.records  # appended to by the release hot path
        # ... which trims it beyond this many (a C size in the compiled core)
        self._cap = min(self._ledger.cap, sys.maxsize)
        self._phase = OPEN
        self._seq = 0
        # Every handle not yet ended, held weakly (dropping the last reference to a
        # handle releases it), and every hook, owned until teardown (see _live).
        self._live: Any = LiveTable()
        self._hooks = 0  # hooks registered and not yet ended
        self._trace = False
        self._teardown_thread = 0
        #: Threads that may still borrow once the teardown began: its own, its workers.
        self._teardown_threads: set[int] = set()
        self._teardown_done: Any = None  # a lock held while the teardown runs
        #: The running teardown's claimed nodes, its nodes elsewhere and its decisions,
        #: until it records them (see Closing.finish_own_teardown).
        self._in_progress: Any = None
        self._parked = 0  # threads parked at a borrow after the teardown began
        self._early: dict[int, Handle] = {}  # early hooks not yet run (owned)
        self._early_ran = False
        from . import _process

        if not _process.register(self):
            self._phase = CLOSED  # the process's exit teardown already finished

    # ------------------------------------------------------------------ settings

    @property
    def exit_policy(self) -> ExitPolicy:
        """The exit policy of handles that name none."""
        return self._exit_policy

    @exit_policy.setter
    def exit_policy(self, value: ExitPolicy) -> None:
        check_policy(value, "exit_policy")
        self._exit_policy = value

    @property
    def step_timeout(self) -> Optional[float]:
        """Seconds one teardown step may take before it is abandoned and leaked (or ``None``)."""
        return self._step_timeout

    @step_timeout.setter
    def step_timeout(self, value: Optional[float]) -> None:
        self._step_timeout = check_timeout(value, "step_timeout")

    @property
    def teardown_timeout(self) -> Optional[float]:
        """Seconds the whole teardown may take; steps after that are leaked (or ``None``)."""
        return self._teardown_timeout

    @teardown_timeout.setter
    def teardown_timeout(self, value: Optional[float]) -> None:
        self._teardown_timeout = check_timeout(value, "teardown_timeout")

    # ------------------------------------------------------------------ registration

    def track(
        self,
        raw: object,
        release: Callable[[Any], object],
        kind: str = "handle",
        depends_on: Iterable[Handle] = (),
        exit_policy: Optional[ExitPolicy] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        affinity: Optional[str] = None,
    ) -> Handle:
        """Start owning `raw`: `release(raw)` is called exactly once, or never if leaked.

        After teardown began, the new handle is leaked at once (`leaked_after_close`).  For
        cffi and ctypes pointers prefer [`exitsafe.cffi.track`][exitsafe.cffi.track] /
        [`exitsafe.ctypes.track`][exitsafe.ctypes.track], which check the pointer and find the
        library's pin.

        The options after `release` are usually given by keyword, as here; they are
        positional-or-keyword (in this order) because CPython makes a cheaper call to a
        function without keyword-only parameters, which matters on the hot path of the
        pure-Python core.

        Args:
            raw: the native object (a pointer, an integer handle, any object); kept referenced
                by the handle and passed to `release`.
            release: the native release function, called as `release(raw)` when the last owner
                lets go and no dependent is alive, or at teardown in dependency order.  It runs
                on the thread that drops the last owner or on the teardown thread, never while
                exitsafe holds its lock.
            kind: a label (`"device"`, `"buffer"`...) shown in the ledger and the trace, and
                passed to exit policies; `"library"` also makes the handle go last at teardown,
                after everything else.
            depends_on: handles (or pins) of this registry that must outlive this one.
            exit_policy: overrides the registry's default for this handle at teardown; `None`:
                the registry's [`exit_policy`][exitsafe.Registry.exit_policy].
            name: its display name; default `"<kind>#<n>"`.
            timeout: seconds its release step may take at teardown before it is abandoned and
                leaked; `None`: the registry's [`step_timeout`][exitsafe.Registry.step_timeout].
            affinity: `"creator"` or `"main"` makes the release run only on that thread (GL
                contexts, some GPU and GUI objects): a release that becomes due on another
                thread (garbage collection, an owner dropped elsewhere) is queued and run by the
                owning thread at its next exitsafe call or
                [`run_pending()`][exitsafe.run_pending]; see the threads page for the teardown's
                rules.  `None`: any thread.

        Returns:
            The new handle, holding one owner.

        Raises:
            RegistryClosedError: strict mode only, when teardown has begun.
            HandleClosedError: a handle in `depends_on` is no longer usable.
            ForeignHandleError: a handle in `depends_on` belongs to another registry.

        Whenever `track` raises, the caller still owns `raw`: nothing will release it.  That
        includes an error raised after the registration by the work a finalizer queued (see
        the threads page), such as a `KeyboardInterrupt`: the handle is then recorded
        `detached`.
        """
        if not callable(release):
            raise TypeError(f"release must be callable, got {type(release).__name__}")
        if type(kind) is not str:
            raise TypeError(f"kind must be a str, got {type(kind).__name__}")
        if name is not None:
            check_name(name)
        if exit_policy is not None:
            check_policy(exit_policy, "exit_policy")
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        owner = _threads.affinity_owner(affinity) if affinity is not None else None
        if _reentered():
            raise _refused("track()")
        parents = self._parent_handles(depends_on, "depends_on") if depends_on else ()
        # Node._init, inlined (no frame): every field of the record, once.  The owner count
        # last: until it is set, the handle's __del__ does nothing (an interrupt may land
        # after any call here, and a half-made record must not be released or read).
        node = _new_handle(OwnedHandle)
        node._seq = 0
        node._rank = 0.0
        node._registry = self
        node._raw = raw
        node._fn = release
        node._kind = kind
        node._name = name
        node._parents = parents
        node._policy = exit_policy
        node._timeout = timeout
        node._role = LIBRARY if kind == "library" else HANDLE
        node._children = 0
        node._borrows = 0
        node._state = LIVE
        node._releaser = 0
        node._taint = None
        node._gen = _sync.generation
        node._thread_id = _get_ident()
        node._affinity = owner
        node._in_child = False
        node._refs = 1
        if parents or self._phase == CLOSED:
            if self._phase == CLOSED:  # no lock after close: see _registered_after_close
                self._registered_after_close(node)
            else:
                self._register(node, (), run_deferred=False)
                if _deferred:
                    self._run_deferred_after_track(node)
            return node
        # Fast path (no dependencies): nothing to validate under the lock.  The lock is
        # taken inside the try: Python may raise a KeyboardInterrupt right after it.
        try:
            try:
                if not _acquire(False):
                    _wait()
                if self._phase:
                    is_open = False
                else:
                    is_open = True
                    seq = node._seq = self._next_seq()
                    node._rank = seq
                    self._live.add(node, False)
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
        except BaseException:  # interrupted (KeyboardInterrupt): the caller still owns raw
            if node._seq:  # registered meanwhile
                self._undo_track(node)
            else:
                _disown(node)
            raise
        if not is_open:
            node._seq = 0
            node._rank = 0.0
            self._registered_after_close(node)
            if _affine:
                _run_mine_quietly()
        elif _deferred or _affine:
            self._run_deferred_after_track(node, affine=True)
        return node

    def _run_deferred_after_track(self, node: _Node, affine: bool = False) -> None:
        """Run the queued work after the registration of ``node`` by ``track()`` (and,
        with ``affine``, this thread's queued thread-affine releases); if it raises (a
        ``KeyboardInterrupt`` in a queued release, a logging filter that raises), undo the
        registration before ``track()`` raises it: the caller never got the handle and
        still owns the object (see `_undo_track`)."""
        try:
            if _deferred:
                _run_deferred()
            if affine and _affine:
                _run_mine_quietly()
        except BaseException:
            self._undo_track(node)
            raise

    def _undo_track(self, node: _Node) -> None:
        """Detach ``node``, registered by a ``track()`` that raises after all: recorded
        ``detached``, never released (its caller still owns the object), and each parent
        it was the last dependent of is released as usual.  Both cores call it.

        A node the teardown may already have planned (the registry is no longer open) is
        left to the teardown: that window, a teardown beginning on another thread while
        queued work raises here, is the one case where ``track()`` raises and the object
        is still released.  Runs no queued work: the error in flight is the caller's.
        """
        trash: list[object] = []
        try:
            _sync.enter()
            if (
                self._phase != OPEN
                or node._state != LIVE
                or node._refs != 1
                or node._borrows
                or node._children
            ):
                return
            node._refs = 0
            ready = self._finish(node, Outcome.DETACHED, None, False, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()
        for parent in ready:
            self._release_chain(parent)  # (an error is recorded; the caller's is raised)

    def _next_seq(self) -> int:
        """A new creation number (the caller holds the lock)."""
        seq = self._seq = self._seq + 1
        return seq

    def pin(
        self,
        library: object,
        *,
        close: Optional[Callable[[Any], object]] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Hold a loaded library so it is not unloaded while anything depending on it lives.

        At teardown libraries go last.  For cffi and ctypes libraries prefer
        [`exitsafe.cffi.pin`][exitsafe.cffi.pin] / [`exitsafe.ctypes.pin`][exitsafe.ctypes.pin],
        which also keep the library file mapped against other closers.

        Args:
            library: the loaded library object; kept referenced until the pin is released.
            close: called as `close(library)` (for example `ffi.dlclose`) when the pin is
                released, after its last dependent; `None`: the library object stays referenced
                for the rest of the process, so it is never unloaded by exitsafe's doing.
            name: its display name; default `"library#<n>"`.
            timeout: seconds `close` may take at teardown before it is abandoned.

        Returns:
            A handle of kind `"library"`: pass it in `depends_on` of every handle whose release
            runs the library's code.
        """
        if library is None:
            raise TypeError("pin() needs a loaded library object, got None")
        if close is None:
            release: Callable[[Any], object] = keep_forever
        elif callable(close):
            release = close
        else:
            raise TypeError(f"close must be callable or None, got {type(close).__name__}")
        return self.track(library, release, kind="library", name=name, timeout=timeout)

    def _parent_handles(self, handles: object, what: str) -> tuple[Handle, ...]:
        if isinstance(handles, Handle):
            items: tuple[object, ...] = (handles,)
        else:
            try:
                items = tuple(handles)  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(
                    f"{what} must be a Handle or an iterable of Handles, "
                    f"got {type(handles).__name__}"
                ) from None
        for item in items:
            if not isinstance(item, Handle):
                hint = (  # a NativeObject wrapper, or any object holding its handle
                    "; pass its .handle" if isinstance(getattr(item, "handle", None), Handle)
                    else ""
                )
                raise TypeError(
                    f"{what} must contain exitsafe Handles (from track/pin/on_teardown), "
                    f"got {type(item).__name__}{hint}"
                )
            registry = item._registry
            if registry is not self:
                raise ForeignHandleError(
                    f"{what}: {item.name!r} belongs to registry {registry.name!r}, "
                    f"not {self.name!r}; dependencies cannot cross registries"
                )
        return _graph.unique(items)  # type: ignore[arg-type,return-value]

    def _register(
        self, node: _Node, after: tuple[Handle, ...], run_deferred: bool = True
    ) -> None:
        """Insert ``node`` (with parents, or a hook) into the graph, or refuse it; then run
        the queued work, unless ``run_deferred`` is false (the caller runs it)."""
        if self._phase == CLOSED:  # no lock after close: see _registered_after_close
            self._registered_after_close(node)
            return
        parents = node._parents
        error: Optional[Exception] = None
        try:
            try:
                _sync.enter()
            except BaseException:  # interrupted while waiting: the caller still owns it
                _disown(node)  # (enter() leaves the lock free when it raises)
                raise
            if self._phase == OPEN:
                error = self._check_new_edges(node, after)
                if error is None:
                    seq = node._seq = self._next_seq()
                    node._rank = seq
                    if node._role != HOOK:
                        # A hook's "before" edges order the teardown only; they must
                        # not keep those handles alive during normal operation.
                        for parent in parents:
                            parent._children += 1
                    for child in after:
                        _graph.add_edge(child, node, self._nodes)
                        child._parents = (*child._parents, node)
                        node._children += 1
                    if node._role == HOOK:
                        self._live.add(node, True)  # owned by the registry until teardown
                        self._hooks += 1
                    else:
                        self._live.add(node, False)
                is_open = True
            else:
                is_open = False
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if error is not None:
            _disown(node)
            raise error
        if not is_open:
            self._registered_after_close(node)
            return
        if node._role == HOOK and self._hooks:
            from . import _process

            _process.keep_until_teardown(self)
        if run_deferred and _deferred:
            _run_deferred()

    def _check_new_edges(self, node: _Node, after: tuple[Handle, ...]) -> Optional[Exception]:
        """Why ``node`` cannot join the graph with its parents and ``after`` edges, or None."""
        for parent in node._parents:
            if (
                parent._state != LIVE
                or not parent._refs
            ):
                what = "before" if node._role == HOOK else "depends_on"
                return HandleClosedError(f"{what}: " + closed_message(parent))
        for cnode in after:
            if cnode._state != LIVE:
                return HandleClosedError("after: " + closed_message(cnode))
            for parent in node._parents:
                # The new edges are cnode -> hook -> parent: a cycle if parent already
                # depends (transitively) on cnode.
                path = _graph.cycle_path(parent, cnode)
                if path is not None:
                    names = [node._display_name(), *(n._display_name() for n in path)]
                    names.append(node._display_name())
                    return DependencyCycleError(
                        "dependency cycle: " + " -> ".join(names) + " (each depends on the next)",
                        names,
                    )
        return None

    def _nodes(self) -> list[_Node]:
        """Every handle and hook not yet ended, oldest first (the caller holds the lock)."""
        nodes: list[_Node] = self._live.nodes()
        return nodes

    def _registered_after_close(self, node: _Node) -> None:
        if self.strict:
            _disown(node)
            raise RegistryClosedError(
                f"registry {self.name!r} is closed (its teardown began); "
                f"cannot register {node._kind} {node._display_name()!r}"
            )
        # Bounded: this may run from a finalizer late in shutdown, when a thread frozen
        # inside exitsafe may hold the lock for ever; then the record is made without it
        # (an append to the ledger is atomic; the creation number may repeat).
        inside = _reentered()  # (then this thread holds the lock already)
        try:
            if not inside:
                _sync.enter_if_possible()
            if not node._seq:
                node._seq = self._next_seq()
            node._state = LEAKED
            node._releaser = ENDED_AT_EXIT  # (a daemon thread's borrow of it parks)
            node._refs = 0
            keep, node._parents = node._parents, ()
            self._ledger.add(
                node._seq, node._kind, node._name, Outcome.LEAKED_AFTER_CLOSE,
                "registered after teardown began", True,
            )
        finally:
            if not inside:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it, or late
                    pass  # in shutdown enter_if_possible gave up)
        if node._role != HOOK and node._raw is not None:
            keep_forever(node._raw)  # never released; never freed by us either
        node._raw = node._fn = None
        del keep  # outside the lock
        try:
            log().info(
                "%s %r registered after teardown began: leaked", node._kind, node._display_name()
            )
        except Exception:  # late in interpreter shutdown logging may be gone: the ledger has it
            pass
        if _deferred:
            _run_deferred()

    def _add_dependencies(self, handle: Handle, others: tuple[object, ...]) -> None:
        from ._adopt import resolve

        parents_h = self._parent_handles(resolve(others, self, "add_dependency"), "add_dependency")
        if _reentered():
            raise _refused("add_dependency()")
        node = handle
        try:
            _sync.enter()
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            if self._phase != OPEN:
                raise RegistryClosedError(f"registry {self.name!r} is closed")
            new = []
            for parent in parents_h:
                if (
                    parent._state != LIVE
                    or not parent._refs
                ):
                    raise HandleClosedError("add_dependency: " + closed_message(parent))
                if parent in node._parents:
                    continue
                path = _graph.cycle_path(parent, node)
                if path is not None:
                    names = [node._display_name(), *(n._display_name() for n in path)]
                    raise DependencyCycleError(
                        "dependency cycle: " + " -> ".join(names) + " (each depends on the next)",
                        names,
                    )
                new.append(parent)
            for parent in new:
                _graph.add_edge(node, parent, self._nodes)
                node._parents = (*node._parents, parent)
                if node._role != HOOK:  # a hook's edges only order the teardown
                    parent._children += 1
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if _deferred:
            _run_deferred()

    # ------------------------------------------------------------------ owners

    def _retain(self, node: _Node) -> None:
        if self._phase == CLOSED:  # every handle ended; no lock after close (_late_request)
            raise HandleClosedError(closed_message(node))
        if _reentered():
            raise _refused("retain()")
        try:
            if not _acquire(False):
                _wait()
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            node._refs += 1
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if _deferred:
            _run_deferred()

    def _drop_owner(self, node: _Node) -> None:
        """``Handle.release()``: drop one owner; release natively when nothing holds it."""
        if self._phase == 2:  # CLOSED, spelled out: this may run from a finalizer late in
            self._late_request(node)  # shutdown, when module globals can already be None
            return
        if _reentered():
            _defer(self._drop_owner, node)
            return
        me = _get_ident()
        target = None
        try:
            try:
                if not _acquire(False):
                    _wait()
                if self._phase == CLOSED:
                    self._ledger.add_late_request()
                    target = None
                    late = True
                else:
                    late = False
                    if node._state != LIVE or not node._refs:
                        target = None  # ended, or being released
                    elif self.strict and node._refs == 1 and node._children:
                        names = self._dependent_names(node)
                        raise LiveDependentsError(
                            f"{node._kind} {node._display_name()!r} still has live dependents: "
                            + ", ".join(names)
                            + "; release them first",
                            names,
                        )
                    else:
                        refs = node._refs = node._refs - 1
                        if refs or node._children or node._borrows or self._phase:
                            target = None  # deferred (or left to the running teardown)
                        else:
                            node._state = RELEASING  # (no call from here to the finally)
                            node._releaser = me
                            target = node
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
        except BaseException:
            if target is not None:
                # Claimed, then interrupted (a Ctrl-C acted on as the section ended): the
                # release asked for happens all the same, recorded, then the interrupt is
                # raised.  (Left claimed, the handle stayed "releasing" for good.)
                self._release_chain(target)
            raise
        if late:
            if self._trace:
                self._trace_late(node)
        elif target is not None:
            if (
                target._parents
                or target._taint is not None
                or target._affinity is not None
                or target._gen != _sync.generation
            ):
                error = self._release_chain(target)
            else:  # _release_leaf, inlined (the hot path)
                try:
                    target._fn(target._raw)  # type: ignore[misc]
                except BaseException as exc:  # recorded, then re-raised to the caller
                    error = self._leaf_failed(target, exc)
                else:
                    error = None
                    try:
                        # _enter_to_record, inlined for its common case (the lock free)
                        try:
                            if not _acquire(False):  # (interrupted: recorded, then raised)
                                error = _enter_to_record()
                        except BaseException as exc:  # raised right after the call
                            error = exc
                            if not _reentered():
                                _enter_to_record()
                        if target._state == RELEASING:  # else a teardown gave up on it
                            target._state = RELEASED
                            target._releaser = 0
                            records = self._records
                            # the record first: an interrupt acted on after a call leaves
                            # at worst a stale entry in the live table, never no outcome
                            records.append(
                                (target._seq, target._kind, target._name, _RELEASED, None, False)
                            )
                            self._live.discard(target)
                            if len(records) > self._ledger.cap:
                                self._ledger.trim()
                    finally:
                        try:
                            _release()
                        except RuntimeError:  # (not held: interrupted before taking it)
                            pass
                    # Outside the lock: dropping these may run the object's __del__.
                    target._raw = target._fn = None
            if _deferred:
                _run_deferred()
            if error is not None:
                try:
                    raise error
                finally:
                    error = None  # (see _release_chain: no frame of ours keeps it)
        elif _deferred:
            _run_deferred()
        if _affine:
            _run_mine_quietly()

    def _release_leaf(self, node: _Node) -> Optional[BaseException]:
        """:meth:`_release_chain` for the common case: a claimed node with no parents, no
        taint, no affinity, not inherited.  The same steps without the chain's bookkeeping
        (:meth:`_drop_owner` runs a copy of it inline)."""
        try:
            node._fn(node._raw)  # type: ignore[misc]
        except BaseException as exc:  # recorded, then returned to the caller
            return self._leaf_failed(node, exc)
        interrupt = None
        try:
            interrupt = _enter_to_record()  # (an interrupt meanwhile: recorded, returned)
            if node._state == RELEASING:  # else a teardown gave up on it and recorded it
                node._state = RELEASED
                node._releaser = 0
                records = self._records
                records.append((node._seq, node._kind, node._name, _RELEASED, None, False))
                self._live.discard(node)  # (after the record: see _drop_owner)
                if len(records) > self._ledger.cap:
                    self._ledger.trim()
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        node._raw = node._fn = None  # outside the lock: this may run the object's __del__
        try:
            return interrupt
        finally:
            del interrupt  # (see _release_chain)

    def _leaf_failed(self, node: _Node, exc: BaseException) -> BaseException:
        """Record that a leaf's release function raised ``exc``; return it to re-raise
        (or the interrupt that came while waiting to record it)."""
        trash: list[object] = []
        interrupt = None
        try:
            interrupt = _enter_to_record()
            self._finish(node, Outcome.RELEASE_FAILED, repr(exc), False, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        try:
            return interrupt if interrupt is not None else exc
        finally:
            del interrupt, exc  # (see _release_chain)

    def _release_failed(self, node: _Node, exc: BaseException) -> Optional[BaseException]:
        """The compiled core's: the release function of ``node`` (claimed) raised ``exc``.

        Record it and go on with the parents this frees, as `_release_chain` does: they
        are tainted by the failure, so they end leaked, never released.  Returns the
        interrupt that came while waiting to record it, for the caller to raise once its
        chain is done (``None``: none).
        """
        trash: list[object] = []
        interrupt = None
        try:
            interrupt = _enter_to_record()
            ready = self._finish(node, Outcome.RELEASE_FAILED, repr(exc), False, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()
        for parent in reversed(ready):  # last first, as _release_chain's stack takes them
            self._release_chain(parent)
        try:
            return interrupt
        finally:
            del interrupt, exc  # (see _release_chain)

    def _queue_for_owner(self, node: _Node) -> None:
        """A release due on a thread that does not own ``node``: queue it for the owner."""
        try:
            _sync.enter()
            _threads.queue_for_owner(node)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass

    def _collected(self, node: _Node) -> None:
        # Handle.__del__ of a handle with owners, on any thread, possibly during
        # interpreter finalization (then the registry is closed) or while this very
        # thread is inside an exitsafe section (a collection can run at any bytecode).
        # Only attributes and builtins here: module globals may already be None.
        if self._phase and node._state:  # claimed by the teardown, or ended: no request
            return
        cls = self.__class__
        if cls._reentered_now():
            cls._defer_now(self._collected_now, node)
            return
        self._collected_now(node)

    def _late_request(self, node: _Node) -> None:
        """Count (and trace) a release request that arrived after close.

        Uses only attributes (see `_drop_owner`) and takes no lock: late in
        interpreter shutdown a thread frozen inside exitsafe may hold it for ever
        (waiting would hang; on 3.15 taking it raises ``PythonFinalizationError``).
        """
        self._ledger.add_late_request()
        if self._trace:
            self._trace_late(node)

    # Reached through the class from methods that may run late in interpreter shutdown,
    # when module globals can already be None.
    _reentered_now = staticmethod(_sync.reentered)
    _defer_now = staticmethod(_sync.defer)

    def _collected_now(self, node: _Node) -> None:
        trash: list[object] = []
        me = _get_ident()
        target = None
        try:
            try:
                if not self._phase:
                    _sync.enter()
                else:  # possibly late in interpreter shutdown: see _sync.enter_if_possible
                    _sync.enter_if_possible()  # (without the lock: no other thread runs)
                if node._state == LIVE and node._refs:
                    if self._phase:
                        # A teardown began but its snapshot did not hold this handle: a cyclic
                        # collection cleared our weak reference to it before running this
                        # finalizer.  Native code must not run any more: leak it, so that it
                        # still ends in exactly one outcome, and taint what it depends on.
                        self._finish(
                            node, Outcome.LEAKED_AFTER_CLOSE,
                            "collected while the teardown began, unseen by it", True, trash,
                        )
                    else:
                        node._refs = 0
                        self._live.hold(node)  # not ended yet: the teardown must see it
                        if not (node._children or node._borrows):
                            node._state = RELEASING  # (no call from here to the finally)
                            node._releaser = me
                            target = node
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
        except BaseException:
            if target is not None:  # claimed, then interrupted: see _drop_owner
                self._release_collected(target)
            raise
        trash.clear()
        if target is not None:
            self._release_collected(target)
        if _deferred:
            _run_deferred()

    def _release_collected(self, node: _Node) -> None:
        """Release ``node``, claimed after its last reference was dropped; log a failure
        (nobody can receive it)."""
        if (
            node._parents
            or node._taint is not None
            or node._affinity is not None
            or node._gen != _sync.generation
        ):
            error = self._release_chain(node)
        else:
            error = self._release_leaf(node)
        if error is not None:
            self._log_collected_failure(node, error)
            error = None  # (see _release_chain)

    def _log_collected_failure(self, node: _Node, error: BaseException) -> None:
        # Log the repr, not the exception: a handler that keeps records (pytest's caplog,
        # a MemoryHandler) would otherwise keep its traceback, and through its frames
        # every handle they refer to.
        error_from_finalizer(
            "release of %s %r failed after its last reference was dropped: %s",
            node._kind,
            node._display_name(),
            repr(error),
        )

    def _settle(self, node: _Node) -> None:
        """Release ``node`` if nothing holds it any more (queued after a re-entrant borrow)."""
        try:
            _sync.enter()
            if (
                node._state == LIVE
                and not (node._refs or node._children or node._borrows)
                and self._phase == OPEN
            ):
                node._state = RELEASING
                node._releaser = _get_ident()
                target: Optional[_Node] = node
            else:
                target = None
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if target is not None:
            error = self._release_chain(target)
            if error is not None:
                try:
                    raise error
                finally:
                    error = None  # (see _release_chain)

    def _dependent_names(self, node: _Node) -> list[str]:
        return [
            n._display_name()
            for n in self._nodes()
            if node in n._parents and n._state <= RELEASING and n._role != HOOK
        ]

    def _detach(self, node: _Node) -> Any:
        if _reentered():
            raise _refused("detach()")
        trash: list[object] = []
        try:
            _sync.enter()
            if self._phase != OPEN:
                raise RegistryClosedError(
                    f"registry {self.name!r} is tearing down or closed; "
                    f"{node._kind} {node._display_name()!r} can no longer be detached"
                )
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            if node._borrows:
                raise HandleClosedError(
                    f"{node._kind} {node._display_name()!r} is borrowed; "
                    f"it cannot be detached while in use"
                )
            if node._children:
                names = self._dependent_names(node)
                raise LiveDependentsError(
                    f"{node._kind} {node._display_name()!r} still has live dependents: "
                    + ", ".join(names)
                    + "; they need it, release them before detaching it",
                    names,
                )
            raw = node._raw
            node._refs = 0  # exitsafe owns nothing of it any more
            ready = self._finish(node, Outcome.DETACHED, None, False, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()
        error = None
        for parent in ready:
            error = self._release_chain(parent) or error
        if _deferred:
            _run_deferred()
        if error is not None:
            try:
                raise error
            finally:
                error = None  # (see _release_chain)
        return raw

    def _release_chain(self, first: _Node) -> Optional[BaseException]:
        """Release ``first`` (already claimed) and every parent it frees, iteratively.

        Runs each release function outside the lock; returns the first exception a
        release function raised (after recording it), for the caller to re-raise.
        """
        pending = [first]
        error: Optional[BaseException] = None
        interrupt: Optional[BaseException] = None
        trash: list[object] = []
        while pending:
            node = pending.pop()
            if (
                node._affinity is not None
                and not _threads.on_owner_thread(node)
                and node._gen == _sync.generation
            ):
                self._queue_for_owner(node)
                continue
            detail: Optional[str] = None
            if node._gen != _sync.generation:  # checked per node: a release may fork
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
                    outcome = Outcome.RELEASED
            try:
                interrupt = _enter_to_record()  # (an interrupt meanwhile: recorded, raised)
                if interrupt is not None:  # (raised rather than a release function's error)
                    error = interrupt
                pending.extend(self._finish(node, outcome, detail, False, trash))
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
            trash.clear()  # drops the raw object and release function: outside the lock
        # The exception's traceback holds this frame, and through its callers' frames
        # (f_back) every object they refer to: a local of this frame (or of any of theirs)
        # holding the exception would make a cycle, keeping all of that, handles of the
        # program included, alive until a collection.  So no frame of ours keeps it.
        try:
            return error
        finally:
            del error, interrupt

    def _finish(
        self,
        node: _Node,
        outcome: str,
        detail: Optional[str],
        at_exit: bool,
        trash: list[object],
        decided: bool = False,
    ) -> list[_Node]:
        """Record ``node``'s outcome; return the parents it was the last obstacle for.

        The caller holds the lock.  References the node drops go to ``trash``, which
        the caller clears after the section (dropping a user object may run its
        ``__del__``).  A node that already ended keeps its outcome (the first recorder
        wins: a teardown that gave up waiting for a release running elsewhere, or the
        release that finished first), unless ``decided``: a teardown recording the
        nodes it settled itself.
        """
        if node._state > RELEASING and not decided:
            return []
        tainting = outcome in TAINTING  # (DETACHED is not: the program owns it now)
        if outcome == Outcome.DETACHED:
            node._state = DETACHED
        else:
            node._state = LEAKED if tainting else RELEASED
        # Once ended, a nonzero ``_releaser`` means "ended at exit" (see _refuse_borrow).
        node._releaser = ENDED_AT_EXIT if at_exit else 0
        # The record before the live-table discard: an interrupt acted on after the
        # discard's call leaves at worst a stale entry, never no outcome (see _drop_owner).
        self._ledger.add(node._seq, node._kind, node._name, outcome, detail, at_exit)
        self._live.discard(node)
        if tainting:
            if node._raw is not None and node._role != HOOK:
                keep_forever(node._raw)  # the native object may live on: keep what it uses
            # A hook's edges are soft (they never kept anything alive), but a hook that
            # was abandoned may still touch what it was to run before: leak that too.
            node._taint_parents(outcome)
        parents, node._parents = node._parents, ()
        trash.append((node._raw, node._fn, parents))
        node._raw = node._fn = None
        ready: list[_Node] = []
        if node._role == HOOK:
            self._hooks -= 1
            return ready
        open_ = self._phase == OPEN
        for parent in parents:
            parent._children -= 1
            if (
                open_
                and parent._state == LIVE
                and not (parent._children or parent._refs or parent._borrows)
            ):
                parent._state = RELEASING
                parent._releaser = _get_ident()
                ready.append(parent)
        return ready

    def _trace_late(self, node: _Node) -> None:
        self.__class__._emit_late_now(self.name, node._kind, node._display_name())

    _emit_late_now = staticmethod(_emit_late_release)


def _disown(node: _Node) -> None:
    """Forget a node whose registration was refused: the caller still owns its object.

    Its handle's finalizer then finds no owner and never calls ``release``.
    """
    node._refs = 0
    node._state = LEAKED
    node._raw = None
    node._fn = None
    node._parents = ()


if speedups is not None:
    from . import _process as _process_module

    # The compiled core's track: its common case in C, every other case handed to the
    # pure-Python Registry.track above (kept as _track_py), so both cores keep one
    # semantics.  Handle.release / retain are set the same way in exitsafe._handle.
    Registry._track_py = Registry.track  # type: ignore[attr-defined]
    speedups.set_doc("RegistryCore", "track", Registry.track.__doc__ or "")
    Registry.track = speedups.RegistryCore.track  # type: ignore[method-assign]
    speedups.setup(
        lock=_sync.LOCK,
        handle_type=Handle,
        registry_type=Registry,
        track=Registry._track_py,  # type: ignore[attr-defined]
        drop_owner=Registry._drop_owner,
        retain=Registry._retain,
        collected=Registry._collected,
        release_chain=Registry._release_chain,
        release_failed=Registry._release_failed,
        collected_failed=Registry._log_collected_failure,
        registered_after_close=Registry._registered_after_close,
        undo_track=Registry._undo_track,
        wait=_sync.wait,
        deferred=_sync._deferred,
        run_deferred=_sync.run_deferred,
        affine=_threads.pending,
        run_mine=_run_mine_quietly,
        released=Outcome.RELEASED,
        released_at_exit=Outcome.RELEASED_AT_EXIT,
        default_list=_process_module._default,
        default_registry=_process_module.default_registry,
    )

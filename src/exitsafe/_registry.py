"""The registry: the coordinator of one graph of handles, its owners, ledger and teardown.

A :class:`Registry` owns a graph of native handles.  Each handle has a release
function, a kind, an owner count, and the handles it *depends on* (which must outlive
it).  The native release of a handle runs exactly once, when its owner count is zero
**and** no handle depending on it is still alive, or never when the handle is leaked.

At process exit (before the interpreter finalizes modules) every registry runs its
**teardown**: hooks and handles in dependency order, each handle released or leaked
according to its exit policy.  After teardown the registry is *closed*: every later
release request, from any thread and from finalizers running during interpreter
shutdown, is a recorded no-op that never calls native code.

Layers: the registry refers to its handles (each its own
:class:`~exitsafe._node.Node` record) weakly, hooks strongly, changes them only under
:data:`exitsafe._sync.LOCK` following the lock discipline written there, asks
:mod:`exitsafe._graph` about edges, records outcomes in its
:class:`~exitsafe._ledger.Ledger`, and hands the teardown to :mod:`exitsafe._teardown`.
"""

from __future__ import annotations

import _thread
import sys
from _weakref import ref as _weakref

from . import _config, _graph, _sync, _threads
from ._errors import (
    DependencyCycleError,
    ForeignHandleError,
    HandleClosedError,
    LiveDependentsError,
    RegistryClosedError,
)
from ._handle import Handle, HandleInfo, HookHandle, closed_message, make_handle
from ._ledger import Ledger, LedgerEntry, Outcome, quote
from ._node import DETACHED, HANDLE, HOOK, LEAKED, LIBRARY, LIVE, RELEASED, RELEASING, TAINTING
from ._node import Node as _Node
from ._process import keep_forever
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional, Union

    ExitPolicy = Union[str, Callable[[HandleInfo], str]]

__all__ = ["Registry"]

# Registry phases.
OPEN, TEARING, CLOSED = 0, 1, 2

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_acquire = _sync.acquire
_release = _sync.release
_wait = _sync.wait
_deferred = _sync._deferred  # the queue itself: a cheap truthiness test on the hot path
_run_deferred = _sync.run_deferred
_defer = _sync.defer
_refused = _sync.refused
_RELEASED = Outcome.RELEASED
_held = _threads.held
_local = _threads._local
_affine = _threads.pending  # owner thread -> queued releases: a cheap truthiness test
_new_handle = object.__new__
_init = _Node._init


def check_policy(policy: object, what: str) -> None:
    """Raise ``TypeError`` unless ``policy`` is ``"release"``, ``"leak"`` or a callable."""
    if policy in ("release", "leak") or callable(policy):
        return
    if isinstance(policy, str):
        raise ValueError(f"{what} must be 'release', 'leak' or a callable, got {policy!r}")
    raise TypeError(f"{what} must be 'release', 'leak' or a callable, got {policy!r}")


def check_timeout(timeout: object, what: str) -> Optional[float]:
    """``timeout`` as a float, or ``None``; ``TypeError`` / ``ValueError`` naming ``what``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {type(timeout).__name__}")
    try:
        value = float(timeout)
    except OverflowError:
        value = float("inf")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {timeout!r}")
    from . import _steps  # imported on first use: importing exitsafe stays cheap

    _steps.prepare()  # a worker thread must exist before shutdown forbids starting one
    return value


def check_name(name: object, what: str = "name") -> None:
    if name is not None and type(name) is not str:
        raise TypeError(f"{what} must be a str or None, got {type(name).__name__}")


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


class _Call:
    """A hook's release function: calls the hook with no argument."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn

    def __call__(self, _unused: object) -> None:
        self.fn()


class Registry:
    """An independent graph of handles with its own teardown.

    ``name`` labels the registry in the ledger and the trace.  ``strict`` (a bool)
    turns misuse that is otherwise absorbed into exceptions:
    :class:`~exitsafe.LiveDependentsError` for releasing a handle with live
    dependents, :class:`~exitsafe.RegistryClosedError` for registering after
    teardown.  ``exit_policy`` is the default for handles that name none
    (``"release"``, ``"leak"`` or a callable ``(HandleInfo) -> "release" | "leak"``).
    ``step_timeout`` / ``teardown_timeout`` bound one teardown step / the whole
    teardown in seconds (``EXITSAFE_STEP_TIMEOUT`` and ``EXITSAFE_TEARDOWN_TIMEOUT``
    apply where these are ``None``).  ``ledger_limit`` caps how many ledger entries
    are kept (oldest dropped first; :meth:`ledger_counts` stays exact); ``None``
    keeps all.

    Every registry is torn down at process exit, newest registry first, each in its
    own dependency order.  A registry created once the exit teardown has begun is
    torn down by it too, or, once it has finished, is closed at once.  A registry
    with teardown hooks is kept alive by exitsafe until its teardown.

    Thread rules: every method may be called from any thread.  Release functions,
    hooks and policies run on the thread that caused them (the thread dropping the
    last owner, or the thread running the teardown; with a timeout, a teardown
    worker thread), never while exitsafe holds its lock, and may call back into
    exitsafe.
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
        self._record = self._ledger.add
        self._phase = OPEN
        self._seq = 0
        # seq -> a weak reference to every handle not yet ended (dropping the last
        # reference to a handle releases it), or the hook itself (owned until teardown).
        self._live: dict[int, Any] = {}
        self._hooks = 0  # hooks registered and not yet ended
        self._trace = False
        self._teardown_thread = 0
        #: Threads that may still borrow once the teardown began: its own, its workers.
        self._teardown_threads: set[int] = set()
        self._teardown_done: Any = None  # a lock held while the teardown runs
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
        *,
        kind: str = "handle",
        depends_on: Iterable[Handle] = (),
        exit_policy: Optional[ExitPolicy] = None,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        affinity: Optional[str] = None,
    ) -> Handle:
        """Start owning ``raw``; ``release(raw)`` is called exactly once, or never if leaked.

        ``kind``: a label (``"device"``, ``"buffer"``...) shown in the ledger and the
        trace, and passed to exit policies; ``kind="library"`` also makes the handle
        go last at teardown, after everything else.  ``depends_on``: handles (or
        pins) of this registry that must outlive this one.  ``exit_policy``
        overrides the registry's default for this handle at teardown.  ``name``:
        its display name (default ``"<kind>#<n>"``).  ``timeout``: seconds its
        release step may take at teardown before it is abandoned and leaked.

        ``affinity``: ``"creator"`` or ``"main"`` makes the release run only on that
        thread (GL contexts, some GPU and GUI objects): a release that becomes due on
        another thread (garbage collection, an owner dropped elsewhere) is queued and
        run by the owning thread at its next exitsafe call or
        :func:`exitsafe.run_pending`; see ``docs/threads.md`` for the teardown's rules.

        After teardown began, the new handle is leaked at once
        (``leaked_after_close``; strict mode raises
        :class:`~exitsafe.RegistryClosedError`).  ``release`` runs on the thread that
        drops the last owner, or on the teardown thread.
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
        role = LIBRARY if kind == "library" else HANDLE
        parents = self._parent_handles(depends_on, "depends_on") if depends_on else ()
        node = _new_handle(Handle)
        _init(
            node, self, raw, release, kind, name, parents, exit_policy, timeout, role,
            _sync.generation, _get_ident(),
        )
        if owner is not None:
            node._affinity = owner
        if self._phase == CLOSED:  # no lock after close: see _registered_after_close
            self._registered_after_close(node)
            return node
        if parents:
            self._register(node, ())
            return node
        # Fast path (no dependencies): nothing to validate under the lock.
        if not _acquire(False):
            _wait()
        try:
            if self._phase:
                is_open = False
            else:
                is_open = True
                seq = self._seq = self._seq + 1
                node._seq = seq
                node._rank = seq
                self._live[seq] = _weakref(node)
        finally:
            _release()
        if not is_open:
            self._registered_after_close(node)
        elif _deferred:
            _run_deferred()
        if _affine:
            _run_mine_quietly()
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

        Returns a handle of kind ``"library"``: pass it in ``depends_on`` of every
        handle whose release runs the library's code.  At teardown libraries go
        last.  ``close(library)`` (for example ``ffi.dlclose``) runs when the pin is
        released; without ``close`` the library object stays referenced for the rest
        of the process, so it is never unloaded by exitsafe's doing.  For cffi and
        ctypes libraries prefer :func:`exitsafe.cffi.pin` / :func:`exitsafe.ctypes.pin`,
        which also keep the library file mapped against other closers.
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

    def on_teardown(
        self,
        fn: Callable[[], object],
        *,
        before: Iterable[Handle] = (),
        after: Iterable[Handle] = (),
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        in_child: str = "skip",
    ) -> Handle:
        """Register ``fn()`` to run once during this registry's teardown.

        The hook is a node of the same graph: it runs before every handle in
        ``before`` is released (e.g. "flush the queue" before the buffers go) and
        after every handle in ``after`` is released or leaked.  Hooks with no such
        constraint run first.  An exception is logged and recorded (``hook_failed``);
        a hook overrunning ``timeout`` is abandoned (``hook_timeout``) and the
        handles in ``before`` are then leaked.  ``release()`` on the returned handle
        cancels the hook; dropping the handle does not.

        Until it runs or is cancelled, the hook refers to the handles in ``before``:
        dropping your last reference to one of them does not release it before the
        hook (garbage collection cannot reach it), while an explicit ``release()`` on
        it still releases it at once (the edge orders the teardown; it does not
        defer releases).  The hook runs on the teardown thread (or a worker when a
        timeout applies), outside exitsafe's lock.

        ``in_child``: what a process forked after this call does with the hook it
        inherited: ``"skip"`` (the default: it belongs to the parent's objects, and
        ends ``leaked_inherited`` in the child) or ``"run"`` (it is pure Python that
        the child's own exit needs too, like the neutralization of
        :func:`exitsafe.neutralize_at_exit`).
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        check_name(name)
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        if in_child not in ("skip", "run"):
            raise ValueError(f"in_child must be 'skip' or 'run', got {in_child!r}")
        if _reentered():
            raise _refused("on_teardown()")
        before_h = self._parent_handles(before, "before") if before else ()
        after_h = self._parent_handles(after, "after") if after else ()
        hook_name = name if name is not None else getattr(fn, "__qualname__", None)
        if hook_name is not None and type(hook_name) is not str:
            hook_name = None
        node = make_handle(
            HookHandle, self, None, _Call(fn), "hook", hook_name, before_h, None, timeout,
            HOOK, _sync.generation, _get_ident(),
        )
        node._in_child = in_child == "run"
        self._register(node, after_h)
        return node

    def on_early_exit(
        self,
        fn: Callable[[], object],
        *,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Handle:
        """Register ``fn()`` for the *early phase* of the exit: before the interpreter
        joins non-daemon threads and ``concurrent.futures`` joins its workers.

        The place to stop servers, executors and pools that would otherwise keep the
        exit waiting (``server.stop(None)``, ``executor.shutdown(wait=False,
        cancel_futures=True)``...).  Early hooks run once, newest first, on the main
        thread at exit (see :mod:`exitsafe._early` for how, per CPython version), or
        at the beginning of an explicit :meth:`teardown`; then the declared workers
        are asked to stop.  Everything may still be used there; on CPython 3.12.0 to
        3.12.2 no new thread can be started.  An exception is logged and recorded
        (``hook_failed``), a hook overrunning ``timeout`` is abandoned
        (``hook_timeout``).  ``release()`` on the returned handle cancels it.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        check_name(name)
        if timeout is not None:
            timeout = check_timeout(timeout, "timeout")
        if _reentered():
            raise _refused("on_early_exit()")
        from . import _early

        _early.install()
        node = make_handle(
            HookHandle, self, None, _Call(fn),
            "early hook", name if name is not None else _threads.name_of(fn), (), None,
            timeout, HOOK, _sync.generation, _get_ident(),
        )
        _sync.enter()
        try:
            is_open = self._phase == OPEN and not self._early_ran
            if is_open:
                seq = self._seq = self._seq + 1
                node._seq = seq
                self._early[seq] = node
                self._hooks += 1
        finally:
            _sync.leave()
        if not is_open:
            self._registered_after_close(node)
        else:
            from . import _process

            _process.keep_until_teardown(self)
        return node

    def worker(
        self,
        thread: Any,
        *,
        stop: Any,
        uses: Iterable[Handle] = (),
        timeout: Optional[float] = None,
        name: Optional[str] = None,
    ) -> Handle:
        """Declare a thread that uses handles, and how to stop it.

        ``thread``: a :class:`threading.Thread`.  ``stop``: a
        :class:`threading.Event` (set to ask the thread to stop) or a callable (called
        once to ask it).  ``uses``: the handles the thread uses.  ``timeout``: how long
        to wait for the thread to end once asked (default
        :data:`exitsafe._teardown.IN_FLIGHT_WAIT` seconds).

        The worker is a teardown hook that runs before any handle in ``uses`` is
        released: it asks the thread to stop and joins it.  A thread still running
        after ``timeout`` is abandoned (``hook_timeout``), the handles it uses are
        leaked (``leaked_dependent``, never released under it), and the thread is
        parked at its next :meth:`Handle.borrow`.  The stop request is also made in
        the early phase of the exit (before the interpreter joins non-daemon
        threads), so a non-daemon worker does not keep the exit waiting either.
        Returns the hook's handle; ``release()`` on it forgets the worker.
        """
        import threading

        if not isinstance(thread, threading.Thread):
            raise TypeError(f"thread must be a threading.Thread, got {type(thread).__name__}")
        if not (callable(getattr(stop, "set", None)) or callable(stop)):
            raise TypeError(
                f"stop must be a threading.Event or a callable, got {type(stop).__name__}"
            )
        check_name(name)
        bound = check_timeout(timeout, "timeout")
        if bound is None:
            from ._teardown import IN_FLIGHT_WAIT

            bound = IN_FLIGHT_WAIT
        from . import _early

        _early.install()
        return self.on_teardown(
            _threads.WorkerStop(thread, stop, bound),
            before=uses,
            name=name if name is not None else f"worker {thread.name}",
        )

    def _run_early_hooks(self, reason: str) -> None:
        """The early phase of this registry: its early hooks, newest first, then the stop
        requests of its workers.  Runs once; never raises."""
        from ._steps import NoWorkerError, StepRunner
        from ._teardown import Settings

        me = _get_ident()
        _sync.enter()
        try:
            if self._early_ran or self._phase:
                hooks: list[_Node] = []
                workers: list[Any] = []
                done = True
            else:
                done = False
                self._early_ran = True
                hooks = [h for h in reversed(self._early.values()) if h._state == LIVE]
                generation = _sync.generation
                for hook in hooks:
                    hook._state = RELEASING
                    hook._releaser = me
                workers = [
                    n._fn.fn
                    for n in self._nodes()
                    if isinstance(n._fn, _Call) and isinstance(n._fn.fn, _threads.WorkerStop)
                ]
        finally:
            _sync.leave()
        if done:
            return
        settings = Settings(self, reason)
        runner = StepRunner()
        try:
            for hook in hooks:
                if hook._gen != generation and not hook._in_child:
                    self._end_early_hook(
                        hook, Outcome.LEAKED_INHERITED, "inherited from the parent process"
                    )
                    continue
                timeout = hook._timeout if hook._timeout is not None else settings.step_timeout
                fn = hook._fn
                assert fn is not None
                try:
                    finished, error = runner.call(fn, None, timeout, hook)
                except NoWorkerError as exc:
                    finished, error = False, None
                    timeout_detail = f"not run: no thread could be started to bound it ({exc})"
                else:
                    timeout_detail = f"still running after {timeout} s; abandoned"
                if not finished:
                    outcome, detail = Outcome.HOOK_TIMEOUT, timeout_detail
                elif error is not None:
                    outcome, detail = Outcome.HOOK_FAILED, repr(error)
                    log().error(
                        "exitsafe: early hook %r failed: %s", hook._display_name(), detail
                    )
                else:
                    outcome, detail = Outcome.HOOK_RAN, None
                self._end_early_hook(hook, outcome, detail)
        finally:
            runner.close()
        for stop in workers:
            try:
                stop.request_stop()
            except Exception as exc:  # a broken stop function: logged, the others go on
                log().error("exitsafe: stopping %r failed: %s", stop.thread.name, repr(exc))

    def _end_early_hook(self, hook: _Node, outcome: str, detail: Optional[str]) -> None:
        trash: list[object] = []
        _sync.enter()
        try:
            self._early.pop(hook._seq, None)
            self._finish(hook, outcome, detail, True, trash)
        finally:
            _release()
        trash.clear()

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
                raise TypeError(
                    f"{what} must contain exitsafe Handles (from track/pin/on_teardown), "
                    f"got {type(item).__name__}"
                )
            registry = item._registry
            if registry is not self:
                raise ForeignHandleError(
                    f"{what}: {item.name!r} belongs to registry {registry.name!r}, "
                    f"not {self.name!r}; dependencies cannot cross registries"
                )
        return _graph.unique(items)  # type: ignore[arg-type,return-value]

    def _register(self, node: _Node, after: tuple[Handle, ...]) -> None:
        """Insert ``node`` (with parents, or a hook) into the graph, or refuse it."""
        if self._phase == CLOSED:  # no lock after close: see _registered_after_close
            self._registered_after_close(node)
            return
        parents = node._parents
        error: Optional[Exception] = None
        _sync.enter()
        try:
            if self._phase == OPEN:
                error = self._check_new_edges(node, after)
                if error is None:
                    seq = self._seq = self._seq + 1
                    node._seq = seq
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
                        self._live[seq] = node  # owned by the registry until teardown
                        self._hooks += 1
                    else:
                        self._live[seq] = _weakref(node)
                is_open = True
            else:
                is_open = False
        finally:
            _release()
        if error is not None:
            _disown(node)
            raise error
        if not is_open:
            self._registered_after_close(node)
            return
        if node._role == HOOK and self._hooks:
            from . import _process

            _process.keep_until_teardown(self)
        if _deferred:
            _run_deferred()

    def _check_new_edges(self, node: _Node, after: tuple[Handle, ...]) -> Optional[Exception]:
        """Why ``node`` cannot join the graph with its parents and ``after`` edges, or None."""
        for parent in node._parents:
            if parent._state != LIVE or not parent._refs:
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
        found = [r if type(r) is HookHandle else r() for r in self._live.values()]
        return [n for n in found if n is not None]

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
        locked = _sync.acquire(True, 1.0) if not _reentered() else False
        try:
            self._seq += 1
            node._seq = self._seq
            node._state = LEAKED
            node._refs = 0
            node._parents = ()
            keep, node._parents = node._parents, ()
            self._ledger.add(
                node._seq, node._kind, node._name, Outcome.LEAKED_AFTER_CLOSE,
                "registered after teardown began", True,
            )
        finally:
            if locked:
                _release()
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
        _sync.enter()
        try:
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            if self._phase != OPEN:
                raise RegistryClosedError(f"registry {self.name!r} is closed")
            new = []
            for parent in parents_h:
                if parent._state != LIVE or not parent._refs:
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
            _release()
        if _deferred:
            _run_deferred()

    # ------------------------------------------------------------------ owners

    def _retain(self, node: _Node) -> None:
        if self._phase == CLOSED:  # every handle ended; no lock after close (_late_request)
            raise HandleClosedError(closed_message(node))
        if _reentered():
            raise _refused("retain()")
        if not _acquire(False):
            _wait()
        try:
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            node._refs += 1
        finally:
            _release()
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
        if not _acquire(False):
            _wait()
        try:
            if self._phase == CLOSED:
                self._ledger.add_late_request()
                target = None
                late = True
            else:
                late = False
                if node._state != LIVE or not node._refs:
                    target = None
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
                        node._state = RELEASING
                        node._releaser = _get_ident()
                        target = node
        finally:
            _release()
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
            else:
                error = self._release_leaf(target)
            if _deferred:
                _run_deferred()
            if error is not None:
                raise error
        elif _deferred:
            _run_deferred()
        if _affine:
            _run_mine_quietly()

    def _release_leaf(self, node: _Node) -> Optional[BaseException]:
        """:meth:`_release_chain` for the common case: a claimed node with no parents, no
        taint, not inherited.  The same steps, without the chain's bookkeeping."""
        try:
            node._fn(node._raw)  # type: ignore[misc]
        except BaseException as exc:  # recorded, then re-raised to the caller
            trash: list[object] = []
            _sync.enter()
            try:
                self._finish(node, Outcome.RELEASE_FAILED, repr(exc), False, trash)
            finally:
                _release()
            return exc
        if not _acquire(False):
            _wait()
        try:
            if node._state == RELEASING:  # else a teardown gave up on it and recorded it
                node._state = RELEASED
                node._releaser = 0
                del self._live[node._seq]
                self._record(node._seq, node._kind, node._name, _RELEASED, None, False)
        finally:
            _release()
        node._raw = node._fn = None  # outside the lock: this may run the object's __del__
        return None

    def _queue_for_owner(self, node: _Node) -> None:
        """A release due on a thread that does not own ``node``: queue it for the owner."""
        _sync.enter()
        try:
            _threads.queue_for_owner(node)
        finally:
            _release()

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

        Uses only attributes (see :meth:`_drop_owner`) and takes no lock: late in
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
        _sync.enter()
        try:
            target = None
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
                    if not (node._children or node._borrows):
                        node._state = RELEASING
                        node._releaser = _get_ident()
                        target = node
        finally:
            _release()
        trash.clear()
        if target is not None:
            error = self._release_chain(target)
            if error is not None:
                # Log the repr, not the exception: a handler that keeps records (pytest's
                # caplog, a MemoryHandler) would otherwise keep its traceback, and through
                # its frames every handle they refer to.
                log().error(
                    "release of %s %r failed after its last reference was dropped: %s",
                    node._kind,
                    node._display_name(),
                    repr(error),
                )
        if _deferred:
            _run_deferred()

    def _settle(self, node: _Node) -> None:
        """Release ``node`` if nothing holds it any more (queued after a re-entrant borrow)."""
        _sync.enter()
        try:
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
            _release()
        if target is not None:
            error = self._release_chain(target)
            if error is not None:
                raise error

    def _dependent_names(self, node: _Node) -> list[str]:
        return [
            n._display_name()
            for n in self._nodes()
            if node in n._parents and n._state <= RELEASING and n._role != HOOK
        ]

    # ------------------------------------------------------------------ borrows

    def _borrow_enter(self, node: _Node) -> Any:
        if self._phase == CLOSED:  # every handle ended; no lock after close (_late_request)
            raise HandleClosedError(closed_message(node))
        if _reentered():
            # A finalizer interrupted a section of this thread: no other thread can
            # change the node now, and no native release can run before this
            # finalizer returns (releases run after sections).  So the count can be
            # taken without the lock; the matching exit does the same.
            if node._state != LIVE or not node._refs:
                raise HandleClosedError(closed_message(node))
            node._borrows += 1
            _held().append(node)
            return node._raw
        if not _acquire(False):
            _wait()
        try:
            if self._phase and _get_ident() not in self._teardown_threads:
                gated = True  # a teardown began: this thread may not enter native code
            else:
                gated = False
                if node._state != LIVE or not node._refs:
                    if not self._teardown_owns(node):
                        raise HandleClosedError(closed_message(node))
                node._borrows += 1
                raw = node._raw
        finally:
            _release()
        if gated:
            self._refuse_borrow(node)  # parks this thread or raises
        try:
            _local.held.append(node)  # the borrows this thread holds (see _threads.held)
        except AttributeError:
            _local.held = [node]
        if _deferred:
            _run_deferred()
        return raw

    def _teardown_owns(self, node: _Node) -> bool:
        """Whether the running teardown claimed ``node`` and has not settled it yet."""
        return (
            node._state == RELEASING
            and bool(self._phase)
            and node._releaser == self._teardown_thread
        )

    def _refuse_borrow(self, node: _Node) -> None:
        """A borrow after the teardown began, on a thread that is not the teardown's.

        A handle that already ended raises :class:`~exitsafe.HandleClosedError`; else a
        daemon thread is parked (it never returns into native code), and a non-daemon
        thread, which the interpreter would wait for, gets the error.
        """
        if node._state > RELEASING or not _threads.is_daemon_thread():
            raise HandleClosedError(
                f"{closed_message(node)}: the teardown of registry {self.name!r} began"
                if node._state <= RELEASING
                else closed_message(node)
            )
        _sync.enter()
        try:
            self._parked += 1
        finally:
            _release()
        log().info(
            "exitsafe: %r parked at borrow() of %s %r: the teardown of %r began",
            _threads.thread_name(_get_ident()),
            node._kind,
            node._display_name(),
            self.name,
        )
        _threads.park()

    def _borrow_exit(self, node: _Node) -> None:
        try:
            held = _local.held
        except AttributeError:  # entered on another thread, before a fork
            held = None
        if held and held[-1] is node:
            held.pop()
        else:
            _threads.forget_held(node)
        if self._phase == CLOSED:  # the node ended: nothing to release, no lock to take
            node._borrows -= 1
            return
        if _reentered():
            node._borrows -= 1
            if not node._borrows:
                _defer(self._settle, node)
            return
        if not _acquire(False):
            _wait()
        try:
            node._borrows -= 1
            if node._state == LIVE and not (
                node._refs or node._children or node._borrows or self._phase
            ):
                node._state = RELEASING
                node._releaser = _get_ident()
                target: Optional[_Node] = node
            else:
                target = None
        finally:
            _release()
        error = self._release_chain(target) if target is not None else None
        if _deferred:
            _run_deferred()
        if error is not None:
            raise error

    # ------------------------------------------------------------------ endings

    def _cancel_hook(self, node: _Node) -> None:
        if _reentered():
            _defer(self._cancel_hook, node)
            return
        trash: list[object] = []
        _sync.enter()
        try:
            if node._state == LIVE and self._phase == OPEN:
                self._early.pop(node._seq, None)
                self._finish(node, Outcome.HOOK_CANCELLED, None, False, trash)
        finally:
            _release()
        trash.clear()
        if _deferred:
            _run_deferred()

    def _detach(self, node: _Node) -> Any:
        if _reentered():
            raise _refused("detach()")
        trash: list[object] = []
        _sync.enter()
        try:
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
            _release()
        trash.clear()
        error = None
        for parent in ready:
            error = self._release_chain(parent) or error
        if _deferred:
            _run_deferred()
        if error is not None:
            raise error
        return raw

    def _release_chain(self, first: _Node) -> Optional[BaseException]:
        """Release ``first`` (already claimed) and every parent it frees, iteratively.

        Runs each release function outside the lock; returns the first exception a
        release function raised (after recording it), for the caller to re-raise.
        """
        pending = [first]
        error: Optional[BaseException] = None
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
            if not _acquire(False):
                _wait()
            try:
                pending.extend(self._finish(node, outcome, detail, False, trash))
            finally:
                _release()
            trash.clear()  # drops the raw object and release function: outside the lock
        return error

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
        node._releaser = 0
        self._live.pop(node._seq, None)
        self._ledger.add(node._seq, node._kind, node._name, outcome, detail, at_exit)
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

    # ------------------------------------------------------------------ teardown

    @property
    def closed(self) -> bool:
        """Whether teardown has completed: every release request is now a no-op."""
        return self._phase == CLOSED

    @property
    def tearing_down(self) -> bool:
        """Whether teardown has begun (guarded callbacks are already no-ops)."""
        return self._phase != OPEN

    def teardown(self, reason: str = "explicit") -> None:
        """Release or leak every live handle in dependency order, run the hooks, then close.

        Order: a step runs only after every handle depending on it is done; among
        ready steps hooks go first, libraries last, newest first otherwise.  Each
        handle is released or leaked by its exit policy, the registry's default, or
        ``EXITSAFE_AT_EXIT``; a borrowed handle is leaked (``leaked_in_use``), and
        whatever a leaked handle depends on is leaked too.  A release that raises is
        logged and recorded and teardown goes on.

        All or recorded: whatever interrupts the teardown (an exception escaping a
        step, KeyboardInterrupt), every handle it claimed ends with exactly one
        outcome (``leaked_interrupted`` for those it did not reach), and the registry
        is closed.  On the main thread, SIGINT and exitsafe's own signal handlers are
        held back while it runs and delivered right after (see
        :mod:`exitsafe.signals`).

        A release already running on another thread when the teardown reaches it is
        waited for, bounded by the step timeout (``EXITSAFE_STEP_TIMEOUT``) or, without
        one, :data:`exitsafe._teardown.IN_FLIGHT_WAIT` seconds, then recorded
        ``leaked_in_use``; one running on the teardown's own thread (a teardown started
        from a release function or a signal handler) is never waited for.

        Idempotent: a second call returns at once; a call from another thread while a
        teardown runs waits for it to finish (bounded by ``teardown_timeout``, or
        ``IN_FLIGHT_WAIT`` seconds without one).  Called from a finalizer or signal
        handler that interrupted exitsafe on the same thread, it runs right after the
        interrupted step.  Runs automatically at process exit.
        """
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        if _reentered():
            _defer(self.teardown, reason)
            return
        if _deferred:
            _run_deferred()  # settle the requests queued before the teardown
        if not self._early_ran:
            self._run_early_hooks(reason)
        from . import _teardown

        me = _get_ident()
        _sync.enter()
        try:
            phase = self._phase
            if phase == OPEN:
                self._phase = TEARING  # closes the borrow gate to other threads
                self._teardown_thread = me
                self._teardown_threads = {me}
                done = self._teardown_done = _thread.allocate_lock()
                done.acquire()
                for queued in _threads.take_registry(self):  # thread-affine releases
                    queued._state = LIVE
                    queued._releaser = 0
                nodes = self._nodes()
                elsewhere = _teardown.claim(nodes, me)
        finally:
            _release()
        if phase != OPEN:
            if phase == TEARING and self._teardown_thread != me:
                self._wait_for_teardown()
            return
        decided: dict[_Node, tuple[str, Optional[str]]] = {}
        # Signals are held back until every outcome is recorded: a handler acting on
        # one (a second signal in the immediate mode writes the ledger) sees them all.
        with _teardown.signals_held():
            try:
                settings = _teardown.Settings(self, reason)
                settings.allowed = self._teardown_threads
                self._trace = settings.trace
                _teardown.run(nodes, elsewhere, settings, decided)
            finally:
                self._close(nodes, elsewhere, decided)
                done.release()
        if _deferred:
            _run_deferred()

    def _close(
        self,
        nodes: list[_Node],
        elsewhere: set[_Node],
        decided: dict[_Node, tuple[str, Optional[str]]],
    ) -> None:
        """Record every claimed node's outcome (``leaked_interrupted`` if undecided), close."""
        # In the order the teardown decided, then whatever it never reached.
        records = list(decided.items())
        detail = "the teardown was interrupted before it reached this handle"
        records += [
            (node, (Outcome.LEAKED_INTERRUPTED, detail))
            for node in nodes
            if node not in decided and node not in elsewhere
        ]
        trash: list[object] = []
        chunk = 4096  # record in sections of this many nodes, so other threads get a turn
        for start in range(0, len(records), chunk):
            _sync.enter()
            try:
                for node, (outcome, why) in records[start : start + chunk]:
                    # The teardown settled its own nodes; for one it gave up waiting for,
                    # the releasing thread may have recorded its outcome first.
                    self._finish(node, outcome, why, True, trash, node not in elsewhere)
            finally:
                _release()
            trash.clear()
        _sync.enter()
        try:
            self._phase = CLOSED
            self._teardown_thread = 0
        finally:
            _release()

    def _after_fork_in_child(self) -> None:
        """In a forked child: forget what the parent's *other* threads were doing.

        Only the forking thread exists in the child.  A teardown or a release that
        another thread was running will never finish here: the registry reopens and
        those nodes become live again, so that the child's own exit teardown gives
        every inherited node its outcome (``leaked_inherited``); the nodes that
        teardown had already decided are recorded ``leaked_inherited`` at once.  Work of the forking
        thread itself (a fork inside a hook or a release function) continues as it
        is, and checks the fork generation at every step.
        """
        me = _get_ident()
        abandoned = self._phase == TEARING and self._teardown_thread != me
        # Forked by a worker running one of that teardown's timed steps (a hook or a
        # release function that forks): the child must not run that step again.
        steps = sys.modules.get("exitsafe._steps")
        stepping = steps.running_here() if abandoned and steps is not None else None
        if abandoned:
            self._phase = OPEN
            self._teardown_thread = 0
            self._teardown_done = None
            self._teardown_threads = set()
        self._early_ran = False  # the child's own exit has its own early phase
        trash: list[object] = []
        _sync.enter()  # (the child's only thread: no wait, but the same discipline)
        try:
            for node in self._nodes():
                if node is stepping:
                    self._finish(
                        node, Outcome.LEAKED_INHERITED,
                        "its teardown step was running when this process was forked from it",
                        True, trash,
                    )
                elif node._state == RELEASING and node._releaser != me:
                    node._state = LIVE
                    node._releaser = 0
                elif abandoned and node._state > RELEASING:
                    # Decided by the parent's teardown, which records its decisions at
                    # its end, never reached here: the child's record of it.
                    self._finish(
                        node, Outcome.LEAKED_INHERITED,
                        "decided by the parent's teardown, which was running on another "
                        "thread when this process was forked",
                        True, trash, True,
                    )
        finally:
            _release()
        trash.clear()

    def _wait_for_teardown(self) -> None:
        from ._teardown import IN_FLIGHT_WAIT

        done = self._teardown_done
        total = self._total_timeout()
        bound = IN_FLIGHT_WAIT if total is None else total
        if done is not None and done.acquire(True, bound):
            done.release()
        elif self._phase != CLOSED:
            log().warning(
                "exitsafe: registry %r: gave up waiting %.3g s for the teardown running on "
                "another thread",
                self.name,
                bound,
            )

    def _total_timeout(self) -> Optional[float]:
        if self._teardown_timeout is not None:
            return self._teardown_timeout
        return _config.seconds("EXITSAFE_TEARDOWN_TIMEOUT")

    def _trace_late(self, node: _Node) -> None:
        self.__class__._emit_late_now(self.name, node._kind, node._display_name())

    _emit_late_now = staticmethod(_emit_late_release)

    # ------------------------------------------------------------------ inspection

    def ledger(self) -> list[LedgerEntry]:
        """The recorded outcomes, oldest first (at most ``ledger_limit`` of the newest)."""
        entries: list[LedgerEntry] = self._read(self._ledger.entries, self.name)
        return entries

    def ledger_counts(self) -> dict[str, int]:
        """How many handles ended in each outcome (exact, never truncated)."""
        counts: dict[str, int] = self._read(self._ledger.counts)
        return counts

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the lock; without it when called re-entrantly (a copy made
        while this thread's own section is suspended is as consistent as any)."""
        if _reentered():
            return fn(*args)
        _sync.enter()
        try:
            return fn(*args)
        finally:
            _sync.leave()

    @property
    def late_requests(self) -> int:
        """How many release requests arrived after close and were ignored.

        A request is an explicit ``release()`` (or ``close()`` of a wrapper); the
        garbage collection of a handle that already ended is not one.
        """
        return self._ledger.late_requests

    def live_handles(self) -> list[HandleInfo]:
        """A snapshot of every handle and hook not yet ended, oldest first."""
        import threading

        main = threading.main_thread().ident
        generation = _sync.generation
        nodes = self._read(self._nodes)
        return [HandleInfo(n, generation, main) for n in nodes if n._state <= RELEASING]

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        phase = ("open", "tearing down", "closed")[self._phase]
        return f"<exitsafe.Registry {self.name!r} {phase} live={len(self._live)}>"

    def _as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counts": self.ledger_counts(),
            "late_requests": self.late_requests,
            "dropped_entries": self._ledger.dropped,
            "parked_threads": self._parked,
            "entries": [e.as_dict() for e in self.ledger()],
        }


def run_pending() -> None:
    """Run the releases queued for the calling thread, and any queued release requests.

    A thread-affine handle (``track(..., affinity="creator")``) whose release became due
    on another thread waits in a queue for its owning thread; that thread runs it at
    its next exitsafe call, or here.  Call it where the owning thread can safely
    release (between two frames of a render loop, with its GL context current).  An
    exception of a release function propagates here after every queued release ran.
    """
    error = _run_mine()
    if error is not None:
        raise error


def _run_mine() -> Optional[BaseException]:
    """Run the calling thread's queued affine releases; the first error, not raised."""
    if _reentered():
        return None  # never inside a section: it runs after it
    _sync.enter()
    try:
        nodes = _threads.take_mine()
    finally:
        _release()
    first: Optional[BaseException] = None
    for node in nodes:
        error = node._registry._release_chain(node)
        if first is None:
            first = error
    if _deferred:
        _run_deferred()
    return first


def _run_mine_quietly() -> None:
    """:func:`_run_mine` from an unrelated exitsafe call: errors are logged, not raised."""
    import threading

    if threading.current_thread() not in _affine:
        return
    error = _run_mine()
    if error is not None:
        log().error("exitsafe: a queued thread-affine release failed: %s", repr(error))


def _disown(node: _Node) -> None:
    """Forget a node whose registration was refused: the caller still owns its object.

    Its handle's finalizer then finds no owner and never calls ``release``.
    """
    node._refs = 0
    node._state = LEAKED
    node._raw = None
    node._fn = None
    node._parents = ()


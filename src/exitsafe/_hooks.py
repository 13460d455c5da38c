"""Hook registration, a part of [`Registry`][exitsafe.Registry]: teardown hooks, early-exit
hooks and declared worker threads, and the early phase that runs them.

A hook is a node of the registry's graph (role ``HOOK``) that the registry owns until it
runs or is cancelled: teardown hooks run in the teardown's dependency order, early hooks
before the interpreter joins threads (see `exitsafe._early`).  This mixin changes
the registry's state only through the registry's own bookkeeping (``_register``,
``_finish``) and under `exitsafe._sync.LOCK`.
"""

from __future__ import annotations

import _thread

from . import _sync, _threads
from ._checks import check_name, check_timeout
from ._handle import Handle, HookHandle, make_handle
from ._ledger import Outcome
from ._node import HOOK, LIVE, RELEASING
from ._node import Node as _Node
from ._phase import OPEN
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional

__all__ = ["HookRegistration"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_refused = _sync.refused
_release = _sync.release
_defer = _sync.defer
_deferred = _sync._deferred
_run_deferred = _sync.run_deferred


class _Call:
    """A hook's release function: calls the hook with no argument."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn

    def __call__(self, _unused: object) -> None:
        self.fn()



class HookRegistration:
    """The hook half of [`Registry`][exitsafe.Registry] (a mixin)."""

    if TYPE_CHECKING:
        name: str
        _phase: int
        _seq: int
        _hooks: int
        _early: dict[int, Handle]
        _early_ran: bool

        def _register(
            self, node: _Node, after: tuple[Handle, ...], run_deferred: bool = True
        ) -> None: ...
        def _registered_after_close(self, node: _Node) -> None: ...
        def _next_seq(self) -> int: ...
        def _nodes(self) -> list[_Node]: ...
        def _parent_handles(self, handles: object, what: str) -> tuple[Handle, ...]: ...
        def _finish(
            self, node: _Node, outcome: str, detail: Optional[str], at_exit: bool,
            trash: list[object], decided: bool = False,
        ) -> list[_Node]: ...

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
        """Register `fn()` to run once during this registry's teardown.

        The hook is a node of the same graph.  Hooks with no `before` / `after` constraint run
        first.  Until it runs or is cancelled, the hook refers to the handles in `before`:
        dropping your last reference to one of them does not release it before the hook
        (garbage collection cannot reach it), while an explicit `release()` on it still
        releases it at once (the edge orders the teardown; it does not defer releases).  The
        hook runs on the teardown thread (or a worker when a timeout applies), outside
        exitsafe's lock; an exception is logged and recorded (`hook_failed`).

        Args:
            fn: the hook, called with no arguments.
            before: handles released only after the hook ran (e.g. "flush the queue" before
                the buffers go).
            after: handles released (or leaked) before the hook runs.
            name: its display name in the ledger and the trace.
            timeout: seconds the hook may run before it is abandoned (`hook_timeout`); the
                handles in `before` are then leaked.
            in_child: what a process forked after this call does with the hook it inherited:
                `"skip"` (the default: it belongs to the parent's objects, and ends
                `leaked_inherited` in the child) or `"run"` (it is pure Python that the child's
                own exit needs too, like the neutralization of
                [`neutralize_at_exit`][exitsafe.neutralize_at_exit]).

        Returns:
            The hook's handle: `release()` on it cancels the hook; dropping it does not.
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
        node = make_handle(  # (self is the Registry this mixin is a part of)
            HookHandle, self, None, _Call(fn), "hook",  # type: ignore[arg-type]
            hook_name, before_h, None, timeout,
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
        """Register `fn()` for the *early phase* of the exit: before the interpreter joins
        non-daemon threads and `concurrent.futures` joins its workers.

        The place to stop servers, executors and pools that would otherwise keep the exit
        waiting (`server.stop(None)`, `executor.shutdown(wait=False, cancel_futures=True)`...).
        Early hooks run once, newest first, on the main thread at exit, or at the beginning of
        an explicit [`teardown`][exitsafe.Registry.teardown]; then the declared workers are asked
        to stop.  Everything may still be used there; on CPython 3.12.0 to 3.12.2 no new thread
        can be started.

        Args:
            fn: the hook, called with no arguments; an exception is logged and recorded
                (`hook_failed`).
            name: its display name in the ledger and the trace.
            timeout: seconds the hook may run before it is abandoned (`hook_timeout`).

        Returns:
            The hook's handle; `release()` on it cancels the hook.
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
            HookHandle, self, None, _Call(fn),  # type: ignore[arg-type]
            "early hook", name if name is not None else _threads.name_of(fn), (), None,
            timeout, HOOK, _sync.generation, _get_ident(),
        )
        try:
            _sync.enter()
            is_open = self._phase == OPEN and not self._early_ran
            if is_open:
                seq = node._seq = self._next_seq()
                self._early[seq] = node
                self._hooks += 1
        finally:
            try:
                _sync.release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
            else:
                _sync.run_deferred()
        if not is_open:
            self._registered_after_close(node)
        else:
            from . import _process

            _process.keep_until_teardown(self)  # type: ignore[arg-type]
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

        The worker is a teardown hook that runs before any handle in `uses` is released: it
        asks the thread to stop and joins it.  A thread still running after `timeout` is
        abandoned (`hook_timeout`), the handles it uses are leaked (`leaked_dependent`, never
        released under it), and the thread is parked at its next
        [`Handle.borrow`][exitsafe.Handle.borrow].  The stop request is also made in the early
        phase of the exit (before the interpreter joins non-daemon threads), so a non-daemon
        worker does not keep the exit waiting either.

        Args:
            thread: the `threading.Thread`.
            stop: a `threading.Event` (set to ask the thread to stop) or a callable (called
                once to ask it).
            uses: the handles the thread uses.
            timeout: how long to wait for the thread to end once asked; `None`: 5 seconds.
            name: its display name in the ledger and the trace.

        Returns:
            The hook's handle; `release()` on it forgets the worker.
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
        uses = self._parent_handles(uses, "uses") if uses else ()  # (errors name `uses`)
        return self.on_teardown(
            _threads.WorkerStop(thread, stop, bound),
            before=uses,
            name=name if name is not None else f"worker {thread.name}",
        )

    def _run_early_hooks(self, reason: str) -> None:
        """The early phase of this registry: its early hooks, newest first, then the stop
        requests of its workers.  Runs once; never raises."""
        from ._steps import ExitRequested, NoWorkerError, StepRunner
        from ._teardown import Settings

        me = _get_ident()
        try:
            _sync.enter()
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
                workers = [  # (a worker is a teardown hook: none without hooks)
                    n._fn.fn
                    for n in self._nodes()
                    if isinstance(n._fn, _Call) and isinstance(n._fn.fn, _threads.WorkerStop)
                ] if self._hooks else []
        finally:
            try:
                _sync.release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
            else:
                _sync.run_deferred()
        if done:
            return
        settings = Settings(self, reason)  # type: ignore[arg-type]
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
                elif isinstance(error, ExitRequested):  # the process leaves after this phase
                    outcome, detail = Outcome.LEAKED_INTERRUPTED, error.detail("early hook")
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
        try:
            _sync.enter()
            self._early.pop(hook._seq, None)
            self._finish(hook, outcome, detail, True, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()


    def _cancel_hook(self, node: _Node) -> None:
        if _reentered():
            _defer(self._cancel_hook, node)
            return
        trash: list[object] = []
        try:
            _sync.enter()
            if node._state == LIVE and self._phase == OPEN:
                self._early.pop(node._seq, None)
                self._finish(node, Outcome.HOOK_CANCELLED, None, False, trash)
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()
        if _deferred:
            _run_deferred()


"""Hooks: teardown hooks, early-exit hooks and declared worker threads, and the early
phase that runs them.

A hook is a record of the registry's graph (role ``HOOK``) that the registry owns until
it runs or is cancelled: teardown hooks run in the teardown's dependency order, early
hooks before the interpreter joins threads (see `exitsafe._early`).  `Hooks` is the part
of a registry's state that keeps its early hooks and whether its early phase ran; the
functions here register hooks through the state's own bookkeeping (``add``, ``finish``)
and under `exitsafe._sync.LOCK`.
"""

from __future__ import annotations

import _thread

from . import _process, _record, _sync, _threads
from ._handle import Handle
from ._ledger import Outcome
from ._phase import OPEN
from ._record import HOOK, LIVE, Record, display_name
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["HookHandle", "Hooks"]

_get_ident = _thread.get_ident


class Hooks:
    """The hooks of one registry: its early hooks not yet run, whether its early phase
    ran, and how many hooks (of both kinds) are registered and not yet ended."""

    __slots__ = ("count", "early", "early_ran")

    def __init__(self) -> None:
        self.early: dict[int, Record] = {}  # creation number -> early hook not yet run
        self.early_ran = False
        self.count = 0

    def added(self) -> None:
        self.count += 1

    def ended(self) -> None:
        self.count -= 1

    def add_early(self, node: Record) -> None:
        self.early[node._seq] = node
        self.count += 1

    def forget_early(self, node: Record) -> None:
        self.early.pop(node._seq, None)

    def take_early(self) -> Optional[list[Record]]:
        """The early hooks to run, newest first, once (``None`` if the phase ran)."""
        if self.early_ran:
            return None
        self.early_ran = True
        return [h for h in reversed(self.early.values()) if h._state == LIVE]

    def after_fork_in_child(self) -> None:
        """The child's own exit has its own early phase."""
        self.early_ran = False


class HookHandle(Handle):
    """The handle of a teardown hook: owned by its registry, not by Python references."""

    __slots__ = ()

    def release(self) -> None:
        """Cancel the hook: it will not run.  A no-op once it ran or teardown began."""
        cancel(self)

    def __del__(self) -> None:
        # The registry keeps hooks until teardown; dropping the handle changes nothing.
        pass


class Call:
    """A hook's release function: calls the hook with no argument."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn

    def __call__(self, _unused: object) -> None:
        self.fn()


def add_teardown_hook(
    state: Any,
    fn: Callable[[], object],
    before: tuple[Record, ...],
    after: tuple[Record, ...],
    name: Optional[str],
    timeout: Optional[float],
    in_child: bool,
) -> Handle:
    """Register ``fn()`` as a teardown hook of ``state`` (arguments checked by the
    caller): it runs before the records in ``before`` are released, after ``after``."""
    if _sync.reentered():
        raise _sync.refused("on_teardown()")
    node = _record.new(
        HookHandle, state, None, Call(fn), "hook", name, before, None, timeout,
        HOOK, _sync.generation, _get_ident(), None, in_child,
    )
    if not state.register(node, after):
        return node
    if state.hooks.count:
        _process.keep_until_teardown(state)
    if _sync.deferred:
        _sync.run_deferred()
    return node


def add_early_hook(
    state: Any, fn: Callable[[], object], name: Optional[str], timeout: Optional[float]
) -> Handle:
    """Register ``fn()`` for the early phase of ``state``'s exit (arguments checked by
    the caller, the early phase installed)."""
    node = _record.new(
        HookHandle, state, None, Call(fn), "early hook",
        name if name is not None else _threads.name_of(fn), (), None, timeout, HOOK,
        _sync.generation, _get_ident(),
    )

    def add() -> bool:
        if state.phase != OPEN or state.hooks.early_ran:
            return False
        seq = state.seq = state.seq + 1
        _record.number(node, seq)
        state.hooks.add_early(node)
        return True

    if _sync.locked("on_early_exit()", add):
        _process.keep_until_teardown(state)
    else:
        state.registered_after_close(node)
    return node


def worker_stop(
    thread: Any, stop: Any, timeout: Optional[float], wake: Any = None
) -> Callable[[], None]:
    """What the hook of a declared worker calls (see ``Registry.worker``)."""
    from ._teardown import IN_FLIGHT_WAIT  # (the teardown's modules load on first use)

    bound = timeout if timeout is not None else IN_FLIGHT_WAIT
    return _threads.WorkerStop(thread, stop, bound, wake)


def cancel(node: Record) -> None:
    """``HookHandle.release()``: the hook will not run (a no-op once it ran or teardown
    began)."""
    state = node._registry
    if _sync.reentered():
        _sync.defer(cancel, node)
        return
    trash: list[object] = []

    def end_cancelled() -> None:
        if node._state == LIVE and state.phase == OPEN:
            state.hooks.forget_early(node)
            state.finish(node, Outcome.HOOK_CANCELLED, None, False, trash)

    _sync.locked_quietly(end_cancelled)
    trash.clear()
    if _sync.deferred:
        _sync.run_deferred()


def run_early_hooks(state: Any, reason: str) -> None:
    """The early phase of ``state``: its early hooks, newest first, then the stop
    requests of its workers.  Runs once; never raises."""
    me = _get_ident()

    def take() -> tuple[list[Record], list[Any]]:
        if state.phase:
            return [], []
        hooks = state.hooks.take_early()
        if hooks is None:
            return [], []
        for hook in hooks:
            _record.claim(hook, me)
        workers = [  # (a worker is a teardown hook: none without hooks)
            n._fn.fn
            for n in state.live.nodes()
            if isinstance(n._fn, Call) and isinstance(n._fn.fn, _threads.WorkerStop)
        ] if state.hooks.count else []
        return hooks, workers

    hooks, workers = _sync.locked("the early phase", take)
    if hooks:
        _run_early(state, hooks, reason)
    for stop in workers:
        try:
            stop.request_stop()
        except Exception as exc:  # a broken stop function: logged, the others go on
            log().error("exitsafe: stopping %r failed: %s", stop.thread.name, repr(exc))


def _run_early(state: Any, hooks: list[Record], reason: str) -> None:
    from ._steps import ExitRequested, NoWorkerError, StepRunner
    from ._teardown import Settings

    settings = Settings(state, reason)
    runner = StepRunner()
    generation = _sync.generation
    try:
        for hook in hooks:
            if hook._gen != generation and not hook._in_child:
                _end_early_hook(
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
                log().error("exitsafe: early hook %r failed: %s", display_name(hook), detail)
            else:
                outcome, detail = Outcome.HOOK_RAN, None
            _end_early_hook(hook, outcome, detail)
    finally:
        runner.close()


def _end_early_hook(hook: Record, outcome: str, detail: Optional[str]) -> None:
    state = hook._registry
    trash: list[object] = []

    def end() -> None:
        state.hooks.forget_early(hook)
        state.finish(hook, outcome, detail, True, trash)

    _sync.locked_quietly(end)
    trash.clear()

"""The teardown executor: one registry's ordered release of its live handles and hooks.

[`Registry.teardown`][exitsafe.Registry.teardown] switches the registry to the tearing-down phase
and, in the same locked section, `claim`-s every live node (state ``RELEASING``, so ``raw`` and
``borrow()`` refuse them from now on and no other thread can release them). Then
[`run`][exitsafe.testing.run], outside the lock,

1. orders the nodes (`exitsafe._graph.teardown_order`);
2. decides each step (inherited, dependent of a leak, borrowed, deadline, exit policy)
   and runs it: inline, or on a worker thread when a timeout applies; a release that
   another thread was already running is waited for (bounded) instead;
3. writes each decision into the ``decided`` dict it is given, as it goes.

The registry records the decisions (and ``leaked_interrupted`` for the nodes ``run``
never reached, if something interrupted it) after ``run`` returns or raises: the
teardown is all or recorded.  Only the tearing-down thread touches the claimed nodes,
which keeps a step to a few attribute reads and one call.
"""

from __future__ import annotations

import _thread
from time import perf_counter, sleep

from . import _config, _process, _record, _sync, _threads, _users
from ._core import speedups
from ._graph import teardown_order
from ._ledger import Outcome, trace_line
from ._record import HOOK, LIVE, RELEASING, TAINTING, display_name
from ._report import emit, log
from ._threads import StillRunning
from ._users import InUse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from ._handle import HandleInfo
    from ._record import Record as Node
    from ._steps import StepRunner

    Decided = dict[Node, tuple[str, Optional[str]]]

#: Seconds a teardown waits, when no step timeout is configured, for a release that
#: another thread is running (and another thread waits for a teardown in progress
#: elsewhere) before it gives up and records the handle ``leaked_in_use``.
IN_FLIGHT_WAIT = 5.0

_RELEASED_AT_EXIT = Outcome.RELEASED_AT_EXIT


def claim(nodes: list[Node], me: int) -> set[Node]:
    """Mark every live node of ``nodes`` as being released by this teardown.

    Called under the lock in the section that begins the teardown.  Returns the nodes
    some thread was already releasing: the teardown waits for them instead.
    """
    if speedups is not None and type(nodes) is list:
        claimed_elsewhere: set[Node] = speedups.claim(nodes, me)  # the same loop, in C
        return claimed_elsewhere
    elsewhere: set[Node] = set()
    for node in nodes:
        if node._state == LIVE:
            _record.claim(node, me)
        else:
            elsewhere.add(node)
    return elsewhere


class Settings:
    """What one teardown needs to know, read once when it begins."""

    __slots__ = (
        "allowed",
        "deadline",
        "default_policy",
        "main_ident",
        "override",
        "reason",
        "registry_name",
        "running",
        "started",
        "step_timeout",
        "trace",
    )

    def __init__(self, registry: Any, reason: str) -> None:
        self.started = perf_counter()
        self.registry_name = registry.name
        self.reason = reason
        self.trace = _config.trace_enabled()
        self.override = _config.at_exit_override()
        #: Threads that may use any handle still run (see exitsafe._quiesce): why
        #: nothing is released, or ``None``.
        self.running = _process.threads_running()
        self.default_policy: Any = registry.exit_policy
        step = registry.step_timeout
        self.step_timeout = step if step is not None else _config.seconds("EXITSAFE_STEP_TIMEOUT")
        total = registry.teardown_timeout
        if total is None:
            total = _config.seconds("EXITSAFE_TEARDOWN_TIMEOUT")
        self.deadline = None if total is None else self.started + total
        self.main_ident: Optional[int] = None  # looked up when a policy first needs it
        #: Threads that may borrow during this teardown (its own, its step workers).
        self.allowed: set[int] = set()


def run(nodes: list[Node], elsewhere: set[Node], settings: Settings, decided: Decided) -> None:
    """Run one teardown over ``nodes`` (claimed by `claim`, oldest first)."""
    order = teardown_order(nodes)
    trace = settings.trace
    if trace:
        _trace_begin(settings, nodes, len(order))
    from ._steps import StepRunner

    runner = StepRunner()
    runner.allowed = settings.allowed
    me = _thread.get_ident()
    _users.tearing_down.add(me)
    fast = (
        settings.override is None
        and settings.deadline is None
        and settings.step_timeout is None
        and settings.running is None
    )
    total = len(order)
    running_before = settings.running
    # The compiled core runs stretches of common steps in C (see speedups.release_steps):
    # the same step as the one below, without a Python frame per handle.
    release_steps = speedups.release_steps if speedups is not None and fast and not trace else None
    released_pair = (_RELEASED_AT_EXIT, None)
    position = 0  # index in order of the next step
    raised: Optional[BaseException] = None
    try:
        while True:  # (not "while position < total:", whose backward jump CPython 3.12
            if position >= total:  # and 3.13 leave out of the try: test_try_coverage)
                break
            if release_steps is not None:
                # raised: the release function of order[position] raised (recorded below)
                position, raised = release_steps(
                    order, position, decided, settings.default_policy, elsewhere, released_pair
                )
                if position >= total:
                    break
            node = order[position]
            position += 1
            t0 = perf_counter() if trace else 0.0
            if trace:  # so that a step that hangs or crashes is named in the trace
                emit(
                    trace_line(
                        "step-begin", registry=settings.registry_name, index=position,
                        of=total, kind=node._kind, name=display_name(node),
                    )
                )
            verdict = _step(node, raised, elsewhere, settings, runner, fast)
            if node._role == HOOK and settings.running is None:
                # A hook found threads still inside native code (exitsafe.native's
                # sections): nothing is released from now on.
                settings.running = _process.threads_running()
                if settings.running is not None:
                    fast, release_steps = False, None
            if verdict is None:
                continue  # finished on its thread, which recorded its outcome
            outcome, detail = decided[node] = verdict
            if not (elsewhere and node in elsewhere):  # (else _close settles it, locked)
                _record.mark(node, outcome)  # visible at once: to later hooks, to Handle.state
            if outcome in TAINTING:
                _record.taint_parents(node, outcome)
            if not trace:  # (not "if trace: ...", which would end the loop's body with a
                continue  # conditional: CPython 3.12-3.14 leave the backward jump out)
            _trace_step(settings, position, total, node, outcome, detail, t0)
    finally:
        _users.tearing_down.discard(me)
        runner.close()
        found_here = settings.running is not None and running_before is None
        if found_here and settings.reason == "explicit":
            # Found by this teardown's hook (a native section in flight): the program goes
            # on, and the next teardown looks again.
            _process.set_threads_running(None)
    if trace:
        _trace_end(settings, decided)


def _step(
    node: Node, raised: Optional[BaseException], elsewhere: set[Node], settings: Settings,
    runner: Any, fast: bool,
) -> Optional[tuple[str, Optional[str]]]:
    """The outcome of ``node``'s step and its detail; ``None`` if it was in flight on
    another thread, which finished it and recorded its outcome.  ``raised``: its release
    ran in the compiled steps, and raised."""
    if raised is not None:
        return _release_raised(node, raised)
    if elsewhere and node in elsewhere:
        return _wait_in_flight(node, settings)
    if settings.running is not None and node._role != HOOK:
        return Outcome.LEAKED_IN_USE, settings.running  # (never released under a thread)
    policy = node._policy if node._policy is not None else settings.default_policy
    if (
        fast
        and policy == "release"
        and node._role != HOOK
        and node._taint is None
        and node._affinity is None
        and not node._borrows
        and node._timeout is None
        and node._gen == _sync.generation  # read per step: a step may fork
    ):
        # The common case, kept free of everything the general path checks.
        try:
            node._fn(node._raw)  # type: ignore[misc]
        except BaseException as exc:  # recorded and logged; teardown goes on
            return _release_raised(node, exc)
        return _RELEASED_AT_EXIT, None
    return _general_step(node, policy, settings, runner)


def _trace_begin(settings: Settings, nodes: list[Node], steps: int) -> None:
    hooks = sum(1 for n in nodes if n._role == HOOK)
    name = settings.registry_name
    emit(
        trace_line(
            "teardown-begin", registry=name, reason=settings.reason,
            live=len(nodes) - hooks, hooks=hooks,
        )
    )
    emit(trace_line("plan", registry=name, steps=steps))


def _trace_end(settings: Settings, decided: Decided) -> None:
    outcomes = [o for o, _ in decided.values()]
    released = outcomes.count(_RELEASED_AT_EXIT)
    leaked = sum(1 for o in outcomes if o.startswith("leaked_"))
    failed = sum(1 for o in outcomes if o in (Outcome.RELEASE_FAILED, Outcome.HOOK_FAILED))
    emit(
        trace_line(
            "teardown-end", registry=settings.registry_name, released=released,
            leaked=leaked, failed=failed,
            ms=f"{(perf_counter() - settings.started) * 1000:.3f}",
        )
    )


def _trace_step(
    settings: Settings, index: int, total: int, node: Node, outcome: str,
    detail: Optional[str], t0: float,
) -> None:
    action = "hook" if node._role == HOOK else "release"
    if outcome.startswith("leaked_"):
        action = "leak"
    emit(
        trace_line(
            "step", registry=settings.registry_name, index=index, of=total, action=action,
            kind=node._kind, name=display_name(node), outcome=outcome,
            ms=f"{(perf_counter() - t0) * 1000:.3f}", error=detail or None,
        )
    )


class _PolicyStep:
    """A callable exit policy and the release it allows, run as one (bounded) step."""

    __slots__ = ("fn", "info", "leak", "phase", "policy")

    def __init__(self, policy: Callable[[HandleInfo], str], info: HandleInfo, fn: Any) -> None:
        self.policy = policy
        self.info = info
        self.fn = fn
        self.phase = "exit policy"
        self.leak: Optional[str] = None

    def __call__(self, raw: Any) -> None:
        self.leak = _ask_policy(self.policy, self.info)
        if self.leak is None:
            self.phase = "release"
            self.fn(raw)


def _general_step(
    node: Node, policy: Any, settings: Settings, runner: StepRunner
) -> tuple[str, Optional[str]]:
    is_hook = node._role == HOOK
    if node._gen != _sync.generation and not (is_hook and node._in_child):
        return Outcome.LEAKED_INHERITED, "inherited from the parent process"
    if node._taint is not None and not is_hook:
        return Outcome.LEAKED_DEPENDENT, node._taint
    if node._borrows:
        verdict = _wait_for_borrows(node, settings)
        if verdict is not None:
            return verdict
    if node._affinity is not None and not is_hook:
        verdict = _check_affinity(node)
        if verdict is not None:
            return verdict
    deadline = settings.deadline
    if deadline is not None and perf_counter() >= deadline:
        outcome = Outcome.HOOK_TIMEOUT if is_hook else Outcome.LEAKED_TIMEOUT
        return outcome, "teardown deadline passed before this step"
    step: Any = node._fn
    policy_step: Optional[_PolicyStep] = None
    if not is_hook:
        if settings.override is None and callable(policy):
            policy_step = step = _PolicyStep(policy, _info(node, settings), node._fn)
        else:
            leak = _fixed_verdict(settings.override, policy)
            if leak is not None:
                return Outcome.LEAKED_POLICY, leak
    timeout = node._timeout if node._timeout is not None else settings.step_timeout
    if deadline is not None:
        left = deadline - perf_counter()
        timeout = left if timeout is None else min(timeout, left)
    from ._steps import ExitRequested, NoWorkerError

    try:
        finished, error = runner.call(step, node._raw, timeout, node)
    except NoWorkerError as exc:
        # Running it unbounded could hang the exit this timeout exists to bound.
        detail = f"not run: no thread could be started to bound it ({exc})"
        log().warning("exitsafe: %s %r %s", node._kind, display_name(node), detail)
        return (Outcome.HOOK_TIMEOUT if is_hook else Outcome.LEAKED_TIMEOUT), detail
    if not finished:
        what = policy_step.phase if policy_step is not None else ("hook" if is_hook else "release")
        detail = f"{what} still running after {timeout:.3g} s; abandoned"
        log().warning("exitsafe: %s %r %s", node._kind, display_name(node), detail)
        return (Outcome.HOOK_TIMEOUT if is_hook else Outcome.LEAKED_TIMEOUT), detail
    if error is not None:
        if isinstance(error, ExitRequested):  # the process leaves when this teardown ends
            what = "hook" if is_hook else "release"
            if policy_step is not None:
                what = policy_step.phase
            return Outcome.LEAKED_INTERRUPTED, error.detail(what)
        if isinstance(error, StillRunning):  # a worker that did not stop in time
            log().warning("exitsafe: %s", error)
            return Outcome.HOOK_TIMEOUT, str(error)
        if not is_hook:
            return _release_raised(node, error)
        detail = repr(error)
        _log_failure("hook", node, detail)
        return Outcome.HOOK_FAILED, detail
    if policy_step is not None and policy_step.leak is not None:
        return Outcome.LEAKED_POLICY, policy_step.leak
    return (Outcome.HOOK_RAN if is_hook else _RELEASED_AT_EXIT), None


def _wait_for_borrows(node: Node, settings: Settings) -> Optional[tuple[str, Optional[str]]]:
    """Wait for the borrows of ``node`` in flight on other threads; ``None`` once they
    ended, else the outcome.  Borrows cannot start any more (the gate is closed for
    other threads), so the count only goes down.  Never waits for the teardown's own
    thread, bounded like a release running elsewhere."""
    mine = _threads.held_here(node)
    if mine:
        return Outcome.LEAKED_IN_USE, "borrowed by the thread running the teardown"
    limit = settings.step_timeout if settings.step_timeout is not None else IN_FLIGHT_WAIT
    end = perf_counter() + limit
    if settings.deadline is not None:
        end = min(end, settings.deadline)
    pause = 0.0005
    while node._borrows and perf_counter() < end:
        sleep(pause)
        pause = min(pause * 2, 0.02)
    if not node._borrows:
        return None
    detail = f"still borrowed on another thread after {limit:.3g} s"
    log().warning("exitsafe: %s %r %s; leaking it", node._kind, display_name(node), detail)
    return Outcome.LEAKED_IN_USE, detail


def _check_affinity(node: Node) -> Optional[tuple[str, Optional[str]]]:
    """A thread-affine handle: released here if this thread owns it or its owner is gone,
    else leaked (its owner still runs, elsewhere)."""
    owner = node._affinity
    if _threads.on_owner_thread(node) or not owner.is_alive():
        return None
    detail = (
        f"must be released on {owner.name!r}, which is still running and is not the "
        f"thread running the teardown"
    )
    return Outcome.LEAKED_AFFINITY, detail


def _info(node: Node, settings: Settings) -> HandleInfo:
    from ._handle import HandleInfo

    if settings.main_ident is None:
        import threading

        settings.main_ident = threading.main_thread().ident
    return HandleInfo(node, _sync.generation, settings.main_ident)


def _release_raised(node: Node, exc: BaseException) -> tuple[str, Optional[str]]:
    """The outcome of a release function that raised: ``leaked_in_use`` when it refused
    to run under a thread still using the object (`exitsafe._users.InUse`), else
    ``release_failed``."""
    if isinstance(exc, InUse):
        detail = str(exc)
        log().warning("exitsafe: %s %r %s; leaking it", node._kind, display_name(node), detail)
        return Outcome.LEAKED_IN_USE, detail
    detail = repr(exc)
    _log_failure("release", node, detail)
    return Outcome.RELEASE_FAILED, detail


def _log_failure(action: str, node: Node, detail: str) -> None:
    log().error(
        "exitsafe: %s of %s %r failed at teardown: %s",
        action,
        node._kind,
        display_name(node),
        detail,
    )


def _wait_in_flight(node: Node, settings: Settings) -> Optional[tuple[str, Optional[str]]]:
    """Wait for a release another thread runs; ``None`` when it finished in time.

    Never waits for the calling thread itself (a teardown started from inside a
    release function or a signal handler on the thread running that release).
    Otherwise bounded by the step timeout, or `IN_FLIGHT_WAIT`, and the deadline.
    """
    import _thread

    if node._releaser == _thread.get_ident():
        detail = "its release is in progress on the thread running the teardown"
    else:
        limit = settings.step_timeout if settings.step_timeout is not None else IN_FLIGHT_WAIT
        end = perf_counter() + limit
        if settings.deadline is not None:
            end = min(end, settings.deadline)
        pause = 0.0005
        while _in_flight(node) and perf_counter() < end:
            sleep(pause)
            pause = min(pause * 2, 0.02)
        if not _in_flight(node):
            return None
        detail = f"still being released on another thread after {limit:.3g} s"
    log().warning("exitsafe: %s %r %s; leaking it", node._kind, display_name(node), detail)
    return Outcome.LEAKED_IN_USE, detail


def _in_flight(node: Node) -> bool:
    """Whether a release another thread began is still running."""
    return node._state == RELEASING


# A decision is None (release) or why the handle is leaked.  A callable policy is asked
# through a _PolicyStep, so that the step's time bound applies to it too.


def _fixed_verdict(override: Optional[str], policy: Any) -> Optional[str]:
    """The decision of ``EXITSAFE_AT_EXIT`` or a ``"release"`` / ``"leak"`` policy."""
    if override == "release":
        return None
    if override == "leak":
        return "EXITSAFE_AT_EXIT=leak"
    return "exit_policy='leak'" if policy == "leak" else None


def _ask_policy(policy: Callable[[HandleInfo], str], info: HandleInfo) -> Optional[str]:
    """Ask a callable policy: ``None`` to release, else why the handle is leaked."""
    try:
        verdict = policy(info)
    except BaseException as exc:  # a broken policy must not stop the teardown
        log().error(
            "exitsafe: exit policy for %s %r raised %s; leaking it", info.kind, info.name, repr(exc)
        )  # the repr, so that a handler keeping records does not keep the traceback
        return f"exit policy raised {exc!r}"
    # Only the two strings (or str subclasses such as an enum.StrEnum) count: anything
    # else is not compared at all (an array-like's __eq__ may raise or answer with an
    # array), and a str subclass whose comparison raises is a bad answer like any other.
    try:
        answer = str.__str__(verdict) if isinstance(verdict, str) else None
    except BaseException:  # an object whose __class__ raises: a bad answer like any other
        answer = None
    if answer == "release":
        return None
    if answer == "leak":
        return f"exit policy {getattr(policy, '__name__', policy)!s}"
    shown = _describe(verdict)
    log().error(
        "exitsafe: exit policy for %s %r returned %s (not 'release' or 'leak'); leaking it",
        info.kind,
        info.name,
        shown,
    )
    return f"exit policy returned {shown}"


def _describe(value: object) -> str:
    """``repr(value)``, or its type when that repr itself fails."""
    try:
        return repr(value)
    except BaseException:  # a user object's __repr__: the teardown goes on regardless
        return f"a {type(value).__name__} object (its repr() failed)"


def signals_held() -> Any:
    """Context manager: on the main thread, hold back SIGINT and exitsafe's own signal
    handlers while a teardown runs, and deliver what arrived right after it.

    See `exitsafe._interrupts`.
    """
    from ._interrupts import held

    return held()


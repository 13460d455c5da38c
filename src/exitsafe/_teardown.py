"""The teardown executor: one registry's ordered release of its live handles and hooks.

The plan comes from :func:`exitsafe._planner.teardown_order`; each step is claimed under
the registry's lock (so a release racing on another thread runs exactly once), decided
(hook, inherited, dependent of a leak, borrowed, deadline, exit policy), run outside the
lock (inline, or on a worker thread when a timeout applies), and recorded.
"""

from __future__ import annotations

import time
from time import perf_counter

from . import _config, _states
from ._ledger import Outcome
from ._planner import ROLE_HOOK, teardown_order
from ._report import emit, log, quote
from ._states import LIVE, RELEASING
from ._steps import StepRunner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from .lifetime import Handle, Registry


def execute(registry: Registry, snapshot: list[Handle], reason: str) -> None:
    """Run ``registry``'s teardown over ``snapshot`` (its live handles and hooks, oldest first).

    Called by :meth:`Registry.teardown` once the registry is in the tearing-down phase.
    """
    started = perf_counter()
    trace = registry._trace = _config.trace_enabled()
    override = _config.at_exit_override()
    step_timeout = registry.step_timeout
    if step_timeout is None:
        step_timeout = _config.seconds("EXITSAFE_STEP_TIMEOUT")
    total = registry._total_timeout()
    deadline = None if total is None else started + total
    order = teardown_order(snapshot)
    if trace:
        hooks = sum(1 for n in snapshot if n._role == ROLE_HOOK)
        emit(
            f"exitsafe: teardown-begin registry={quote(registry.name)} reason={quote(reason)}"
            f" live={len(snapshot) - hooks} hooks={hooks}"
        )
        emit(f"exitsafe: plan registry={quote(registry.name)} steps={len(order)}")
    runner = StepRunner()
    failed = 0
    try:
        for index, node in enumerate(order, 1):
            t0 = perf_counter()
            result = _step(registry, node, override, step_timeout, deadline, runner)
            if result is None:
                continue
            action, outcome, detail = result
            if outcome in (Outcome.RELEASE_FAILED, Outcome.HOOK_FAILED):
                failed += 1
            if trace:
                error = f" error={quote(detail)}" if detail else ""
                emit(
                    f"exitsafe: step registry={quote(registry.name)} index={index} of={len(order)}"
                    f" action={action} kind={quote(node.kind)} name={quote(node.name)}"
                    f" outcome={outcome} ms={(perf_counter() - t0) * 1000:.3f}{error}"
                )
    finally:
        runner.close()
    if trace:
        counts = registry._counts
        released = counts.get(Outcome.RELEASED_AT_EXIT, 0)
        leaked = sum(v for k, v in counts.items() if k.startswith("leaked_"))
        emit(
            f"exitsafe: teardown-end registry={quote(registry.name)} released={released}"
            f" leaked={leaked} failed={failed} ms={(perf_counter() - started) * 1000:.3f}"
        )


def _step(
    registry: Registry,
    node: Handle,
    override: Optional[str],
    step_timeout: Optional[float],
    deadline: Optional[float],
    runner: StepRunner,
) -> Optional[tuple[str, str, Optional[str]]]:
    if node._state == RELEASING:
        _wait_for_other_thread(registry, node, step_timeout, deadline)
    with registry._lock:
        if node._state != LIVE:
            return None  # finished meanwhile by another thread; its outcome is recorded
        node._state = RELEASING
        borrowed = node._borrows > 0
    is_hook = node._role == ROLE_HOOK
    action = "hook" if is_hook else "release"
    detail: Optional[str] = None
    if node._gen != _states.fork_generation:
        outcome, detail = Outcome.LEAKED_INHERITED, "inherited from the parent process"
    elif node._taint is not None and not is_hook:
        outcome, detail = Outcome.LEAKED_DEPENDENT, node._taint
    elif borrowed:
        outcome, detail = Outcome.LEAKED_IN_USE, "borrowed at teardown"
    elif deadline is not None and perf_counter() >= deadline:
        outcome = Outcome.HOOK_TIMEOUT if is_hook else Outcome.LEAKED_TIMEOUT
        detail = "teardown deadline passed before this step"
    else:
        decision = "release" if is_hook else _decide(registry, node, override)
        if decision == "release":
            timeout = node._timeout if node._timeout is not None else step_timeout
            if deadline is not None:
                left = deadline - perf_counter()
                timeout = left if timeout is None else min(timeout, left)
            fn = node._fn
            assert fn is not None
            finished, error = runner.call(fn, node._raw, timeout)
            if not finished:
                outcome = Outcome.HOOK_TIMEOUT if is_hook else Outcome.LEAKED_TIMEOUT
                detail = f"still running after {timeout:.3g} s; abandoned"
                log().warning("exitsafe: %s %r %s", node.kind, node.name, detail)
            elif error is not None:
                outcome = Outcome.HOOK_FAILED if is_hook else Outcome.RELEASE_FAILED
                detail = repr(error)
                log().error(
                    "exitsafe: %s of %s %r failed at teardown: %s",
                    action,
                    node.kind,
                    node.name,
                    detail,
                )
            else:
                outcome = Outcome.HOOK_RAN if is_hook else Outcome.RELEASED_AT_EXIT
        else:
            outcome, detail = Outcome.LEAKED_POLICY, decision[5:] or None
            action = "leak"
    if outcome.startswith("leaked_"):
        action = "leak"
    with registry._lock:
        registry._finish_locked(node, outcome, detail, True)
    return action, outcome, detail


def _wait_for_other_thread(
    registry: Registry, node: Handle, step_timeout: Optional[float], deadline: Optional[float]
) -> None:
    limit = step_timeout if step_timeout is not None else 5.0
    end = perf_counter() + limit
    if deadline is not None:
        end = min(end, deadline)
    while node._state == RELEASING and perf_counter() < end:
        time.sleep(0.001)
    if node._state == RELEASING:
        # Still running elsewhere: what it depends on must not go from under it.
        with registry._lock:
            for parent in node._parents:
                if parent._taint is None:
                    parent._taint = f"{node.kind} {node.name!r} was still being released"


def _decide(registry: Registry, node: Handle, override: Optional[str]) -> str:
    """``"release"`` or ``"leak<detail>"`` for ``node`` at teardown."""
    if override == "release":
        return "release"
    if override == "leak":
        return "leak:EXITSAFE_AT_EXIT=leak"
    policy = node._policy if node._policy is not None else registry.exit_policy
    if policy == "release":
        return "release"
    if policy == "leak":
        return "leak:exit_policy='leak'"
    try:
        verdict = policy(node)  # type: ignore[operator]
    except BaseException as exc:  # a broken policy must not stop the teardown
        log().error(
            "exitsafe: exit policy for %s %r raised %r; leaking it", node.kind, node.name, exc
        )
        return f"leak:exit policy raised {exc!r}"
    if verdict == "release":
        return "release"
    if verdict == "leak":
        return f"leak:exit policy {getattr(policy, '__name__', policy)!s}"
    log().error(
        "exitsafe: exit policy for %s %r returned %r (not 'release' or 'leak'); leaking it",
        node.kind,
        node.name,
        verdict,
    )
    return f"leak:exit policy returned {verdict!r}"

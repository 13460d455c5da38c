"""Closing a registry: beginning a teardown, recording what it decided, closing, and what a
forked child does with a teardown that another thread of its parent was running.

The teardown itself (order, policies, timeouts, the trace) is `exitsafe._teardown`; this
module owns the phase changes around it (``OPEN`` -> ``TEARING`` -> ``CLOSED``) and the rule
"all or recorded": every record the teardown claimed ends with exactly one outcome.
`Closing` is the part of a registry's state that knows the teardown in progress.
"""

from __future__ import annotations

import _thread
import sys

from . import _collection, _config, _hooks, _process, _record, _sync, _threads
from ._core import speedups
from ._ledger import Outcome
from ._phase import CLOSED, TEARING
from ._record import RELEASING, Record
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    Decided = dict[Record, tuple[str, Optional[str]]]

__all__ = ["Closing", "finish_own_teardown", "teardown"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_deferred = _sync.deferred

#: How many records are recorded per section at the end of a teardown, so that other
#: threads get a turn.
CHUNK = 4096


class Closing:
    """The teardown in progress of one registry: which thread runs it, a lock held while
    it runs (for other threads to wait on), and what it claimed and decided until it
    records them."""

    __slots__ = ("done", "in_progress", "thread")

    def __init__(self) -> None:
        self.thread = 0  # the thread running the teardown, while it runs
        self.done: Any = None  # a lock held while the teardown runs
        #: The running teardown's claimed records, its records elsewhere and its
        #: decisions, until it records them (see `finish_own_teardown`).
        self.in_progress: Any = None

    def begin(self, ident: int) -> Any:
        """Thread ``ident`` begins the teardown: the lock other threads wait on."""
        self.thread = ident
        done = self.done = _thread.allocate_lock()
        done.acquire()
        return done

    def take_in_progress(self) -> Any:
        """What the teardown claimed and decided, once (then ``None``)."""
        state, self.in_progress = self.in_progress, None
        return state

    def ended(self) -> None:
        self.thread = 0

    def abandon(self) -> None:
        """In a forked child: the parent's teardown, run by another thread, is not here."""
        self.thread = 0
        self.done = None


def teardown(state: Any, reason: str) -> None:
    """[`Registry.teardown`][exitsafe.Registry.teardown] of ``state`` (documented there)."""
    if _reentered():
        _sync.defer(teardown, state, reason)
        return
    if _collection.collecting_here():  # (see exitsafe._collection)
        _collection.after_collection(teardown, state, reason)
        return
    if _deferred:
        _sync.run_deferred()  # settle the requests queued before the teardown
    from . import _teardown  # (the teardown's modules load on first use)

    # Signals are held back from the early hooks on, delivered once it is all done (not
    # while waiting for another thread's teardown: a Ctrl-C may end that wait).
    with _teardown.signals_held():
        try:
            if not state.hooks.early_ran:
                _hooks.run_early_hooks(state, reason)
            running_elsewhere = _tear_down(state, reason)
        finally:
            # A timed step of it called exitsafe.exit() on its worker: now that every
            # outcome is recorded, this thread carries out that exit.
            _leave_if_asked()
    if running_elsewhere:
        _wait_for_teardown(state)


def _leave_if_asked() -> None:
    """``exitsafe._steps.leave_if_asked`` if a step ever ran on a worker (else nothing)."""
    steps = loaded_steps()
    if steps is not None:
        steps.leave_if_asked()


def loaded_steps() -> Any:
    """``exitsafe._steps`` once imported, else ``None``: no step ever ran on a worker.

    Half-imported (another registry's teardown on another thread importing it first) is not
    imported yet: no step of it ran (reading its functions then raised AttributeError, seen
    under load)."""
    steps = sys.modules.get("exitsafe._steps")
    if steps is None or getattr(getattr(steps, "__spec__", None), "_initializing", False):
        return None
    return steps


def _tear_down(state: Any, reason: str) -> bool:
    """`teardown` after the early hooks (signals held back by the caller); whether a
    teardown of this registry runs on another thread (the caller waits for it)."""
    from . import _teardown

    me = _get_ident()

    def begin() -> Optional[tuple[list[Record], set[Record], Any, set[int]]]:
        if not state.begin_teardown():  # (closes the borrow gate to other threads)
            return None
        allowed = state.gate.close_to_all_but(me)
        done = state.closing.begin(me)
        for queued in _threads.take_registry(state):  # thread-affine releases
            _record.unclaim(queued)
        nodes = state.nodes()  # (the taken-back releases included)
        return nodes, _teardown.claim(nodes, me), done, allowed

    begun = _sync.locked_quietly(begin)
    if begun is None:
        return bool(state.phase == TEARING and state.closing.thread != me)
    nodes, elsewhere, done, allowed = begun
    decided: Decided = {}
    # (Signals are held back by the caller until every outcome is recorded: a handler
    # acting on one, a second signal in the immediate mode writing the ledger, sees them
    # all.)
    try:
        state.closing.in_progress = (nodes, elsewhere, decided)
        settings = _teardown.Settings(state, reason)
        settings.allowed = allowed
        state.trace = settings.trace
        _teardown.run(nodes, elsewhere, settings, decided)
    finally:
        _close_in_progress(state)
        done.release()
    if _deferred:
        _sync.run_deferred()
    return False


def finish_own_teardown(state: Any) -> None:
    """Record now what the teardown running on this thread decided so far, the rest
    ``leaked_interrupted``, and close: for `exitsafe.exit` called by one of its steps (a
    release function, a hook), which ends the process without returning to it.  The
    teardown records its outcomes only when it ends, so the ledger written on the way out
    would otherwise hold none of them.  Nothing to do otherwise."""
    if state.closing.thread == _get_ident():
        _close_in_progress(state)


def _close_in_progress(state: Any) -> None:
    progress = state.closing.take_in_progress()  # (once: see finish_own_teardown)
    if progress is not None:
        _close(state, *progress)


def _close(state: Any, nodes: list[Record], elsewhere: set[Record], decided: Decided) -> None:
    """Record every claimed record's outcome (``leaked_interrupted`` if undecided), close."""
    # In the order the teardown decided, then whatever it never reached.
    trash: list[object] = []
    position: Optional[int] = 0
    # The process ends: the handles recorded in C leave the garbage collector's lists (the
    # interpreter's last collections would traverse each of them several times).
    untrack = _process.process_ending()
    while speedups is not None and position is not None:
        # The loop below, with the common records made in C (decided is not changed).
        position = _sync.locked_quietly(
            speedups.record_exit_outcomes, state, decided, position, CHUNK, elsewhere,
            state.finish, trash, untrack,
        )
        trash.clear()
    records: list[tuple[Record, tuple[str, Optional[str]]]] = (
        [] if speedups is not None else list(decided.items())
    )
    if len(decided) < len(nodes):
        detail = "the teardown was interrupted before it reached this handle"
        records += [
            (node, (Outcome.LEAKED_INTERRUPTED, detail))
            for node in nodes
            if node not in decided and node not in elsewhere
        ]

    def record(chunk: list[tuple[Record, tuple[str, Optional[str]]]]) -> None:
        for node, (outcome, why) in chunk:
            # The teardown settled its own records; for one it gave up waiting for, the
            # releasing thread may have recorded its outcome first (whoever removes it
            # from the live table records it).
            mine = node not in elsewhere
            if mine or state.live.take(node):
                state.finish(node, outcome, why, True, trash, mine)

    for start in range(0, len(records), CHUNK):
        _sync.locked_quietly(record, records[start : start + CHUNK])
        trash.clear()

    def close() -> None:
        state.close()
        state.closing.ended()

    _sync.locked_quietly(close)


def after_fork_in_child(state: Any) -> None:
    """In a forked child: forget what the parent's *other* threads were doing.

    Only the forking thread exists in the child.  A teardown or a release that another
    thread was running will never finish here: the registry reopens and those records
    become live again, so that the child's own exit teardown gives every inherited
    record its outcome (``leaked_inherited``); the records that teardown had already
    decided are recorded ``leaked_inherited`` at once.  Work of the forking thread itself
    (a fork inside a hook or a release function) continues as it is, and checks the fork
    generation at every step.
    """
    me = _get_ident()
    abandoned = state.phase == TEARING and state.closing.thread != me
    # Forked by a worker running one of that teardown's timed steps (a hook or a release
    # function that forks): the child must not run that step again.
    steps = loaded_steps()
    stepping = steps.running_here() if abandoned and steps is not None else None
    if abandoned:
        state.reopen()
        state.closing.abandon()
        state.gate.reopen()
    state.hooks.after_fork_in_child()
    trash: list[object] = []

    def settle() -> None:
        for node in state.nodes():
            if node is stepping:
                state.finish(
                    node, Outcome.LEAKED_INHERITED,
                    "its teardown step was running when this process was forked from it",
                    True, trash,
                )
            elif node._state == RELEASING and node._releaser != me:
                _record.unclaim(node)
            elif abandoned and node._state > RELEASING:
                # Decided by the parent's teardown, which records its decisions at its
                # end, never reached here: the child's record of it.
                state.finish(
                    node, Outcome.LEAKED_INHERITED,
                    "decided by the parent's teardown, which was running on another "
                    "thread when this process was forked",
                    True, trash, True,
                )

    # (the child's only thread: no wait, but the same discipline)
    _sync.locked_quietly(settle)
    trash.clear()


def _wait_for_teardown(state: Any) -> None:
    from . import _teardown

    done = state.closing.done
    total = _total_timeout(state)
    bound = _teardown.IN_FLIGHT_WAIT if total is None else min(total, _thread.TIMEOUT_MAX)
    if done is not None and done.acquire(True, bound):
        done.release()
    elif state.phase != CLOSED:
        log().warning(
            "exitsafe: registry %r: gave up waiting %.3g s for the teardown running on "
            "another thread",
            state.name,
            bound,
        )


def _total_timeout(state: Any) -> Optional[float]:
    if state.teardown_timeout is not None:
        return float(state.teardown_timeout)
    return _config.seconds("EXITSAFE_TEARDOWN_TIMEOUT")


"""Closing, a part of [`Registry`][exitsafe.Registry]: beginning a teardown, recording what
it decided, closing the registry, and what a forked child does with a teardown that
another thread of its parent was running.

The teardown itself (order, policies, timeouts, the trace) is `exitsafe._teardown`;
this mixin owns the phase changes around it (``OPEN`` -> ``TEARING`` -> ``CLOSED``) and the
rule "all or recorded": every node the teardown claimed ends with exactly one outcome.
"""

from __future__ import annotations

import _thread
import sys

from . import _config, _sync, _threads
from ._core import speedups
from ._ledger import Outcome
from ._node import LIVE, RELEASING
from ._node import Node as _Node
from ._phase import CLOSED, OPEN, TEARING
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = ["Closing"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_release = _sync.release
_defer = _sync.defer
_deferred = _sync._deferred
_run_deferred = _sync.run_deferred


def _leave_if_asked() -> None:
    """``exitsafe._steps.leave_if_asked`` if a step ever ran on a worker (else nothing)."""
    steps = sys.modules.get("exitsafe._steps")
    if steps is not None:
        steps.leave_if_asked()


class Closing:
    """The teardown half of [`Registry`][exitsafe.Registry] (a mixin)."""

    if TYPE_CHECKING:
        name: str
        _phase: int
        _trace: bool
        _early_ran: bool
        _teardown_thread: int
        _teardown_threads: set[int]
        _teardown_done: Any
        _teardown_timeout: Optional[float]
        _in_progress: Any
        _live: Any

        def _run_early_hooks(self, reason: str) -> None: ...
        def _nodes(self) -> list[_Node]: ...
        def _finish(
            self, node: _Node, outcome: str, detail: Optional[str], at_exit: bool,
            trash: list[object], decided: bool = False,
        ) -> list[_Node]: ...

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

        Order: a step runs only after every handle depending on it is done; among ready steps
        hooks go first, libraries last, newest first otherwise.  Each handle is released or
        leaked by its exit policy, the registry's default, or `EXITSAFE_AT_EXIT`; a borrowed
        handle is leaked (`leaked_in_use`), and whatever a leaked handle depends on is leaked
        too.  A release that raises is logged and recorded and teardown goes on.

        All or recorded: whatever interrupts the teardown (an exception escaping a step,
        KeyboardInterrupt), every handle it claimed ends with exactly one outcome
        (`leaked_interrupted` for those it did not reach), and the registry is closed.  On the
        main thread, SIGINT and exitsafe's own signal handlers are held back while it runs and
        delivered right after (see [`exitsafe.signals`][exitsafe.signals]).

        A release already running on another thread when the teardown reaches it is waited for,
        bounded by the step timeout (`EXITSAFE_STEP_TIMEOUT`) or, without one, 5 seconds, then
        recorded `leaked_in_use`; one running on the teardown's own thread (a teardown started
        from a release function or a signal handler) is never waited for.

        A step that calls [`exitsafe.exit`][exitsafe.exit] on its worker thread (a step
        under a timeout) ends there, `leaked_interrupted`; the teardown goes on with the
        other steps, records every outcome, and then this thread leaves the process as
        `exitsafe.exit` does, with the status the step asked for.

        Idempotent: a second call returns at once; a call from another thread while a teardown
        runs waits for it to finish (bounded by `teardown_timeout`, or 5 seconds without one).
        Called from a finalizer or signal handler that interrupted exitsafe on the same thread,
        it runs right after the interrupted step.  Runs automatically at process exit.

        Args:
            reason: a label recorded in the trace (`reason=...`); the exit teardown uses
                `"atexit"`.
        """
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        if _reentered():
            _defer(self.teardown, reason)
            return
        if _deferred:
            _run_deferred()  # settle the requests queued before the teardown
        from . import _teardown

        # Signals are held back from the early hooks on, delivered once it is all done
        # (not while waiting for another thread's teardown: a Ctrl-C may end that wait).
        with _teardown.signals_held():
            try:
                if not self._early_ran:
                    self._run_early_hooks(reason)
                running_elsewhere = self._tear_down(reason)
            finally:
                # A timed step of it called exitsafe.exit() on its worker: now that every
                # outcome is recorded, this thread carries out that exit.
                _leave_if_asked()
        if running_elsewhere:
            self._wait_for_teardown()

    def _tear_down(self, reason: str) -> bool:
        """`teardown` after the early hooks (signals held back by the caller); whether a
        teardown of this registry runs on another thread (the caller waits for it)."""
        from . import _teardown

        me = _get_ident()
        try:
            _sync.enter()
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
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        if phase != OPEN:
            return phase == TEARING and self._teardown_thread != me
        decided: dict[_Node, tuple[str, Optional[str]]] = {}
        # (Signals are held back by the caller until every outcome is recorded: a handler
        # acting on one, a second signal in the immediate mode writing the ledger, sees
        # them all.)
        try:
            self._in_progress = (nodes, elsewhere, decided)
            settings = _teardown.Settings(self, reason)  # type: ignore[arg-type]
            settings.allowed = self._teardown_threads
            self._trace = settings.trace
            _teardown.run(nodes, elsewhere, settings, decided)
        finally:
            self._close_in_progress()
            done.release()
        if _deferred:
            _run_deferred()
        return False

    def finish_own_teardown(self) -> None:
        """Record now what the teardown running on this thread decided so far, the rest
        ``leaked_interrupted``, and close: for `exitsafe.exit` called by one of its steps (a
        release function, a hook), which ends the process without returning to it.  The
        teardown records its outcomes only when it ends, so the ledger written on the way
        out would otherwise hold none of them.  Nothing to do otherwise."""
        if self._teardown_thread == _get_ident():
            self._close_in_progress()

    def _close_in_progress(self) -> None:
        state, self._in_progress = self._in_progress, None  # (once: see finish_own_teardown)
        if state is not None:
            self._close(*state)

    def _close(
        self,
        nodes: list[_Node],
        elsewhere: set[_Node],
        decided: dict[_Node, tuple[str, Optional[str]]],
    ) -> None:
        """Record every claimed node's outcome (``leaked_interrupted`` if undecided), close."""
        # In the order the teardown decided, then whatever it never reached.
        trash: list[object] = []
        chunk = 4096  # record in sections of this many nodes, so other threads get a turn
        position: Optional[int] = 0
        while speedups is not None and position is not None:
            # The loop below, with the common records made in C (decided is not changed).
            try:
                _sync.enter()
                position = speedups.record_exit_outcomes(
                    self, decided, position, chunk, elsewhere, self._finish, trash
                )
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
            trash.clear()
        records: list[tuple[_Node, tuple[str, Optional[str]]]] = (
            [] if speedups is not None else list(decided.items())
        )
        if len(decided) < len(nodes):
            detail = "the teardown was interrupted before it reached this handle"
            records += [
                (node, (Outcome.LEAKED_INTERRUPTED, detail))
                for node in nodes
                if node not in decided and node not in elsewhere
            ]
        for start in range(0, len(records), chunk):
            try:
                _sync.enter()
                for node, (outcome, why) in records[start : start + chunk]:
                    # The teardown settled its own nodes; for one it gave up waiting for,
                    # the releasing thread may have recorded its outcome first (whoever
                    # removes it from the live table records it).
                    mine = node not in elsewhere
                    if mine or self._live.take(node):
                        self._finish(node, outcome, why, True, trash, mine)
            finally:
                try:
                    _release()
                except RuntimeError:  # (not held: interrupted before taking it)
                    pass
            trash.clear()
        try:
            _sync.enter()
            self._phase = CLOSED
            self._teardown_thread = 0
        finally:
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass

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
        try:
            _sync.enter()  # (the child's only thread: no wait, but the same discipline)
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
            try:
                _release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
        trash.clear()

    def _wait_for_teardown(self) -> None:
        from ._teardown import IN_FLIGHT_WAIT

        done = self._teardown_done
        total = self._total_timeout()
        bound = IN_FLIGHT_WAIT if total is None else min(total, _thread.TIMEOUT_MAX)
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

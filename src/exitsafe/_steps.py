"""Running one teardown step with a time limit.

Without a limit a step runs inline, on the thread doing the teardown.  With a
limit it runs on a daemon worker thread while the tearing-down thread waits; a
step that overruns is *abandoned*: its worker is left blocked (a daemon thread
never keeps the process alive) and a fresh worker runs the next step.

CPython 3.12 refuses to start threads once interpreter shutdown has begun,
which is when the exit teardown runs (atexit).  So the worker is started
*ahead of time*: as soon as any timeout is configured (`prepare`),
``STANDBY`` idle workers wait, and a teardown hands back the one it used.
So on 3.12 an exit teardown survives ``STANDBY - 1`` abandoned steps; after
that a worker cannot be started and the caller leaks each further timed
step rather than run it unbounded.

A timed step that forks (a hook or release function calling ``os.fork()``)
produces a child whose only thread is the worker: the teardown that handed it the
step does not exist there.  When the step returns in the child, the child leaves
as [`exitsafe.exit`][exitsafe.exit] does (status 0, or 1 if the step raised): its own
teardown (every inherited handle ``leaked_inherited``), its ledger, stdio
flushed, ``os._exit``.  A child that should do something else must do it in the
step (``os._exit`` or ``exec`` there, as children usually do).

A timed step that calls [`exitsafe.exit`][exitsafe.exit] hands the exit to the thread
that waits for it (`hand_back_exit`): the step ends there, its worker stays parked in
it (never reused), and the tearing-down thread finishes the phase it is running (the
early hooks, or the teardown) before it leaves the process with the status asked for
(`leave_if_asked`).  One exit, carried out by one thread, after one teardown.
"""

from __future__ import annotations

import _thread

from . import _process, _sync

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


#: worker thread ident -> what the step it runs is for (a record of the core), while
#: the step runs.  Read in a forked child to tell which step the forking thread ran.
_running: dict[int, object] = {}


#: worker thread ident -> its `_Worker`, while it runs a step (see `hand_back_exit`).
_stepping: dict[int, _Worker] = {}

#: thread ident -> the exit status a step run for that thread on a worker asked for with
#: exitsafe.exit(); the thread leaves the process with it when its phase ends
#: (`leave_if_asked`).
_exits: dict[int, int] = {}


#: The threads of every worker alive (started, not stopped), busy or not.
_workers: set[int] = set()


def idle_worker_idents() -> set[int]:
    """The threads of the workers running no step now: they run no code but exitsafe's
    (a worker abandoned in an overrunning step is busy: it may be inside a library)."""
    return _workers - set(_stepping)


def worker_idents() -> set[int]:
    """The threads of the standby and busy step workers (never quiesced: they run the
    teardown's steps)."""
    found = {w.ident for w in list(_standby) if w.ident is not None}
    return found | set(_stepping) | set(_running)


def running_here() -> Optional[object]:
    """What the step this thread is running (as a worker) is for, if it is one."""
    return _running.get(_thread.get_ident())


class ExitRequested(BaseException):
    """What a worker hands back, as its step's error, when the step called
    `exitsafe.exit(status)`: never raised, only returned by `StepRunner.call`."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def detail(self, what: str) -> str:
        """Why the step's handle ends ``leaked_interrupted``, for the ledger."""
        return (
            f"its {what} called exitsafe.exit({self.status}) on its worker thread and never "
            f"returned"
        )


class _Worker:
    __slots__ = (
        "_abandoned",
        "_caller",
        "_done",
        "_error",
        "_generation",
        "_go",
        "_handoff",
        "_task",
        "ident",
    )

    def __init__(self) -> None:
        import threading

        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._task: Optional[tuple[Callable[[Any], object], Any, object]] = None
        self._error: Optional[BaseException] = None
        #: Orders the end of a wait (`wait`, on the caller) against a hand-back of an
        #: exit (`hand_back_exit`, on this worker): exactly one of them decides the step.
        self._handoff = _thread.allocate_lock()
        self._abandoned = False
        self._caller = 0  # the thread that handed this worker its step
        self._generation = 0  # the fork generation the step began in
        thread = threading.Thread(target=self._loop, name="exitsafe-teardown-step", daemon=True)
        thread.start()
        self.ident: Optional[int] = thread.ident
        if thread.ident is not None:
            _workers.add(thread.ident)

    def _loop(self) -> None:
        me = _thread.get_ident()
        while True:
            self._go.acquire()
            task = self._task
            if task is None:
                _workers.discard(me)
                return
            fn, arg, subject = task
            generation = self._generation = _sync.generation
            _running[me] = subject
            _stepping[me] = self
            try:
                fn(arg)
                self._error = None
            except BaseException as exc:  # handed back to the tearing-down thread as data
                self._error = exc
            _stepping.pop(me, None)
            _running.pop(me, None)
            if _sync.generation != generation:  # the step forked; this is the child
                _process.leave(0 if self._error is None else 1)
            self._done.release()

    def start(self, fn: Callable[[Any], object], arg: Any, subject: object = None) -> None:
        self._caller = _thread.get_ident()
        self._task = (fn, arg, subject)
        self._go.release()

    def wait(self, timeout: float) -> bool:
        """Whether the step ended (returned, raised, or handed back an exit) in time;
        ``False`` abandons this worker, and no exit can be handed back by it any more."""
        # (a timeout beyond what a lock can wait, some 292 years, waits that long: it
        # would raise OverflowError, and the worker's next step would find _done free)
        if self._done.acquire(True, min(timeout, _thread.TIMEOUT_MAX)):
            return True
        with self._handoff:
            if self._done.acquire(False):  # an exit handed back as the wait ended
                return True
            self._abandoned = True
            return False

    def hand_back_exit(self, status: int) -> bool:
        """On this worker, from the step: end the step with an exit request for its
        caller.  ``False`` when the caller gave up on the step (it timed out) or the
        step forked (this is a child, where the caller does not exist)."""
        if _sync.generation != self._generation:
            return False
        with self._handoff:
            if self._abandoned:
                return False
            _exits.setdefault(self._caller, status)  # (the first exit asked for wins)
            self._error = ExitRequested(status)
            self._done.release()
            return True

    def stop(self) -> None:
        self._task = None
        self._go.release()


class NoWorkerError(RuntimeError):
    """No thread could be started to run a step under its time limit."""


#: How many idle workers `prepare` keeps ready: one for the steps, one
#: to replace it if a step is abandoned.
STANDBY = 2

#: The idle workers kept ready for teardowns that need one (a list because
#: ``pop()`` / ``append()`` are atomic, whichever thread tears down).
_standby: list[_Worker] = []


def prepare() -> None:
    """Start standby workers up to `STANDBY` (nothing to do when they exist).

    Called whenever a timeout is configured, so that workers exist before
    interpreter shutdown forbids starting them.  Once it does (a timeout first
    configured during the exit teardown, on CPython 3.12+), this does nothing: the
    timed steps that then find no worker are not run (see `NoWorkerError`).
    """
    while len(_standby) < STANDBY:
        try:
            worker = _Worker()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return
        _standby.append(worker)


def hand_back_exit(status: int) -> None:
    """`exitsafe.exit(status)` called by a step running on a worker (this thread) for a
    caller still waiting for it: end the step with the exit and park this thread for good
    (a daemon thread: it never keeps the process alive); the caller leaves the process
    once its phase ends (`leave_if_asked`).  Returns, having done nothing, on any other
    thread, or when the caller no longer waits for the step (the exit then goes its
    usual way, here)."""
    me = _thread.get_ident()
    worker = _stepping.get(me)
    if worker is None or not worker.hand_back_exit(status):
        return
    _stepping.pop(me, None)
    _running.pop(me, None)
    park = _thread.allocate_lock()
    park.acquire()
    # Unbounded on purpose: the step must never return (exit() never does), and the
    # caller, which no longer waits for this thread, ends the process.
    park.acquire()


def leave_if_asked() -> None:
    """Leave the process now if a step this thread waited for on a worker called
    `exitsafe.exit` (see `hand_back_exit`): called where a phase that runs timed steps
    ends (the early hooks, a teardown).  Nothing to do otherwise."""
    status = _exits.pop(_thread.get_ident(), None)
    if status is not None:
        _process.leave(status)


def after_fork_in_child() -> None:
    """The parent's standby threads do not exist in a forked child: start new ones."""
    mine = _running.get(_thread.get_ident())
    _running.clear()
    _stepping.clear()  # (the parent's steps: their callers do not exist here)
    _exits.clear()
    _workers.clear()
    if mine is not None:  # forked by a step on this worker: it ends the child (_loop)
        _running[_thread.get_ident()] = mine
        _standby.clear()
        return
    if _standby:
        _standby.clear()
        try:
            prepare()
        except RuntimeError:  # a fork during shutdown: the child's teardown leaks timed steps
            pass


def _take_worker() -> _Worker:
    try:
        return _standby.pop()
    except IndexError:
        pass
    try:
        return _Worker()
    except RuntimeError as exc:  # CPython 3.12: "can't create new thread at interpreter shutdown"
        raise NoWorkerError(str(exc)) from None


class StepRunner:
    """Calls ``fn(arg)`` inline, or on a worker thread when a timeout applies.

    ``allowed``, when set, receives the ident of each worker thread that runs a step
    (a teardown lets its own threads borrow handles after the gate closed).
    """

    __slots__ = ("_worker", "allowed")

    def __init__(self) -> None:
        self._worker: Optional[_Worker] = None
        self.allowed: Optional[set[int]] = None

    def call(
        self,
        fn: Callable[[Any], object],
        arg: Any,
        timeout: Optional[float],
        subject: object = None,
    ) -> tuple[bool, Optional[BaseException]]:
        """Run the step (for ``subject``, a record of the core); return ``(finished, error)``.

        ``finished`` is ``False`` when the step overran ``timeout`` and was
        abandoned; ``error`` is the exception it raised, if it finished by raising, or an
        `ExitRequested` if it called `exitsafe.exit` on the worker (this thread then
        leaves the process at the end of its phase: `leave_if_asked`).
        Raises `NoWorkerError`, without running the step, when a timeout
        applies and no worker thread can be started.
        """
        if timeout is None:
            try:
                fn(arg)
            except BaseException as exc:  # the caller records it and teardown goes on
                return True, exc
            return True, None
        worker = self._worker
        if worker is None:
            worker = self._worker = _take_worker()  # NoWorkerError goes to the caller
            if self.allowed is not None and worker.ident is not None:
                self.allowed.add(worker.ident)
        worker.start(fn, arg, subject)
        if worker.wait(max(timeout, 0.0)):
            error = worker._error
            if isinstance(error, ExitRequested):
                self._worker = None  # parked in the step for good (see hand_back_exit)
            return True, error
        self._worker = None  # abandoned: it stays blocked in the step
        return False, None

    def close(self) -> None:
        """Hand the idle worker (if any) back as the standby, or let it end."""
        worker, self._worker = self._worker, None
        if worker is not None:
            if len(_standby) < STANDBY:
                _standby.append(worker)
            else:
                worker.stop()

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
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


#: worker thread ident -> what the step it runs is for (a record of the core), while
#: the step runs.  Read in a forked child to tell which step the forking thread ran.
_running: dict[int, object] = {}


def running_here() -> Optional[object]:
    """What the step this thread is running (as a worker) is for, if it is one."""
    return _running.get(_thread.get_ident())


class _Worker:
    __slots__ = ("_done", "_error", "_go", "_task", "ident")

    def __init__(self) -> None:
        import threading

        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._task: Optional[tuple[Callable[[Any], object], Any, object]] = None
        self._error: Optional[BaseException] = None
        thread = threading.Thread(target=self._loop, name="exitsafe-teardown-step", daemon=True)
        thread.start()
        self.ident: Optional[int] = thread.ident

    def _loop(self) -> None:
        from . import _sync

        me = _thread.get_ident()
        while True:
            self._go.acquire()
            task = self._task
            if task is None:
                return
            fn, arg, subject = task
            generation = _sync.generation
            _running[me] = subject
            try:
                fn(arg)
                self._error = None
            except BaseException as exc:  # handed back to the tearing-down thread as data
                self._error = exc
            _running.pop(me, None)
            if _sync.generation != generation:  # the step forked; this is the child
                from ._children import leave

                leave(0 if self._error is None else 1)
            self._done.release()

    def start(self, fn: Callable[[Any], object], arg: Any, subject: object = None) -> None:
        self._task = (fn, arg, subject)
        self._go.release()

    def wait(self, timeout: float) -> bool:
        # (a timeout beyond what a lock can wait, some 292 years, waits that long: it
        # would raise OverflowError, and the worker's next step would find _done free)
        return self._done.acquire(True, min(timeout, _thread.TIMEOUT_MAX))

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


def after_fork_in_child() -> None:
    """The parent's standby threads do not exist in a forked child: start new ones."""
    mine = _running.get(_thread.get_ident())
    _running.clear()
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
        abandoned; ``error`` is the exception it raised, if it finished by raising.
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
            return True, worker._error
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

"""The lock discipline of exitsafe: one lock, never held around user code, never waited
for by the thread that holds it.

All of exitsafe's shared state (every registry's graph, owner counts, phase and ledger;
the adapters' address, pin and callback tables) is guarded by ONE process-wide lock,
`LOCK`.  The rules every module follows:

1. **Sections are bookkeeping only.**  A critical section never calls user code (release
   functions, hooks, policies, callbacks, logging, trace writes) and never drops the last
   reference to a user object; those happen after the section ends.
2. **Sections never wait.**  Inside a section nothing blocks: not on another lock, not
   on an event.  So a thread holding `LOCK` leaves it in a bounded number of steps,
   and a thread *outside* any section may safely block waiting for it.
3. **Re-entry never waits.**  Python can still run a finalizer (``__del__``, a weakref
   callback, a cyclic collection) or a signal handler at any bytecode of a section, on
   the thread that holds the lock.  Such code must not wait for `LOCK` (it would
   wait for itself).  `reentered` tells; then a request that needs no answer
   (a release, the garbage collection of a handle, the end of a borrow, cancelling a
   hook, a teardown) is queued with `defer` and run as soon as the interrupted
   section ends, while a request that must answer now raises
   [`ReentrancyError`][exitsafe.lowlevel.ReentrancyError].  Signals are not queued here: exitsafe's
   handlers send the signal to the main thread again (see ``exitsafe.signals``), so
   that it is acted on by the main thread, never by whichever thread drains the queue.
4. **Queued work runs on the first occasion.**  The thread whose section was
   interrupted runs it right after leaving the section; any exitsafe call on any thread
   runs what is left.  Each queued request still ends in exactly one outcome.
5. **Fork is safe.**  ``os.fork()`` waits (bounded) until no other thread is inside a
   section, so a child never inherits half-updated state; the child reinitializes the
   lock and empties the queue (the requests belong to the parent's threads).

The lock is a re-entrant lock only so that ownership is known atomically
(``_is_owned``); exitsafe never acquires it twice on one thread.
"""

from __future__ import annotations

import _thread
import sys as _sys
import time

from ._core import speedups

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    _T = TypeVar("_T")

#: The one lock of exitsafe (see the module documentation for its rules): the compiled
#: core's lock when it is in use (its hot paths take it without a Python call), else a
#: ``threading.RLock``.  Both know their owner and are re-entrant.
LOCK: Any = speedups.Lock() if speedups is not None else _thread.RLock()

#: ``reentered()``: whether the calling thread is inside a section (holds `LOCK`).
reentered: Callable[[], bool] = LOCK._is_owned
acquire: Callable[..., bool] = LOCK.acquire
release: Callable[[], None] = LOCK.release

#: How often a thread yields to the holder of the lock before it blocks on it.
YIELDS_BEFORE_BLOCKING = 100

_sleep = time.sleep
_get_ident = _thread.get_ident


def wait() -> bool:
    """Take `LOCK`, which another thread holds, without queueing on it at first; return
    ``True`` (it is held now: ``held = acquire(False) or wait()``).

    Hot paths try ``acquire(False)`` and call this only when that fails.  Blocking at
    once would hand the lock and the GIL back and forth with a context switch each
    time (a lock convoy: two threads got a quarter of one thread's throughput);
    yielding the GIL lets the holder finish its short section.  After
    `YIELDS_BEFORE_BLOCKING` tries (a long section) it blocks, which is safe
    because sections never wait (rule 2).  The caller must not be inside a section.
    """
    try:
        for _ in range(YIELDS_BEFORE_BLOCKING):
            _sleep(0)
            if not acquire(False):
                continue  # (not "if acquire(False): return": CPython 3.12-3.14 leave the
            return True  # loop's backward jump out of the try: tests/.../test_try_coverage)
        acquire()
        return True
    except BaseException:  # interrupted (KeyboardInterrupt), maybe once it held the lock:
        try:  # it leaves without it (see enter)
            release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        raise


def enter() -> None:
    """Take `LOCK` (the caller has checked it is not inside a section).

    An exception raised in it (a ``KeyboardInterrupt``, which Python may raise right
    after the lock was taken) leaves the lock free.  Callers take it *inside* their
    ``try`` and release it in their ``finally`` only if they hold it::

        try:
            _sync.enter()
            ...  # the section
        finally:
            try:
                _sync.release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass

    since an interrupt may also land between this function's return and a ``try``
    written after it (CPython checks for signals after calls).  The ``finally`` calls
    ``release`` at once, without asking `reentered` first: an interrupt landing right
    after that question returned would skip the release and leave the lock held.
    """
    try:
        if not acquire(False):
            wait()
    except BaseException:
        try:
            release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        raise


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is what a signal handler raises (``KeyboardInterrupt``, or the
    ``SystemExit`` of exitsafe's signal handlers), not an error of the code it interrupted."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def enter_if_possible(timeout: float = 1.0) -> bool:
    """Take `LOCK` within ``timeout`` seconds if it can be had; whether it was taken.

    For the paths that may run from a finalizer late in interpreter shutdown, after the
    exit teardown: a daemon thread frozen inside a section then holds the lock for ever
    (waiting would hang the exit; from CPython 3.15 taking a lock that late raises
    ``PythonFinalizationError``, a ``RuntimeError``).  Without the lock the caller makes
    its record anyway: no other thread runs Python code any more.
    """
    try:
        return bool(acquire(True, timeout))
    except RuntimeError:
        return False
    except BaseException:  # interrupted, maybe once it held the lock: it leaves without it
        try:
            release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        raise


# ---------------------------------------------------------------------- deferred work

#: Work queued by requests that arrived inside a section (FIFO).  A plain list: append
#: and pop are atomic, with or without the GIL.
deferred: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

def defer(fn: Callable[..., object], *args: Any) -> None:
    """Queue ``fn(*args)`` to run once the current thread has left its section."""
    deferred.append((fn, args))


def pending() -> bool:
    """Whether queued work waits to run."""
    return bool(deferred)


#: Threads running the queue: one that is (a release function run from the queue
#: calling exitsafe again) returns at once, and its outer loop goes on, so the queue is
#: run iteratively, never by recursion.
_draining: set[int] = set()


def run_deferred() -> None:
    """Run the queued work, oldest first, unless the caller is inside a section.

    Errors of one item are logged and do not stop the others: the items are release
    requests whose callers could not receive an exception anyway (a finalizer, a
    signal handler).  On the main thread, SIGINT and exitsafe's signals are held back
    while it runs (see ``exitsafe._interrupts``): a ``KeyboardInterrupt`` between taking
    an item and running it would lose that request; it is raised after the queue ran.
    """
    if not deferred or reentered():  # (nothing queued: no hold of signals, no import)
        return
    me = _get_ident()
    if me in _draining:
        return
    try:
        _draining.add(me)
        if _is_main_thread(me):  # (only it runs signal handlers)
            from ._interrupts import held

            with held():
                _drain()
        else:
            _drain()
    finally:
        _draining.discard(me)


def _drain() -> None:
    while deferred:
        try:
            fn, args = deferred.pop(0)
        except IndexError:  # another thread took the last one
            return
        try:
            fn(*args)
        except Exception as exc:  # the caller is gone (a finalizer): log, go on
            from ._report import error_from_finalizer

            error_from_finalizer(
                "exitsafe: a release requested from a finalizer or signal handler "
                "failed: %s",
                repr(exc),
            )


def _is_main_thread(ident: int) -> bool:
    """Whether ``ident`` is the main thread's (without importing ``threading``: with no
    ``threading`` module loaded, the main thread is the only one running Python)."""
    threading = _sys.modules.get("threading")
    if threading is None:
        return True
    main = threading.main_thread()
    return bool(main.ident == ident)


# ---------------------------------------------------------------------- fork

#: Incremented in every child after ``os.fork()``.  A node remembers the value it was
#: created under, so a node whose value differs was inherited from a parent process
#: and is never released here.  Read without the lock (one module attribute).
generation = 0

#: Seconds ``os.fork()`` waits for a section in progress on another thread.
FORK_WAIT = 2.0

_held_for_fork: list[bool] = []
#: Whether the forking thread was inside a section when it forked (a finalizer or a
#: signal handler that interrupted the section called ``os.fork()``).
_inside_at_fork: list[bool] = []

# The three functions below are called by exitsafe._process's fork handlers, which
# order them with the rest of the process state.


def before_fork() -> None:
    """Hold `LOCK` across ``fork()`` so no section is half done in the child."""
    _inside_at_fork.append(reentered())
    _held_for_fork.append(acquire(True, FORK_WAIT))


def after_fork_in_parent() -> None:
    if _inside_at_fork:
        _inside_at_fork.pop()
    if _held_for_fork and _held_for_fork.pop():
        release()


def after_fork_in_child() -> None:
    global generation
    generation += 1
    if speedups is not None:
        speedups.set_generation(generation)
    _held_for_fork.clear()
    inside = bool(_inside_at_fork and _inside_at_fork.pop())
    _inside_at_fork.clear()
    LOCK._at_fork_reinit()
    if inside:
        # The fork came from a finalizer or signal handler that interrupted a section of
        # this thread: the section resumes in the child too and releases the lock when it
        # ends, so the child's thread holds it, as the parent's does.
        acquire()
    deferred.clear()
    _draining.clear()


# ---------------------------------------------------------------------- sections


def refused(operation: str) -> Exception:
    """The [`ReentrancyError`][exitsafe.lowlevel.ReentrancyError] for ``operation``,
    called re-entrantly."""
    from ._errors import ReentrancyError

    return ReentrancyError(
        f"{operation} was called from a finalizer or signal handler that interrupted "
        f"exitsafe on this same thread; exitsafe cannot answer it there without waiting "
        f"for itself.  Only release requests (Handle.release(), the end of a borrow, "
        f"teardown()) are accepted there: they run right after the interrupted step"
    )


def locked(operation: str, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` as one section: holding `LOCK`, then run the queued work.

    The one helper for a locked section (the hot paths write the same steps out, in the
    same shape).  Raises [`ReentrancyError`][exitsafe.lowlevel.ReentrancyError], naming
    ``operation``, when the calling thread is already inside a section (a finalizer or a
    signal handler that interrupted one), instead of waiting for itself.

    The lock is free again when this returns or raises, wherever an exception lands: in
    ``fn``, in the lock's own methods, or at any line or instruction here (a
    ``KeyboardInterrupt`` that a tracer, or CPython 3.9 with none, delivers there).  The
    shape of a section, which every hand-written one keeps:

    * one ``try`` statement, begun before the lock is taken; the lock is released as
      the last step of its body, and its handler releases it (if this thread holds it)
      after repairing what the section began.  CPython 3.11+ covers some instructions
      with no handler at all, not even an enclosing one: a ``try`` line, a ``return``
      inside a ``try`` with a ``finally``, the end of a ``try`` body with ``except``
      clauses.  An exception a tracer raises there escapes the function; in this shape
      none of them is reached while the lock is held.
    * the lock is released with its own methods (C code, no Python frame: at the
      recursion limit a Python helper cannot be called).
    """
    if reentered():
        raise refused(operation)
    try:
        acquire(False) or wait()
        result = fn(*args)
        release()
    except BaseException:
        if reentered():  # (C calls only: a Python helper fails at the recursion limit)
            release()
        raise
    if deferred:
        run_deferred()
    return result


def until_done(step: Callable[..., object], *args: Any) -> Optional[BaseException]:
    """Call ``step(*args)`` until it returns, whatever interrupts it; the first interrupt.

    For the work a claim has begun (a release chain, the record of an outcome): an
    interrupt (``KeyboardInterrupt``, the ``SystemExit`` of a signal handler) that stops
    ``step`` is kept and ``step`` called again, so it must be safe to call again (it
    goes on from what is left).  The lock is left free after each stop.  Any other error
    is raised at once.  The caller raises the interrupt it gets once its own state is
    consistent.

    The call is on the line of its ``try`` (``try: step(*args)``), which compiles to no
    line of its own: a tracer's exception can only land inside ``step``, whose caller
    here catches it (see `locked` on ``try`` lines).
    """
    try: step(*args)  # noqa: E701  (one line: see the docstring)
    except BaseException as exc:
        return _step_again(step, args, exc)
    return None


def _step_again(
    step: Callable[..., object], args: tuple[Any, ...], exc: BaseException
) -> BaseException:
    if reentered():
        release()
    if not is_interrupt(exc):
        raise exc
    try: step(*args)  # noqa: E701  (one line: see until_done)
    except BaseException as later:
        _step_again(step, args, later)
    return exc


def locked_quietly(fn: Callable[..., _T], *args: Any) -> _T:
    """`locked` for a caller that has checked it is not inside a section and runs the
    queued work itself (or leaves it to its own caller)."""
    try:
        acquire(False) or wait()
        result = fn(*args)
        release()
    except BaseException:
        if reentered():  # (C calls only: a Python helper fails at the recursion limit)
            release()
        raise
    return result

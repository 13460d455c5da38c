"""Opt-in: turn termination signals into an orderly teardown.

A container stop or ``kill`` sends SIGTERM, whose default action ends the
process at once: no ``atexit``, so no exitsafe teardown, and native
objects are reclaimed in whatever state they were.  Usually that is
harmless, but a runtime that must flush or unregister something (a device
queue, a lock file, a driver session) never gets the chance.

[`teardown_on_signals`][exitsafe.signals.teardown_on_signals] installs handlers that run the
teardown:

* ``mode="exit"`` (the default): the handler raises ``SystemExit(128 + signum)`` in the main
  thread, so ``finally`` blocks and context managers unwind, non-daemon threads are
  joined, and the normal exit teardown runs from ``atexit``.  The exit
  status is the shell's convention for "killed by that signal" (143 for
  SIGTERM).  Use it when the main thread reaches Python code regularly.
* ``mode="immediate"``: the handler tears down every registry (newest first) right away,
  writes the ledger if ``EXITSAFE_LEDGER`` is set, restores the signal's default
  action and re-sends the signal, so the process dies by that signal (as a
  supervisor expects) without running any further Python finalization.
  Use it when the main thread may sit in a long native call.

Timing rules, the same for both modes:

* A signal that arrives while exitsafe itself is in one of its short
  bookkeeping steps on the main thread is acted on right after that step, on
  the main thread: a handler never waits for exitsafe's lock (its own thread
  holds it), so exitsafe sends the signal to the main thread once more from a
  short-lived thread.  A signal still in flight when the program ends is acted
  on by the exit teardown (the process then ends by it, as below).
* A signal that arrives while a teardown runs on the main thread is held back
  and acted on when that teardown has finished or hit its time bound, with
  every outcome recorded.  At exit, the process then ends by that signal after
  the rest of its exit: the ``atexit`` callbacks registered before exitsafe's
  (``logging``'s flush, for one) still run, and stdio is flushed.  SIGINT's
  default ``KeyboardInterrupt`` is held back the same way during a teardown.
* In the immediate mode, a second signal during the teardown it runs is
  dropped: the process is about to end by the first one.
* A signal whose handler runs inside a garbage collection on the main thread (a
  finalizer's bytecode: dask's worker collects as its memory grows, just when its nanny
  sends SIGTERM) is sent again, as inside exitsafe's sections, and acted on after the
  collection: a teardown inside it would wait for its end anyway (the immediate mode
  died first), and CPython drops what a finalizer raises.  Wherever else CPython drops
  it (a ``gc.callbacks`` function, a weak reference callback), the exit mode's
  ``SystemExit`` is caught by ``sys.unraisablehook`` (exitsafe's, chained to the one
  before, installed with the first exit-mode handler) and the signal sent again too.
* A signal that lands just before the main thread blocks in a native wait that does not
  check for signals first (a ``multiprocessing`` lock, as in an idle pool worker), or that
  the kernel gives to another thread while the main thread waits, leaves its handler
  waiting for the next signal, for ever when none comes (``Pool.terminate()`` sends one
  SIGTERM, then joins without a bound; measured: 3 of 10 real pool tests hung once on a
  loaded machine).  ``watch=True`` closes that window: a watcher thread of exitsafe's sees
  the signal arrive (through ``signal.set_wakeup_fd``) and, when the handler has not begun
  within 50 ms, interrupts the main thread's wait with SIGURG (whose handler does
  nothing), again every 50 ms for at most 5 s, so the handler runs.  It costs a thread (so
  CPython 3.12+ warns when the process forks) and takes the process's wakeup fd and
  SIGURG; it is refused where the program has either (``asyncio`` signal handlers set a
  wakeup fd), and a wakeup fd set later (``loop.add_signal_handler``) takes its place, the
  window open again.  A forked child gets a watcher of its own.  POSIX only.

[`deferred`][exitsafe.signals.deferred] holds exitsafe's handlers back over a block of the
program's own (opening a native object and adopting it), whichever thread the kernel gives
the signal to, and acts on what arrived when the block ends.

[`pool_initializer`][exitsafe.signals.pool_initializer] is both, in the one line a process
pool needs: it wraps the pool's initializer so that `terminate()`'s SIGTERM runs each
worker's teardown.

SIGINT is only taken over when the program left Python's default handler
(``KeyboardInterrupt``) in place; a program's own handler is never
replaced.  Handlers can only be installed from the main thread, as
`signal.signal` requires.
"""

from __future__ import annotations

import os
import signal
import sys

from . import _collection, _sync

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from contextlib import AbstractContextManager
    from types import FrameType
    from typing import Any, Callable, Optional, Union

__all__ = ["deferred", "pool_initializer", "teardown_on_signals"]

_MODES = ("exit", "immediate")

#: Frames added to the recursion limit for the teardown of the immediate mode, which runs
#: on whatever stack the signal interrupted (a deep recursion, a few frames from the
#: limit): the process ends by the signal right after it, so the limit stays raised.
_TEARDOWN_ROOM = 300

#: Signals whose handler cannot be changed: asking for them is an error, not a no-op.
_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}


def _signal_number(sig: object) -> int:
    if isinstance(sig, str):
        name = sig.upper()
        if not name.startswith("SIG") or name.startswith("SIG_"):
            name = "SIG" + name
        number = getattr(signal, name, None)
        if not isinstance(number, int):
            raise ValueError(f"unknown signal name {sig!r} on this platform")
        value = int(number)
    elif isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"signals must be names or numbers, got {type(sig).__name__}")
    else:
        value = int(sig)
        valid = getattr(signal, "valid_signals", None)
        if valid is not None and value not in valid():
            raise ValueError(f"{value} is not a valid signal number on this platform")
    if value in _UNCATCHABLE:
        raise ValueError(
            f"{signal.Signals(value).name} cannot be caught by any process; "
            f"nothing can run a teardown when it arrives"
        )
    return value


def teardown_on_signals(
    signals: Union[Iterable[Union[int, str, signal.Signals]], int, str] = ("SIGTERM", "SIGINT"),
    *,
    mode: str = "exit",
    watch: bool = False,
) -> dict[int, Any]:
    """Install teardown handlers for `signals`, so that a termination signal runs the
    exitsafe teardown instead of ending the process at once.

    See the module documentation above for the two modes and for what happens when a
    signal arrives during a teardown.  Every argument is checked before any handler is
    installed.  Call it from the main thread.

    Args:
        signals: one signal or an iterable of signals, each a name (`"SIGTERM"`, `"TERM"`)
            or a number; the default is SIGTERM and SIGINT.  A signal whose current handler
            is the program's own (anything but the default action or, for SIGINT, Python's
            default `KeyboardInterrupt` handler) is left alone.
        mode: `"exit"` (the default): raise `SystemExit(128 + signum)` in the main thread
            and let the normal exit run the teardown.  `"immediate"`: tear down every
            registry in the handler, then die by the signal.
        watch: start a watcher thread that wakes the main thread when a signal's handler
            is held up by a native wait (see the module documentation).  Use it where the
            main thread waits on locks a signal does not interrupt in time: the worker of
            a process pool.  A signal whose handler an earlier call installed is watched
            too (its mode stays the earlier call's).

    Returns:
        `{signum: previous handler}` for every signal whose handler was installed (the
            signals left alone are missing), to restore them with `signal.signal` if needed.

    Raises:
        ValueError: an unknown signal or mode, SIGKILL / SIGSTOP (which no process can
            catch), or a call off the main thread (raised by `signal.signal`).
        TypeError: a signal that is neither a name nor a number, or `watch` not a bool.
        RuntimeError: `watch=True` where a watcher cannot run (not POSIX, or the program
            set a wakeup fd or a SIGURG handler itself); no handler was installed.

    Example:
        ```python
        from exitsafe.signals import teardown_on_signals

        teardown_on_signals()                               # SIGTERM and SIGINT, "exit" mode
        teardown_on_signals("SIGTERM", mode="immediate")    # main thread may sit in C
        teardown_on_signals("SIGTERM", mode="immediate", watch=True)  # a pool's worker
        ```
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if not isinstance(watch, bool):
        raise TypeError(f"watch must be True or False, got {type(watch).__name__}")
    if isinstance(signals, (str, int)):
        signals = (signals,)
    try:
        items = list(signals)
    except TypeError:
        raise TypeError(
            f"signals must be a signal or an iterable of signals, got {type(signals).__name__}"
        ) from None
    numbers = list(dict.fromkeys(_signal_number(s) for s in items))
    from . import _interrupts
    from ._exit import load_teardown

    load_teardown()  # (a handler's teardown must find no module of its own half-imported)
    # (inside a deferred() block, the handler the block puts back is the one in effect)
    current = {signum: _interrupts.handler_in_effect(signum) for signum in numbers}
    ours = [signum for signum in numbers if _may_take(signum, current[signum])]
    # (a signal whose handler an earlier call installed is watched too; its mode stays)
    before = [s for s in numbers if getattr(current[s], "__exitsafe_signal_handler__", False)]
    if watch and (ours or before):
        _start_watcher(ours + before)  # (before any handler: a refusal changes nothing)

    installed: dict[int, Any] = {}
    handler = _exit_handler if mode == "exit" else _immediate_handler
    if mode == "exit" and ours:
        _take_unraisable()
    for signum in ours:
        installed[signum] = _interrupts.install(signum, handler)  # (held back in a block)
        _interrupts.installed.add(signum)
    return installed


def deferred() -> AbstractContextManager[object]:
    """Context manager: within it, on the main thread, a signal whose handler is exitsafe's
    (or SIGINT with Python's default handler) is recorded, not acted on; each one recorded
    is acted on once, when the outermost block ends (its handler runs then, as if it had
    just arrived).

    Use it around opening a native object and declaring it (`adopt`, `track`), so that no
    teardown can run between the two: a worker's initializer that opens the file it will
    write, for one.  Blocking the signal with `signal.pthread_sigmask` does not do that in
    a process with other threads: the kernel gives the signal to a thread that does not
    block it (OpenBLAS's, which numpy starts at import in a spawned worker), and Python
    runs the handler on the main thread all the same, at its next bytecode.

    Rules:

    * It holds back only what exitsafe handles (the signals of
      [`teardown_on_signals`][exitsafe.signals.teardown_on_signals], called before the
      block or inside it, and SIGINT when Python's default handler is in place), never a
      handler the program installed.
    * Off the main thread it holds nothing back (Python runs signal handlers on the main
      thread only).
    * Blocks nest: what arrived is acted on when the outermost one ends, each signal once,
      in the order they came; a handler that raises (the `"exit"` mode's `SystemExit`)
      does not keep the others from running.
    * A teardown inside the block runs as always; `exitsafe.exit()` inside it ends the
      process by a signal that arrived, once its teardown is done.
    * A forked child starts with the handlers in place, whichever thread forked (a
      `multiprocessing` child never leaves the block: it would hold its signals for
      life).

    Example:
        ```python
        def init(directory):  # a pool's initializer
            teardown_on_signals("SIGTERM", mode="immediate", watch=True)
            with exitsafe.signals.deferred():  # no teardown between the open and the adopt
                shard = h5py.File(f"{directory}/shard-{os.getpid()}.h5", "w")
                exitsafe.adopt(shard, close="close")
        ```
    """
    from ._interrupts import held

    return held(deferred=True)


def pool_initializer(init: Optional[Callable[..., object]] = None, /) -> Callable[..., None]:
    """Wrap a process pool's initializer so that a terminated worker tears down what it
    created: `Pool(n, initializer=pool_initializer(init), initargs=...)`.

    `with multiprocessing.Pool(...)` ends with `terminate()`, which sends SIGTERM to every
    worker; by default a worker dies at once and nothing it opened is closed (an HDF5 or
    Parquet shard is left unreadable).  In each worker, the returned initializer:

    1. installs `teardown_on_signals("SIGTERM", mode="immediate", watch=True)`: SIGTERM runs
       the worker's teardown (what it tracked or adopted, in order; inherited handles
       `leaked_inherited`), writes its ledger if `EXITSAFE_LEDGER` is set, and the worker
       dies by SIGTERM as `terminate()` expects; the watcher wakes an idle worker whose
       wait for its next task began just after the signal landed;
    2. calls `init(*initargs)` inside [`deferred()`][exitsafe.signals.deferred]: a SIGTERM
       that arrives while `init` opens and adopts what the worker will use is acted on
       when `init` returns, so no teardown runs between the open and the adoption.

    It changes nothing on a normal end (`close(); join()`, `shutdown()`), where the
    worker's teardown runs anyway.  Where the watcher cannot run (a worker forked from a
    program that set a wakeup fd: an `asyncio` loop's signal handlers), the handler is
    installed without it, with a warning; off a main thread (a thread pool's worker), only
    `init` runs, with a warning: no signal handler can be installed there.  It works the same for
    `concurrent.futures.ProcessPoolExecutor(initializer=...)` and with every start method;
    with `spawn` and `forkserver`, `init` must be picklable (a module-level function), as
    for any initializer.  A SIGTERM handler the program installed itself before is left
    alone (and so is the worker's fate).  Nothing can help a worker killed by SIGKILL or
    one that crashes: no code runs in it.

    Args:
        init: the pool's own initializer, called with the pool's `initargs`; `None` (the
            default) when the pool has none.

    Returns:
        A picklable callable to pass as the pool's `initializer`.

    Raises:
        TypeError: `init` is neither callable nor `None`.
        RuntimeError: on a platform without POSIX signals (Windows ends a worker with
            `TerminateProcess`, where no code of the worker's can run).

    Example:
        ```python
        import multiprocessing

        from exitsafe.signals import pool_initializer


        def work(i):
            return i * i


        if __name__ == "__main__":
            with multiprocessing.Pool(2, initializer=pool_initializer()) as pool:
                print(pool.map(work, range(4)))
        ```
    """
    if init is not None and not callable(init):
        raise TypeError(
            f"pool_initializer() takes the pool's initializer (a callable) or None, "
            f"got {type(init).__name__}"
        )
    if os.name != "posix":
        raise RuntimeError(
            "pool_initializer() needs POSIX signals: this platform ends a pool's worker "
            "with TerminateProcess, where no code of the worker's can run"
        )
    return _PoolInitializer(init)


class _PoolInitializer:
    """What `pool_initializer` returns: picklable when ``init`` is (spawn, forkserver)."""

    __slots__ = ("init",)

    def __init__(self, init: Optional[Callable[..., object]]) -> None:
        self.init = init

    def __call__(self, *args: object, **kwargs: object) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            _install_in_worker()
        else:
            # Not a process's main thread: a thread pool's (multiprocessing.pool.ThreadPool)
            # worker, where no signal handler can be installed.  Raising would fail every
            # worker the pool starts again, for ever: the init runs, and a warning says why
            # nothing else does.
            from ._report import log

            log().warning(
                "exitsafe: pool_initializer() ran off the main thread (a thread pool?): "
                "SIGTERM is not turned into a teardown there; it is for process pools"
            )
        with deferred():  # (a SIGTERM meanwhile: its teardown runs when init returns)
            if self.init is not None:
                self.init(*args, **kwargs)

    def __reduce__(self) -> tuple[object, ...]:
        return (_PoolInitializer, (self.init,))

    def __repr__(self) -> str:
        return f"exitsafe.signals.pool_initializer({self.init!r})"


def _install_in_worker() -> None:
    """`pool_initializer`'s handler: the immediate mode, with the watcher where it can
    run.  A worker forked from a program that set a wakeup fd (an ``asyncio`` loop's
    signal handlers, Twisted, Trio) inherits it and cannot be watched: the handler is
    installed without the watcher (a SIGTERM landing just before an idle worker's lock
    wait then waits for a second signal, see the module documentation), with a warning,
    rather than failing the worker (the pool would start it again, for ever)."""
    try:
        teardown_on_signals("SIGTERM", mode="immediate", watch=True)
    except RuntimeError as exc:  # (the watcher refused; no handler was installed)
        from ._report import log

        log().warning("exitsafe: pool_initializer(): %s; the worker's SIGTERM handler is "
                      "installed without the watcher", exc)
        teardown_on_signals("SIGTERM", mode="immediate")


def _may_take(signum: int, current: object) -> bool:
    """Whether the handler ``current`` of ``signum`` is not the program's own."""
    return current in (signal.SIG_DFL, None) or (
        signum == signal.SIGINT and current is signal.default_int_handler
    )


def _start_watcher(numbers: list[int]) -> None:
    import threading

    from . import _watcher

    if threading.current_thread() is not threading.main_thread():
        raise ValueError("teardown_on_signals() must be called from the main thread")
    reason = _watcher.start(numbers)
    if reason is not None:
        raise RuntimeError(
            f"teardown_on_signals(watch=True) cannot watch here: {reason}; "
            f"leave watch out (a signal may then wait for the next one, see exitsafe.signals)"
        )


def _note_entered(signum: int) -> None:
    from ._interrupts import note_entered  # (loaded when the handler was installed)

    note_entered(signum)


def _exit_handler(signum: int, frame: Optional[FrameType]) -> None:
    _note_entered(signum)
    if _sync.reentered():
        _send_again(signum)  # see _send_again
        return
    if _collection.collecting_here():
        # inside a garbage collection of this thread (a finalizer's bytecode), where
        # CPython drops what a finalizer raises: the signal is sent again, and acted on
        # at the main thread's next bytecode after it
        _send_again(signum)
        return
    _acted_on(signum)
    exit_ = SystemExit(128 + signum)
    # (raised where CPython drops it instead, a gc callback or a finalizer outside the
    # collection's span that exitsafe sees, `_unraisable` sends the signal again)
    exit_.exitsafe_signal = signum  # type: ignore[attr-defined]
    raise exit_


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` while an exit-mode handler is installed: the ``SystemExit``
    of `_exit_handler` raised where CPython cannot propagate it (a finalizer, a weak
    reference or ``gc.callbacks`` callback) is not dropped: the signal is sent again, to
    be acted on at the main thread's next bytecode.  Anything else goes to the hook that
    was in place before."""
    signum = getattr(unraisable.exc_value, "exitsafe_signal", None)
    if signum is not None:
        _send_again(signum)
        return
    _previous_unraisable[0](unraisable)


#: The ``sys.unraisablehook`` that `_unraisable` replaced (it hands everything else on).
_previous_unraisable: list[Any] = [sys.__unraisablehook__]


def _take_unraisable() -> None:
    """Install `_unraisable` (once; a hook the program sets later replaces it, and the
    handler's own check for a collection is what is left)."""
    if sys.unraisablehook is not _unraisable:
        _previous_unraisable[0] = sys.unraisablehook
        sys.unraisablehook = _unraisable


#: Whether this process is ending by a signal (``_teardown_and_die`` began): a second
#: signal landing in its handler before the teardown holds signals back (an import, the
#: first bytecodes) is dropped, not a second teardown nested in the first.
_dying: list[bool] = [False]


def _immediate_handler(signum: int, frame: Optional[FrameType]) -> None:
    _note_entered(signum)
    if _dying[0]:
        return  # (the process is about to end by the first signal)
    if _sync.reentered():
        _send_again(signum)
        return
    if _collection.collecting_here():
        # Inside a garbage collection of this thread (a finalizer's bytecode: a dask
        # worker's memory monitor collects as memory grows, when the nanny's SIGTERM
        # comes): a teardown asked for there waits for the collection's end
        # (exitsafe._collection), and the process would die by the signal before it.  The
        # signal is sent again instead, as inside one of exitsafe's sections.
        _send_again(signum)
        return
    _dying[0] = True
    try:
        sys.setrecursionlimit(sys.getrecursionlimit() + _TEARDOWN_ROOM)  # (see _TEARDOWN_ROOM)
        _acted_on(signum)
        _teardown_and_die(signum)
    finally:
        _dying[0] = False  # (still alive: the signal's default action did not end it)


def _teardown_and_die(signum: int) -> None:
    from ._exit import teardown_all
    from ._interrupts import held

    # A second signal during this teardown is recorded and dropped: the process is
    # about to end by this one anyway.
    with held(drop=True):
        teardown_all(f"signal {signal.Signals(signum).name}")
    signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        # (this thread took the signal's handler, but may block the signal itself: the
        # C-level handler ran on another thread, which may be gone; unblocked here, the
        # signal sent below ends the process whatever the other threads block)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)


def _send_again(signum: int) -> None:
    """The main thread was inside one of exitsafe's sections: act on the signal later.

    A handler must not act there (the section would be cut in half; a teardown would
    wait for the lock its own thread holds), and it must not hand the signal to
    whichever thread next calls exitsafe (a worker thread cannot end the process, and
    a finalizer swallows the exception).  So a short-lived thread sends the signal to
    the main thread once more: its handler runs again at the main thread's next
    bytecode after the section (the sending thread needs the interpreter lock, which
    the main thread hands over only between bytecodes or in a blocking call), as if
    the signal had arrived a moment later.  Should it land in a section again, the
    same happens again.  The thread is a bare ``_thread`` one: a handler may have
    interrupted code holding ``threading``'s own locks.
    """
    import _thread
    import threading

    from ._interrupts import resent

    main = threading.main_thread().ident
    if main is not None:
        if signum not in resent:
            resent.append(signum)  # if the program ends first, its exit teardown acts on it
        _thread.start_new_thread(_send_to_main, (signum, main))


def _acted_on(signum: int) -> None:
    from ._interrupts import resent

    while signum in resent:
        try:
            resent.remove(signum)
        except ValueError:  # (free-threaded build) another thread removed it first
            break


def _send_to_main(signum: int, main: int) -> None:
    pthread_kill = getattr(signal, "pthread_kill", None)
    try:
        if pthread_kill is not None:  # POSIX: also wakes a blocking call of the main thread
            pthread_kill(main, signum)
        else:
            import _thread

            _thread.interrupt_main(signum)  # type: ignore[call-arg,arg-type,unused-ignore]
    except (OSError, ValueError, TypeError):
        # The main thread is gone (the process is ending) or, before CPython 3.10
        # outside POSIX, a signal cannot be simulated: nothing is left to act on it.
        pass


_exit_handler.__exitsafe_signal_handler__ = True  # type: ignore[attr-defined]
_immediate_handler.__exitsafe_signal_handler__ = True  # type: ignore[attr-defined]

"""The process's exit and forks: the exit teardown, the early phase, the ledger file, a
quiet way out, and the fork handlers.

The exit teardown is one `atexit` callback, registered when exitsafe is imported: it
runs after the interpreter joined the non-daemon threads and before it finalizes modules,
tears down every registry newest first (and any registry a hook creates meanwhile), then
writes the ledger when ``EXITSAFE_LEDGER`` asks for it.  A registry created after that is
closed at once.

The early phase (every registry's early hooks, then its workers' stop requests) runs
before the interpreter joins its threads, hooked in by `exitsafe._early` the first time
an early hook or a worker is declared.

After ``os.fork()`` the child bumps the fork generation (so inherited handles are never
released there), reinitializes exitsafe's lock and drops the work queued by the parent's
threads; the fork itself waits (bounded) for any section in progress.

This module is the top of exitsafe's process layer: it calls down into every module that
keeps process state (`exitsafe._process`, `exitsafe._children`, `exitsafe._early`,
`exitsafe._steps`, `exitsafe._threads`, `exitsafe._interrupts`); those that must call back
up (a worker's exit, a step that calls [`exitsafe.exit`][exitsafe.exit]) are handed the
function to call by `install`.
"""

from __future__ import annotations

import atexit
import os
import sys

from . import (
    _children,
    _closing,
    _collection,
    _config,
    _early,
    _hooks,
    _process,
    _quiesce,
    _sync,
    _threads,
)
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import NoReturn, Optional

__all__ = ["leave", "teardown_all", "write_ledger"]


def teardown_all(reason: str, leaving: bool = False) -> None:
    """Tear down every registry, newest first, then write the ledger if asked to.

    A registry created meanwhile (by a hook, or a release function) is torn down in a
    further round.  One registry failing does not stop the others.  Used by the exit
    hook, a multiprocessing worker's end, `leave` and the signal handlers of
    [`exitsafe.signals`][exitsafe.signals].  ``leaving`` (`exitsafe.exit`): the process
    ends right after, without returning to a teardown this thread may be running (exit()
    called by one of its steps), so that teardown records what it decided first.
    """
    from . import _interrupts  # (see run_early_phase)

    # Signals are held back until every registry is torn down and the ledger written, and
    # delivered then.  Each registry's teardown holds them too, but a signal landing
    # between two of them, or while the ledger's path is worked out, ran its handler's
    # own teardown nested in this one (a terminated pool worker hung for ever on an
    # import lock this thread held), or its SystemExit skipped the registries left.
    if _worth_holding_signals(_interrupts):
        with _interrupts.held():
            _teardown_every_registry(reason, leaving)
    else:  # nothing to tear down, no handler of exitsafe's: only the ledger, if asked
        _teardown_every_registry(reason, leaving)  # (and threading stays unimported)


def _worth_holding_signals(interrupts: ModuleType) -> bool:
    """Whether a teardown has something to hold signals back for: a registry, a handler of
    exitsafe's, a signal sent again.  (Else it holds none: the hold imports threading.)"""
    return bool(_process.states() or interrupts.installed or interrupts.signals_to_take_over())


def _teardown_every_registry(reason: str, leaving: bool) -> None:
    _process.set_ending(True)
    done: set[int] = set()
    while True:
        todo = [s for s in reversed(_process.states()) if id(s) not in done]
        if not todo:
            break
        for state in todo:
            done.add(id(state))
            try:
                _closing.teardown(state, reason)
            except Exception as exc:  # keep tearing down the other registries
                log().error("exitsafe: teardown of registry %r failed: %s", state.name, repr(exc))
            _process.release_kept(state)
    if leaving:
        for state in _process.states():
            _closing.finish_own_teardown(state)
    path = _config.ledger_path()
    if path:
        write_ledger(path)


def run_early_phase(reason: str) -> None:
    """Run every registry's early hooks (newest registry first), once per process.

    Never raises: an exception escaping here would abort ``threading._shutdown``, which
    would then skip the joins of non-daemon threads.
    """
    if _sync.reentered():
        return  # never from inside exitsafe's own step (a signal handler): it runs at exit
    if not _early.first_run():
        return
    # (imported here, not with exitsafe: see _interrupts._EndBySignal, which must be
    # collected early in the interpreter's module cleanup)
    from . import _interrupts

    try:
        # A signal arriving while an early hook runs is held back, as during the exit
        # teardown, and ends the process once the exit is done (not a hook's failure).
        with _interrupts.held(at_exit=True):
            for state in reversed(_process.states()):
                _hooks.run_early_hooks(state, reason)
    except BaseException as exc:  # see the docstring: never raise into _shutdown
        _early.report(exc)
    # An early hook called exitsafe.exit() on its worker thread (a hook with a timeout):
    # the early phase is over, the exit is carried out here (see _steps).
    steps = _closing.loaded_steps()
    if steps is not None:  # (not imported: no step ever ran on a worker)
        steps.leave_if_asked()


def at_exit() -> None:
    """The `atexit` callback: the exit teardown (then, in a forked child set to leave
    quietly, the end: see `exitsafe._children`)."""
    from . import _interrupts  # (see run_early_phase)

    _process.set_exit_phase("exiting")
    _threads.note_main_thread()  # (read late in the exit, when threading may be gone)
    if _sync.reentered():
        # No exitsafe frame is on this thread's stack at exit, so this thread holds the
        # lock only if an interrupt escaped a section in a way no check above caught: free
        # it rather than skip the teardown (it would defer itself for ever).
        while _sync.reentered():
            _sync.release()
        log().error("exitsafe: the lock was still held by the exiting thread; released")
    if _quiesce.requested():  # (done at the end of threading._shutdown if hooked there)
        quiesce_threads()
    try:
        if _worth_holding_signals(_interrupts):
            with _interrupts.held(at_exit=True):
                teardown_all("atexit")
        else:  # nothing to tear down, no signal to hold back: only the ledger, if asked
            teardown_all("atexit")
    finally:
        _process.set_exit_phase("exited")
        _interrupts.end_by_uncaught_keyboard_interrupt()
    lsan = sys.modules.get("exitsafe._lsan")  # EXITSAFE_LSAN (see below)
    if lsan is not None and lsan.enabled():  # (not for EXITSAFE_LSAN=0)
        # Everything exitsafe keeps for ever was leaked on purpose (its handle ended
        # leaked_*, or a library is never unloaded): not a leak for LeakSanitizer, whose
        # own check runs after this, at the C-level exit.
        for raw in _process.kept_alive():
            lsan.leaked(raw)
    if "exitsafe._audit" in sys.modules:  # EXITSAFE_AUDIT / EXITSAFE_TRACE (see below)
        sys.modules["exitsafe._audit"].after_exit_teardown()
    if _sync.generation:
        _children.quiet_end()


def leave(code: Optional[int] = 0) -> NoReturn:
    """Tear down what this process owns, flush stdio, and end with ``os._exit(code)``
    ([`exitsafe.exit`][exitsafe.exit]).

    Called by a timed teardown step on its worker thread, while the thread that handed it
    the step still waits for it: the exit is handed to that thread, which leaves once the
    phase it runs has ended, and this thread parks for good (see
    ``exitsafe._steps.hand_back_exit``).
    """
    status = _children.status_of(code)
    steps = _closing.loaded_steps()
    if steps is not None:  # (not imported: no step ever ran on a worker)
        steps.hand_back_exit(status)  # returns only if this thread is no such worker
    from . import _interrupts  # (see run_early_phase)

    try:
        # A signal arriving meanwhile is held back; the process ends by it after the
        # teardown, as at exit, rather than with ``status``.
        with _interrupts.held(at_exit=True):
            teardown_all("exitsafe.exit", leaving=True)
    finally:
        _children.flush_stdio()
        _interrupts.end_by_signal_now()
        os._exit(status)


def write_ledger(path: str) -> None:
    """Write every registry's ledger as JSON to ``path``, a regular file (or a new one).

    A symbolic link is followed to its target.  A path naming a directory, a device, a
    FIFO or anything but a regular file is refused with one logged error and left
    untouched; the file is written through a temporary file in the same directory, of
    this call alone (two writes at once, from two threads, never share one: each replaces
    the file with a complete ledger), which never outlives this call.

    One line per entry (`exitsafe._ledger.write_json`), encoded at C speed: a 10^6-entry
    ledger takes about a second.  Each registry's part is read in one locked moment
    (`RegistryState.ledger_file_part`), one registry at a time.
    """
    import stat

    from . import _ledger

    target = os.path.realpath(path)
    try:
        mode: Optional[int] = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        log().error("exitsafe: could not write the ledger to %r: %s", path, exc)
        return
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        log().error(
            "exitsafe: not writing the ledger to %r: it is %s (EXITSAFE_LEDGER must name "
            "a regular file)",
            path,
            kind,
        )
        return
    head = {"pid": os.getpid(), "python": sys.version.split()[0]}
    parts = (s.ledger_file_part() for s in _process.states())  # one registry at a time
    try:
        fd, tmp = _new_temporary(target)
        try:
            with open(fd, "w", encoding="utf-8") as fh:
                _ledger.write_json(fh, head, parts)
            os.replace(tmp, target)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        log().error("exitsafe: could not write the ledger to %r: %s", path, exc)


#: How many names `_new_temporary` tries before it gives up (as ``tempfile.mkstemp``).
_TEMPORARY_ATTEMPTS = 100


def _new_temporary(target: str) -> tuple[int, str]:
    """Create a file no other call uses, next to ``target``: ``(fd, path)``.

    A random name created with ``O_EXCL``, as ``tempfile.mkstemp`` does, but with the
    ledger's own mode (0o644 less the umask) rather than 0o600: it becomes the ledger.

    Raises:
        OSError: it could not be created (``FileExistsError`` after
            `_TEMPORARY_ATTEMPTS` names taken).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMPORARY_ATTEMPTS):
        tmp = f"{target}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, flags, 0o644), tmp
        except FileExistsError:  # taken (by another writer, or left by a killed one)
            continue
    raise FileExistsError(f"no unused temporary name next to {target!r}")


def load_teardown() -> None:
    """Import now every module of exitsafe that a teardown imports on its first use.

    For a teardown run by a signal handler: the handler runs between two bytecodes of
    whatever the main thread was doing, which may be the first import of one of those
    modules (by a teardown the signal interrupted); the handler's teardown would then
    find it half-executed and fail on an ``ImportError``, releasing nothing.  Importing
    them before any handler is installed leaves no such window.  (A second signal
    landing while the first one's handler imported ``_teardown`` found it half-executed:
    a terminated ``multiprocessing.Pool`` worker released nothing.)
    """
    import json  # noqa: F401  (the ledger file)
    import stat  # noqa: F401
    import threading  # noqa: F401

    from . import _interrupts, _steps, _teardown  # noqa: F401


def install_early_phase() -> None:
    """Hook the early phase into the interpreter's shutdown (idempotent)."""
    _early.install(run_early_phase)


def quiesce_threads() -> None:
    """Quiesce the threads `exitsafe.quiesce` asked for (once; never raises), none of
    the teardown's own step workers nor exitsafe's service threads."""
    steps = _closing.loaded_steps()
    workers = steps.worker_idents() if steps is not None else ()
    _quiesce.run([*workers, *_threads.own])


def install_quiesce() -> None:
    """Quiesce the threads left once the interpreter has joined its threads, before any
    ``atexit`` callback runs (idempotent)."""
    _early.install(run_early_phase)
    _early.after_joins(quiesce_threads)


# ---------------------------------------------------------------------- fork


def _before_fork() -> None:
    _children.before_fork()
    _sync.before_fork()


def _after_fork_in_parent() -> None:
    _sync.after_fork_in_parent()


def _after_fork_in_child() -> None:
    from . import _interrupts  # (see run_early_phase)


    _sync.after_fork_in_child()
    _interrupts.after_fork_in_child()
    _process.set_exit_phase("open")  # the child has an exit of its own
    _process.set_ending(False)
    for state in _process.states():
        _closing.after_fork_in_child(state)
    steps = _closing.loaded_steps()
    if steps is not None:  # not imported: no worker was ever started
        steps.after_fork_in_child()
    _threads.after_fork_in_child()
    _collection.after_fork_in_child()
    _early.after_fork_in_child()
    _quiesce.after_fork_in_child()
    _children.after_fork_in_child()
    watcher = sys.modules.get(f"{__package__}._watcher")
    if watcher is not None:  # (loaded by teardown_on_signals(watch=True) only)
        watcher.after_fork_in_child()  # (last: it starts a thread of the child's own)


def _teardown_worker() -> None:
    from . import _interrupts  # (see run_early_phase)

    # As at exit: a signal arriving during it (Pool.terminate()'s SIGTERM) is held back,
    # and the worker ends by it once its teardown is done and its ledger written.
    with _interrupts.held(at_exit=True):
        teardown_all("multiprocessing worker exit")
    _interrupts.end_by_signal_now()  # (the worker leaves by os._exit: see there)


def install() -> None:
    """Set up the process's exit and fork handling (once, when exitsafe is imported)."""
    atexit.register(at_exit)
    _config.remember_interpreter_id()  # (not at exit: see interpreter_id)
    _collection.install()
    _process.set_leave(leave)
    _children.set_worker_teardown(_teardown_worker)
    if "multiprocessing.util" in sys.modules:  # imported in a multiprocessing worker?
        _children.in_worker()
    if os.environ.get("EXITSAFE_AUDIT") or os.environ.get("EXITSAFE_TRACE"):
        from . import _audit  # noqa: F401  (audit mode / thread list at exit; see _audit)
    if os.environ.get("EXITSAFE_LSAN"):
        from . import _lsan  # noqa: F401  (leaked handles handed to LeakSanitizer; see _lsan)
    if os.environ.get("EXITSAFE_STEP_TIMEOUT") or os.environ.get("EXITSAFE_TEARDOWN_TIMEOUT"):
        from . import _steps

        _steps.prepare()  # the exit teardown will need a worker thread (see exitsafe._steps)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )


install()

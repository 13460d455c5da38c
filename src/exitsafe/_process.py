"""Process-level state: the registries, the default registry, the exit and fork hooks.

The exit teardown is one `atexit` callback, registered when exitsafe is imported:
it runs after the interpreter joined the non-daemon threads and before it finalizes
modules, tears down every registry newest first (and any registry a hook creates
meanwhile), then writes the ledger when ``EXITSAFE_LEDGER`` asks for it.  A registry
created after that is closed at once.

After ``os.fork()`` the child bumps the fork generation (so inherited handles are
never released there), reinitializes exitsafe's lock and drops the work queued by the
parent's threads; the fork itself waits (bounded) for any section in progress.
"""

from __future__ import annotations

import atexit
import os
import sys
from _weakref import ref as _weakref

from . import _config, _sync, _threads
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from ._registry import Registry


_registries: list[Any] = []  # weak references, oldest first
#: Registries with teardown hooks, kept alive until their teardown (a hook is owned by
#: its registry: dropping the registry object must not drop the hook).
_kept: dict[int, Registry] = {}
_default: list[Registry] = []
#: The exit teardown's progress: "open" -> "exiting" -> "exited".
_exit_phase: list[str] = ["open"]
#: Whether `teardown_all` began: the process is ending (at exit, on a signal, by
#: exitsafe.exit, in a multiprocessing worker), not one registry closing.
_ending: list[bool] = [False]
#: Objects kept referenced for the life of the process: the raw objects of leaked
#: handles and pinned libraries that must never be unloaded by exitsafe's doing.
_kept_alive: list[object] = []


def register(registry: Registry) -> bool:
    """Remember ``registry`` (weakly) for the exit teardown.

    Returns ``False`` when the exit teardown has already finished: the caller then
    starts closed.
    """
    try:
        _sync.enter()
        _registries[:] = [r for r in _registries if r() is not None]
        _registries.append(_weakref(registry))
        return _exit_phase[0] != "exited"
    finally:
        try:
            _sync.release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        else:
            _sync.run_deferred()


def keep_until_teardown(registry: Registry) -> None:
    """Keep ``registry`` alive until its teardown (it has hooks to run)."""
    _kept[id(registry)] = registry


def registries() -> list[Registry]:
    """Every registry still alive, oldest first (the exit teardown goes newest first)."""
    found = [r() for r in list(_registries)]
    return [r for r in found if r is not None]


def default_registry() -> Registry:
    """The process-wide registry that the module-level functions act on (created on first use)."""
    if _default:
        return _default[0]
    from ._registry import Registry

    created = Registry("default")
    try:
        _sync.enter()
        if not _default:
            _default.append(created)
        return _default[0]
    finally:
        try:
            _sync.release()
        except RuntimeError:  # (not held: interrupted before taking it)
            pass
        else:
            _sync.run_deferred()


def keep_forever(obj: object) -> None:
    """Keep a reference to ``obj`` for the rest of the process (never released by us)."""
    _kept_alive.append(obj)


def process_ending() -> bool:
    """Whether the teardown of every registry began (`teardown_all`): the process ends.

    Read without the lock (one list item).  ``False`` again in a forked child.
    """
    return _ending[0]


def load_teardown() -> None:
    """Import now every module of exitsafe that a teardown imports on its first use.

    For a teardown run by a signal handler: the handler runs between two bytecodes of
    whatever the main thread was doing, which may be the first import of one of those
    modules (by a teardown the signal interrupted); the handler's teardown would then
    find it half-executed and fail on an ``ImportError``, releasing nothing.  Importing
    them before any handler is installed leaves no such window.  Not done by ``import
    exitsafe``, whose cost stays low.
    """
    from . import _interrupts, _steps, _teardown  # noqa: F401


def teardown_all(reason: str, leaving: bool = False) -> None:
    """Tear down every registry, newest first, then write the ledger if asked to.

    A registry created meanwhile (by a hook, or a release function) is torn down in a
    further round.  One registry failing does not stop the others.  Used by the exit
    hook and by the signal handlers of [`exitsafe.signals`][exitsafe.signals].
    ``leaving`` (`exitsafe.exit`): the process ends right after, without returning to a
    teardown this thread may be running (exit() called by one of its steps), so that
    teardown records what it decided first.
    """
    _ending[0] = True
    done: set[int] = set()
    while True:
        todo = [r for r in reversed(registries()) if id(r) not in done]
        if not todo:
            break
        for registry in todo:
            done.add(id(registry))
            try:
                registry.teardown(reason=reason)
            except Exception as exc:  # keep tearing down the other registries
                log().error(
                    "exitsafe: teardown of registry %r failed: %s", registry.name, repr(exc)
                )
            _kept.pop(id(registry), None)
    if leaving:
        for registry in registries():
            registry.finish_own_teardown()
    path = _config.ledger_path()
    if path:
        write_ledger(path)


def at_exit() -> None:
    """The `atexit` callback: the exit teardown (then, in a forked child set to
    leave quietly, the end: see `exitsafe._children`)."""
    from ._interrupts import end_by_uncaught_keyboard_interrupt, held, signals_to_take_over

    _exit_phase[0] = "exiting"
    _threads.note_main_thread()  # (read late in the exit, when threading may be gone)
    if _sync.reentered():
        # No exitsafe frame is on this thread's stack at exit, so this thread holds the
        # lock only if an interrupt escaped a section in a way no check above caught: free
        # it rather than skip the teardown (it would defer itself for ever).
        from ._report import log

        while _sync.reentered():
            _sync.release()
        log().error("exitsafe: the lock was still held by the exiting thread; released")
    try:
        if registries() or signals_to_take_over():
            with held(at_exit=True):
                teardown_all("atexit")
        else:  # nothing to tear down, no signal to hold back: only the ledger, if asked
            teardown_all("atexit")
    finally:
        _exit_phase[0] = "exited"
        end_by_uncaught_keyboard_interrupt()
    lsan = sys.modules.get("exitsafe._lsan")  # EXITSAFE_LSAN (see below)
    if lsan is not None and lsan.enabled():  # (not for EXITSAFE_LSAN=0)
        # Everything exitsafe keeps for ever was leaked on purpose (its handle ended
        # leaked_*, or a library is never unloaded): not a leak for LeakSanitizer, whose
        # own check runs after this, at the C-level exit.
        for raw in list(_kept_alive):
            lsan.leaked(raw)
    if "exitsafe._audit" in sys.modules:  # EXITSAFE_AUDIT / EXITSAFE_TRACE (see below)
        sys.modules["exitsafe._audit"].after_exit_teardown()
    if _sync.generation:
        from ._children import quiet_end

        quiet_end()


def write_ledger(path: str) -> None:
    """Write every registry's ledger as JSON to ``path``, a regular file (or a new one).

    A symbolic link is followed to its target.  A path naming a directory, a device,
    a FIFO or anything but a regular file is refused with one logged error and left
    untouched; the file is written through a temporary file in the same directory, of
    this call alone (two writes at once, from two threads, never share one: each
    replaces the file with a complete ledger), which never outlives this call.
    """
    import json
    import stat

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
    data = {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "registries": [r._as_json() for r in registries()],
    }
    try:
        fd, tmp = _new_temporary(target)
        try:
            with open(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
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


# ---------------------------------------------------------------------- fork


def _before_fork() -> None:
    from . import _children

    _children.before_fork()
    _sync.before_fork()


def _after_fork_in_parent() -> None:
    _sync.after_fork_in_parent()


def _after_fork_in_child() -> None:
    from . import _children, _early, _interrupts, _threads

    _sync.after_fork_in_child()
    _interrupts.after_fork_in_child()
    _exit_phase[0] = "open"  # the child has an exit of its own
    _ending[0] = False
    for registry in registries():
        registry._after_fork_in_child()
    steps = sys.modules.get("exitsafe._steps")
    if steps is not None:  # not imported: no worker was ever started
        steps.after_fork_in_child()
    _threads.after_fork_in_child()
    _early.after_fork_in_child()
    _children.after_fork_in_child()


atexit.register(at_exit)
if "multiprocessing.util" in sys.modules:  # imported in a multiprocessing worker?
    from . import _children

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

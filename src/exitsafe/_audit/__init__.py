"""Audit mode: every native release that runs after exitsafe's exit teardown.

Turned on by ``EXITSAFE_AUDIT=1`` (``exitsafe run --audit`` sets it).  It is a validation
layer for exit order: a ``__del__`` that calls into a native library, an ``ffi.gc``
destructor or a ``weakref.finalize`` callback that runs while the interpreter finalizes its
modules ran in an order nobody chose.  It happened to work in this run; on another platform
or the next CPython it may crash.  Each one is reported, with where its object was created
and the exitsafe declaration that would put it in the ordered teardown instead.

Creation sites are taken only for the objects that have a native finalizer, when they are
made: each ``ffi.gc`` result of cffi's ``FFI`` (ABI mode), each ``weakref.finalize``, and each
instance of a class with a Python ``__del__`` and a Python ``__init__`` defined outside the
standard library (found as the class statement runs: ``builtins.__build_class__`` is
wrapped).  Nothing else is traced: the cost is a few hundred nanoseconds per such object and
nothing per other allocation (``tracemalloc`` from start-up made programs 5 to 14 times
slower).  A site that was not recorded (an object made before the audit was installed, an
API-mode ``ffi.gc``, an instance of a C type) is taken from ``tracemalloc`` when something
else started it (``PYTHONTRACEMALLOC``), else reported unknown.

The interface is narrow on purpose:

* `install` runs when this package is imported with ``EXITSAFE_AUDIT`` set (exitsafe
  imports it then; ``exitsafe run``'s start-up hook loads it in every Python process): it
  installs the creation-site hooks and registers a fallback `atexit` callback for programs
  that never import exitsafe.
* `after_exit_teardown` is called by exitsafe's exit hook once the exit teardown has
  finished: from then on releases are recorded (the *window*).  It also lists the threads
  still alive (``EXITSAFE_TRACE=1`` or audit on), with their whole stacks and the locks
  they hold, so that a thread unwound or stopped later can be named.
* In a run of ``exitsafe run`` (``EXITSAFE_RUN_DIR``), the start-up hook's `atexit` callback
  is the last one: it writes ``exit-<pid>.txt`` into the run directory when every exit hook
  has run (the interpreter finalizes modules next: a hang after it is in a finalizer), and
  the audit keeps the release in progress in ``audit-<pid>.state``, 16 bytes, so that a
  finalizer the process hung or crashed in is named.

Everything is written at once, as trace lines on stderr (``os.write`` on fd 2, so a crash
right after loses nothing)::

    exitsafe: thread ident=0x00007f... name="pool-1" daemon=true frame="app.py:12 in work"
        stack="app.py:12 in work <- threading.py:975 in run ..." holds="lock (locked)"
    exitsafe: audit-begin after="teardown" candidates=3 sites="hooks"
    exitsafe: audit-release seq=1 group=1 what="__del__" type="mylib.Device" site="app.py:20"
        holds="_ptr (cffi pointer)" suggest="..."   (one line in the real output)
    exitsafe: audit-repeat group=1 count=2

This package imports only the standard library and nothing else of exitsafe, so that the
start-up hook can load it from its files (as ``exitsafe_boot_audit``) into an interpreter
where exitsafe is not installed.  Importing it with ``EXITSAFE_AUDIT`` unset installs
nothing.  Its modules, each with one job:

* ``_state``: the settings and the one state, shared with the start-up hook's copy;
* ``_emit``: writing trace lines;
* ``_sites``: the creation-site hooks, installed at start when the audit is on;
* ``_threads``: the threads alive at exit;
* imported only when the window opens, at exit: ``_recorder`` (what is pending, what runs),
  ``_describe`` (what a release is, and the suggested declaration), ``_sink`` (the
  ``audit-release`` lines and the state file) and ``_survive`` (working on through
  finalization).
"""

from __future__ import annotations

import os
import sys

from ._state import DEFAULT_FRAMES, KNOWN_BINDINGS, SHARED, enabled, flag, state
from ._threads import list_at_shutdown, list_threads, when_imported

__all__ = ["after_exit_teardown", "boot", "enabled", "install", "list_threads"]


def install() -> None:
    """Start the audit in this process (idempotent): the creation-site hooks
    (``EXITSAFE_AUDIT_FRAMES`` frames per site, default 4) and the fallback exit hook."""
    if state.installed:
        return
    state.installed = True
    extra = os.environ.get("EXITSAFE_AUDIT_MODULES", "")
    if extra:
        state.known = KNOWN_BINDINGS | {m.strip() for m in extra.split(",") if m.strip()}
    try:
        state.frames = max(1, int(os.environ.get("EXITSAFE_AUDIT_FRAMES", "") or DEFAULT_FRAMES))
    except ValueError:
        state.frames = DEFAULT_FRAMES
    state.since = "startup" if state.booted or not sys.modules.get("exitsafe") else "import"
    try:
        from ._sites import install_site_hooks  # (only when the audit is on)

        install_site_hooks()
    except Exception:
        pass
    if not state.fallback:
        state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def boot() -> None:
    """Called by ``exitsafe run``'s start-up hook before the program runs: the audit when
    ``EXITSAFE_AUDIT`` is set, and the fallback exit hook that lists threads (and opens
    the audit window) in a program that never imports exitsafe.  Registered before
    anything else, that hook is the last one to run: it also writes the ``exit-phase``
    line."""
    state.booted = True
    if enabled() or flag("EXITSAFE_TRACE"):
        try:
            when_imported("threading", list_at_shutdown)
        except Exception:
            pass
    if enabled():
        install()
    elif not state.fallback:
        state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def _fallback_at_exit() -> None:
    # Registered when the audit was installed.  When exitsafe's exit hook is pending (it
    # was registered before this one, so it runs after it) it opens the window itself.
    if state.booted:
        _exit_phase()
    if "exitsafe._process" in sys.modules and not state.window and not state.booted:
        return
    try:
        _open_window("atexit")
    except Exception:
        pass


def _exit_phase() -> None:
    """The last exit hook has run: the interpreter finalizes modules next.  Written to
    ``exit-<pid>.txt`` of exitsafe run's directory (``finalizing 0x<thread ident>``), not
    on stderr, so the program's output is unchanged."""
    run_dir = os.environ.get("EXITSAFE_RUN_DIR")
    if state.phase_written or not run_dir:
        return
    state.phase_written = True
    try:
        import _thread

        path = os.path.join(run_dir, f"exit-{os.getpid()}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"finalizing 0x{_thread.get_ident():016x}\n".encode("ascii"))
        finally:
            os.close(fd)
    except Exception:
        pass


def after_exit_teardown() -> None:
    """Called by exitsafe's exit hook when the exit teardown has finished: list the
    threads still alive (with ``EXITSAFE_TRACE`` or the audit on), then, with the audit
    on, record every native release from now on.  Never raises."""
    try:
        _open_window("teardown")
    except Exception:
        pass


def _open_window(after: str) -> None:
    if state.window:
        return
    if enabled() or flag("EXITSAFE_TRACE"):
        list_threads()
    if not (state.installed and enabled()):
        return
    state.window = True
    from ._recorder import start_recording  # at exit: not loaded before

    start_recording(after)


if not SHARED and enabled():
    # (a copy that shares the start-up hook's state leaves the installing to it)
    install()

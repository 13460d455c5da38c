"""Google-style docstrings for Registry and its mixins, as laid out on main after 3dae512
(_registry.py, _hooks.py, _closing.py, _inspection.py).  From the repository root:

    .venv/bin/python tools/docstrings/registry_docstrings.py
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build -q -d /tmp/site-roles   # for objects.inv
    .venv/bin/python tools/docstrings/convert_roles.py /tmp/site-roles/objects.inv \
        src/exitsafe/_registry.py src/exitsafe/_hooks.py src/exitsafe/_closing.py \
        src/exitsafe/_inspection.py src/exitsafe/_borrowing.py src/exitsafe/_pending.py
    .venv/bin/python tools/docstrings/reflow.py src/exitsafe/*.py        # lines > 100
    .venv/bin/python tests/docs_api.py                                   # expect 0 gaps

convert_roles.py turns each remaining Sphinx role into an autorefs link when its target is
in the built reference, else into a code span; reflow.py rewraps docstring paragraphs
that the longer links pushed past 100 columns.  Tried on main (e9f65bc) merged with the
docstrings branch: 0 gaps, no raw role, `mkdocs build --strict` and the docs tests pass.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setdoc import setdoc

SRC = "src/exitsafe/"

REGISTRY = r'''
An independent graph of handles with its own teardown.

Every registry is torn down at process exit, newest registry first, each in its own
dependency order.  A registry created once the exit teardown has begun is torn down by
it too, or, once it has finished, is closed at once.  A registry with teardown hooks is
kept alive by exitsafe until its teardown.  Most programs use the process-wide
[`default_registry()`][exitsafe.default_registry] through the module-level functions; a
registry of your own tears down on its own and can be torn down early.

Thread rules: every method may be called from any thread.  Release functions, hooks and
policies run on the thread that caused them (the thread dropping the last owner, or the
thread running the teardown; with a timeout, a teardown worker thread), never while
exitsafe holds its lock, and may call back into exitsafe.

Args:
    name: labels the registry in the ledger and the trace.
    strict: turn misuse that is otherwise absorbed into exceptions:
        [`LiveDependentsError`][exitsafe.LiveDependentsError] for releasing a handle with
        live dependents, [`RegistryClosedError`][exitsafe.RegistryClosedError] for
        registering after teardown.
    exit_policy: the default for handles that name none: `"release"`, `"leak"` or a
        callable taking a [`HandleInfo`][exitsafe.HandleInfo] and returning one of them
        (see [`exitsafe.policies`][exitsafe.policies]).
    step_timeout: seconds one teardown step may take before it is abandoned and leaked;
        `None`: `EXITSAFE_STEP_TIMEOUT`, else no bound.
    teardown_timeout: seconds the whole teardown may take; steps after that are leaked.
        `None`: `EXITSAFE_TEARDOWN_TIMEOUT`, else no bound.
    ledger_limit: how many ledger entries are kept (oldest dropped first;
        [`ledger_counts`][exitsafe.Registry.ledger_counts] stays exact); `None` keeps all.

Attributes:
    name: the registry's name.
    strict: whether misuse raises.

Example:
    ```python
    gpu = exitsafe.Registry("gpu", exit_policy="leak", step_timeout=2.0)
    dev = gpu.track(lib.device_create(), lib.device_free, kind="device")
    ```
'''

TRACK = r'''
Start owning `raw`: `release(raw)` is called exactly once, or never if leaked.

After teardown began, the new handle is leaked at once (`leaked_after_close`).  For
cffi and ctypes pointers prefer [`exitsafe.cffi.track`][exitsafe.cffi.track] /
[`exitsafe.ctypes.track`][exitsafe.ctypes.track], which check the pointer and find the
library's pin.

Args:
    raw: the native object (a pointer, an integer handle, any object); kept referenced
        by the handle and passed to `release`.
    release: the native release function, called as `release(raw)` when the last owner
        lets go and no dependent is alive, or at teardown in dependency order.  It runs
        on the thread that drops the last owner or on the teardown thread, never while
        exitsafe holds its lock.
    kind: a label (`"device"`, `"buffer"`...) shown in the ledger and the trace, and
        passed to exit policies; `"library"` also makes the handle go last at teardown,
        after everything else.
    depends_on: handles (or pins) of this registry that must outlive this one.
    exit_policy: overrides the registry's default for this handle at teardown; `None`:
        the registry's [`exit_policy`][exitsafe.Registry.exit_policy].
    name: its display name; default `"<kind>#<n>"`.
    timeout: seconds its release step may take at teardown before it is abandoned and
        leaked; `None`: the registry's [`step_timeout`][exitsafe.Registry.step_timeout].
    affinity: `"creator"` or `"main"` makes the release run only on that thread (GL
        contexts, some GPU and GUI objects): a release that becomes due on another
        thread (garbage collection, an owner dropped elsewhere) is queued and run by the
        owning thread at its next exitsafe call or
        [`run_pending()`][exitsafe.run_pending]; see the threads page for the teardown's
        rules.  `None`: any thread.

Returns:
    The new handle, holding one owner.

Raises:
    RegistryClosedError: strict mode only, when teardown has begun.
    HandleClosedError: a handle in `depends_on` is no longer usable.
    ForeignHandleError: a handle in `depends_on` belongs to another registry.
'''

PIN = r'''
Hold a loaded library so it is not unloaded while anything depending on it lives.

At teardown libraries go last.  For cffi and ctypes libraries prefer
[`exitsafe.cffi.pin`][exitsafe.cffi.pin] / [`exitsafe.ctypes.pin`][exitsafe.ctypes.pin],
which also keep the library file mapped against other closers.

Args:
    library: the loaded library object; kept referenced until the pin is released.
    close: called as `close(library)` (for example `ffi.dlclose`) when the pin is
        released, after its last dependent; `None`: the library object stays referenced
        for the rest of the process, so it is never unloaded by exitsafe's doing.
    name: its display name; default `"library#<n>"`.
    timeout: seconds `close` may take at teardown before it is abandoned.

Returns:
    A handle of kind `"library"`: pass it in `depends_on` of every handle whose release
    runs the library's code.
'''

ON_TEARDOWN = r'''
Register `fn()` to run once during this registry's teardown.

The hook is a node of the same graph.  Hooks with no `before` / `after` constraint run
first.  Until it runs or is cancelled, the hook refers to the handles in `before`:
dropping your last reference to one of them does not release it before the hook
(garbage collection cannot reach it), while an explicit `release()` on it still
releases it at once (the edge orders the teardown; it does not defer releases).  The
hook runs on the teardown thread (or a worker when a timeout applies), outside
exitsafe's lock; an exception is logged and recorded (`hook_failed`).

Args:
    fn: the hook, called with no arguments.
    before: handles released only after the hook ran (e.g. "flush the queue" before
        the buffers go).
    after: handles released (or leaked) before the hook runs.
    name: its display name in the ledger and the trace.
    timeout: seconds the hook may run before it is abandoned (`hook_timeout`); the
        handles in `before` are then leaked.
    in_child: what a process forked after this call does with the hook it inherited:
        `"skip"` (the default: it belongs to the parent's objects, and ends
        `leaked_inherited` in the child) or `"run"` (it is pure Python that the child's
        own exit needs too, like the neutralization of
        [`neutralize_at_exit`][exitsafe.neutralize_at_exit]).

Returns:
    The hook's handle: `release()` on it cancels the hook; dropping it does not.
'''

ON_EARLY_EXIT = r'''
Register `fn()` for the *early phase* of the exit: before the interpreter joins
non-daemon threads and `concurrent.futures` joins its workers.

The place to stop servers, executors and pools that would otherwise keep the exit
waiting (`server.stop(None)`, `executor.shutdown(wait=False, cancel_futures=True)`...).
Early hooks run once, newest first, on the main thread at exit, or at the beginning of
an explicit [`teardown`][exitsafe.Registry.teardown]; then the declared workers are asked
to stop.  Everything may still be used there; on CPython 3.12.0 to 3.12.2 no new thread
can be started.

Args:
    fn: the hook, called with no arguments; an exception is logged and recorded
        (`hook_failed`).
    name: its display name in the ledger and the trace.
    timeout: seconds the hook may run before it is abandoned (`hook_timeout`).

Returns:
    The hook's handle; `release()` on it cancels the hook.
'''

WORKER = r'''
Declare a thread that uses handles, and how to stop it.

The worker is a teardown hook that runs before any handle in `uses` is released: it
asks the thread to stop and joins it.  A thread still running after `timeout` is
abandoned (`hook_timeout`), the handles it uses are leaked (`leaked_dependent`, never
released under it), and the thread is parked at its next
[`Handle.borrow`][exitsafe.Handle.borrow].  The stop request is also made in the early
phase of the exit (before the interpreter joins non-daemon threads), so a non-daemon
worker does not keep the exit waiting either.

Args:
    thread: the `threading.Thread`.
    stop: a `threading.Event` (set to ask the thread to stop) or a callable (called
        once to ask it).
    uses: the handles the thread uses.
    timeout: how long to wait for the thread to end once asked; `None`: 5 seconds.
    name: its display name in the ledger and the trace.

Returns:
    The hook's handle; `release()` on it forgets the worker.
'''

TEARDOWN = r'''
Release or leak every live handle in dependency order, run the hooks, then close.

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

Idempotent: a second call returns at once; a call from another thread while a teardown
runs waits for it to finish (bounded by `teardown_timeout`, or 5 seconds without one).
Called from a finalizer or signal handler that interrupted exitsafe on the same thread,
it runs right after the interrupted step.  Runs automatically at process exit.

Args:
    reason: a label recorded in the trace (`reason=...`); the exit teardown uses
        `"atexit"`.
'''

LEDGER = r'''
The recorded outcomes, oldest first.

Returns:
    One [`LedgerEntry`][exitsafe.LedgerEntry] per ended handle or hook (at most
    `ledger_limit` of the newest).
'''

LEDGER_COUNTS = r'''
How many handles ended in each outcome.

Returns:
    `{outcome: count}`, exact, never truncated by `ledger_limit`.
'''

LIVE_HANDLES = r'''
A snapshot of every handle and hook not yet ended, oldest first.

Returns:
    One [`HandleInfo`][exitsafe.HandleInfo] per handle.
'''

if __name__ == "__main__":
    setdoc(SRC + "_registry.py", {
        "Registry": REGISTRY,
        "Registry.track": TRACK,
        "Registry.pin": PIN,
    })
    setdoc(SRC + "_hooks.py", {
        "HookRegistration": "The hook half of [`Registry`][exitsafe.Registry] (a mixin).",
        "HookRegistration.on_teardown": ON_TEARDOWN,
        "HookRegistration.on_early_exit": ON_EARLY_EXIT,
        "HookRegistration.worker": WORKER,
    })
    setdoc(SRC + "_closing.py", {
        "Closing": "The teardown half of [`Registry`][exitsafe.Registry] (a mixin).",
        "Closing.teardown": TEARDOWN,
    })
    setdoc(SRC + "_inspection.py", {
        "Inspection": "The read-only half of [`Registry`][exitsafe.Registry] (a mixin).",
        "Inspection.ledger": LEDGER,
        "Inspection.ledger_counts": LEDGER_COUNTS,
        "Inspection.live_handles": LIVE_HANDLES,
    })

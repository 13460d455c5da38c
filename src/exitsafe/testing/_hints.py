"""What fixes each kind of bad exit: the hints table, `HINTS`, and the address of each
recipe on the documentation site (`docs_url`).

Each hint's code between backquotes is runnable as written, with the names it uses bound
(tests/testing/test_hints.py runs them); its section is shown as a link to the docs site
(`DOCS_URL`, or ``EXITSAFE_DOCS_URL``).
"""

from __future__ import annotations

import os
from typing import Optional

#: The documentation site the hints link to; ``EXITSAFE_DOCS_URL`` (or
#: ``exitsafe run --docs-url``) replaces it, for a mirror or a local build
#: (``file:///.../site/``).
DOCS_URL = "https://exitsafe.github.io/exitsafe/"

#: What fixes each kind: (the hint, the documentation section of its recipe as
#: ``page.md#anchor``).  Code between backquotes is runnable as written, the names it uses
#: standing for the program's objects (``thread``, ``stop_event``, ``handle``, ``obj``,
#: ``writer``, ``executor``, ``ffi``, ``lib``, ``fn``); tests/testing/test_hints.py runs each.
#: A key ending in ``-thread`` is the hint of its kind when a daemon thread was still
#: running at exit (the kind is the same; the recipe stops or waits for the thread first).
HINTS: dict[str, tuple[str, str]] = {
    "thread-in-native": (
        "a thread must not be inside a native call when the interpreter finalizes: add"
        " `exitsafe.quiesce()` (at exit the thread is parked between two native calls, before"
        " anything is released and before the libraries' exit handlers; exitsafe run"
        " --quiesce tries it with no code change), or declare the thread with"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])` when its loop can be"
        " stopped",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "thread-crash-at-exit": (
        "a thread must not be inside a native call on an object when the exit frees it:"
        " add `exitsafe.quiesce()` (at exit the thread is parked between two native calls,"
        " before anything is released and before the libraries' exit handlers), let the"
        " thread use the object through a borrowing view,"
        " `writer = exitsafe.adopt(writer, close=\"close\").borrowing()` (the close waits"
        " for the call in flight, then the thread parks), or declare the thread with"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])`",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "hang-before-teardown": (
        "the interpreter joins non-daemon threads and executors before any atexit callback,"
        " so no per-step timeout applies there; stop them in an early-phase hook, which runs"
        " before those joins: `exitsafe.on_early_exit(stop_event.set)` for your own threads,"
        " `exitsafe.on_early_exit(lambda: executor.shutdown(wait=False,"
        " cancel_futures=True))` for an executor, or a server's own stop call",
        "threads.md#the-early-phase",
    ),
    "hang-in-atexit": (
        "an exit handler waited for something that never ends (a thread, a socket with"
        " pending messages, a JVM or runtime shutdown): end what it waits for before any"
        " atexit callback runs, in an early-phase hook: `exitsafe.on_early_exit(fn)` (fn"
        " closes the sockets or stops the threads the handler waits for), or adopt what it"
        " waits on to close it then: `exitsafe.adopt(executor, close=\"shutdown\","
        " early=True)`; and declare the threads that use the library:"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])`",
        "threads.md#the-early-phase",
    ),
    "hang-in-finalizer": (
        "a finalizer blocked in a native call while the interpreter finalized: release that"
        " object in exitsafe's teardown instead, in order and with a time limit: `handle ="
        " exitsafe.adopt(obj, close=\"close\", timeout=5)` (a release that overruns it is"
        " leaked and the exit goes on), or make its finalizer a no-op at exit:"
        " `exitsafe.lowlevel.neutralize_at_exit(obj, attr=\"_handle\")`",
        "policies.md#hangs-and-timeouts",
    ),
    "hang-in-finalizer-thread": (
        "a finalizer blocked in a native call while the interpreter finalized, and a daemon"
        " thread was still running then (it may hold what the finalizer waits for, or be"
        " inside the same library): stop the thread before anything is released, with"
        " `exitsafe.quiesce()` (it parks between two native calls), and release the object"
        " in exitsafe's teardown with a time limit: `handle = exitsafe.adopt(obj,"
        " close=\"close\", timeout=5)` (a release that overruns it is leaked and the exit"
        " goes on)",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "deadlock-at-exit": (
        "a thread that was stopped or left blocked at exit still holds a lock that the"
        " exit needs: stop that thread and let it leave the lock before the teardown, by"
        " declaring it: `exitsafe.worker(thread, stop=stop_event, uses=[handle])` (it is"
        " asked to stop in the early phase and joined before its handles are released), or"
        " with `exitsafe.quiesce()`, which parks a thread only outside libraries' code (it"
        " then holds none of their locks); a thread blocked in a native call needs a way out:"
        " `exitsafe.worker(thread, wake=fn, uses=[handle])`",
        "threads.md#workers",
    ),
    "hang-in-main": (
        "the program was still running its own code when the timeout came: this is not an"
        " exit hang; the stacks above show where it was (give it a longer --timeout, or"
        " make it end)",
        "testing.md#hangs",
    ),
    "timeout": (
        "the program did not exit in time and left no Python stack to tell where (not a"
        " Python program, or its stderr was closed); run the Python part alone under"
        " exitsafe run",
        "testing.md#hangs",
    ),
    "hang-in-teardown": (
        "give that release a time limit: the EXITSAFE_STEP_TIMEOUT variable (seconds) for"
        " every step, or `handle = exitsafe.track(raw, fn, timeout=5)` for one handle; a"
        " step that blocks past it is leaked and recorded, and the exit goes on",
        "policies.md#hangs-and-timeouts",
    ),
    "crash-in-teardown": (
        "the release in that step crashed: make what it calls outlive it, by pinning the"
        " library it calls into (`lib_pin = exitsafe.cffi.pin(ffi, lib)`; handles whose"
        " release comes from it then depend on it) or with depends_on=[...] on the handle,"
        " or leak it at exit: `handle = exitsafe.track(raw, fn, exit_policy=\"leak\")`",
        "concepts.md#dependencies",
    ),
    "crash-after-teardown": (
        "native code ran after exitsafe's teardown, from a finalizer exitsafe does not"
        " know: declare that object (`handle = exitsafe.adopt(obj, close=\"close\")`), or"
        " make its own finalizer a no-op at exit (`exitsafe.lowlevel.neutralize_at_exit(obj,"
        " attr=\"_handle\")`), and keep its library loaded (`lib_pin ="
        " exitsafe.cffi.pin(ffi, lib)`); exitsafe run --audit lists every such finalizer",
        "adapters.md#third-party-objects-adopt",
    ),
    "crash-after-teardown-thread": (
        "native code ran after exitsafe's teardown, from a finalizer exitsafe does not"
        " know, and a daemon thread was still running then (it may have been inside the"
        " same library, or using that object): declaring the object alone would release it"
        " under the thread; stop the thread before anything is released, with"
        " `exitsafe.quiesce()` (it parks between two native calls, before the teardown and"
        " before the libraries' exit handlers), or let it use the object through a"
        " borrowing view, `obj = exitsafe.adopt(obj, close=\"close\").borrowing()` (the"
        " close waits for the call in flight, then the thread parks), or declare the"
        " thread: `exitsafe.worker(thread, stop=stop_event, uses=[handle])`; and make the"
        " object's own finalizer a no-op at exit (`exitsafe.lowlevel.neutralize_at_exit(obj,"
        " attr=\"_handle\")`) and keep its library loaded (`lib_pin ="
        " exitsafe.cffi.pin(ffi, lib)`); exitsafe run --audit lists every such finalizer",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "crash-at-exit": (
        "native code crashed at exit and the program does not use exitsafe (or crashed"
        " before its teardown): declare the handles and their dependencies, so they are"
        " released in a safe order before finalization (`device = exitsafe.track(raw, fn,"
        " depends_on=[handle])`); exitsafe run --audit lists the late finalizers",
        "concepts.md#dependencies",
    ),
    "crash-at-exit-thread": (
        "native code crashed at exit while a daemon thread was still running (the program"
        " does not use exitsafe, or crashed before its teardown): the thread may have been"
        " inside the library whose objects the exit freed, so declaring the handles alone"
        " would release them under it; stop the thread first, with `exitsafe.quiesce()`"
        " (at exit it parks between two native calls, before anything is released and"
        " before the libraries' exit handlers), or let it use the object through a"
        " borrowing view, `obj = exitsafe.adopt(obj, close=\"close\").borrowing()` (the"
        " close waits for the call in flight, then the thread parks), or declare the"
        " thread: `exitsafe.worker(thread, stop=stop_event, uses=[handle])`; then declare"
        " the handles and their dependencies, released in a safe order before"
        " finalization (`device = exitsafe.track(raw, fn, depends_on=[handle])`);"
        " exitsafe run --audit lists the late finalizers",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "native-fatal": (
        "a native library stopped the process on one of its own checks (the line above"
        " names it): release the objects it names in order before finalization (`handle ="
        " exitsafe.adopt(obj, close=\"close\")`), and stop the threads that use them first:"
        " `exitsafe.quiesce()`, or `exitsafe.worker(thread, stop=stop_event, uses=[handle])`;"
        " a thread blocked in a native call (a recv, a query) needs a way out too:"
        " `exitsafe.quiesce(wake=wake_it)`, wake_it sending it a message or interrupting"
        " the call",
        "adapters.md#third-party-objects-adopt",
    ),
    "native-fatal-qthread": (
        "Qt aborts when a QThread object is destroyed while its thread runs: declare it as"
        " a worker, so it is asked to stop and waited for before the objects it uses are"
        " released: `exitsafe.worker(thread, stop=thread.quit, uses=[handle])` for a thread"
        " running an event loop, `exitsafe.worker(thread, stop=thread.requestInterruption)`"
        " for a run() loop that checks isInterruptionRequested()",
        "threads.md#any-kind-of-thread",
    ),
    "thread-exception": (
        "a thread ended with an uncaught exception (at exit: the runtime it called was"
        " finalized under it); stop the thread before the objects it uses are released:"
        " `exitsafe.quiesce()` parks it between two calls at exit, or give it a borrowing"
        " view of the object (`obj = exitsafe.adopt(obj, close=\"close\").borrowing()`), or"
        " declare it: `exitsafe.worker(thread, stop=stop_event, uses=[handle])`; a thread"
        " whose blocking call the exit interrupted (a recv, a query) is woken and parked"
        " with `exitsafe.quiesce(wake=wake_it)`",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "atexit-error": (
        "an atexit callback raised: it ran after (or before) what it needed; declare it as"
        " an exitsafe hook ordered with the handles it uses: `exitsafe.on_teardown(fn,"
        " before=[handle])`",
        "concepts.md#hooks",
    ),
    "atexit-error-thread": (
        "an atexit callback raised, and a daemon thread was still running then: if the"
        " callback closed what that thread uses (a library's exit handler closing a writer"
        " under a write in flight), ordering the callback is not enough; stop the thread"
        " before any exit handler runs, with `exitsafe.quiesce()` (it parks between two"
        " native calls, before anything is released and before the libraries' exit"
        " handlers), or let it use the object through a borrowing view, `obj ="
        " exitsafe.adopt(obj, close=\"close\").borrowing()` (the close waits for the call"
        " in flight, then the thread parks), or declare the thread:"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])`; a callback of your own"
        " is then declared as an exitsafe hook ordered with the handles it uses:"
        " `exitsafe.on_teardown(fn, before=[handle])`",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "unraisable-at-exit": (
        "a finalizer raised while the interpreter was shutting down: declare the object so"
        " it is released in order before modules are torn down (`handle ="
        " exitsafe.adopt(obj, close=\"close\")`, or `exitsafe.lowlevel.neutralize_at_exit(obj,"
        " attr=\"_handle\")` for an object you do not own)",
        "adapters.md#third-party-objects-adopt",
    ),
    "unraisable-at-exit-thread": (
        "a finalizer raised while the interpreter was shutting down, and a daemon thread was"
        " still running then: if that thread uses the object, declaring it alone would"
        " release it under the thread; stop the thread first with `exitsafe.quiesce()` (it"
        " parks between two native calls, before anything is released) and declare the"
        " object: `handle = exitsafe.adopt(obj, close=\"close\")`",
        "threads.md#quiescing-the-threads-left-exitsafequiesce",
    ),
    "child-process": (
        "a forked child that ends normally runs the parent's finalizers on objects it does"
        " not own: end it with `exitsafe.exit()` (its own teardown, flush, os._exit), or set"
        " EXITSAFE_FORK_EXIT=quiet so every forked child leaves quietly",
        "fork.md#leaving-a-child-quietly",
    ),
    "child-process-exec": (
        "a process the program started crashed or hung (its stack is above): fix it as its"
        " own program (exitsafe run on it alone), and give the wait for it a timeout"
        " (the timeout argument of subprocess.run, of Popen.wait, of Process.join)",
        "testing.md#child-processes",
    ),
    "lost-output": (
        "data the program meant to write was not complete when it exited: declare the"
        " writer so it is flushed and closed in order before exit: `handle ="
        " exitsafe.adopt(writer, close=\"close\")`, or `exitsafe.on_teardown(writer.close)`",
        "adapters.md#third-party-objects-adopt",
    ),
    "lost-output-thread": (
        "data the program meant to write was not complete when it exited, and a daemon"
        " thread was still running then: if that thread writes, closing the writer is not"
        " enough (it would close under a write in flight): give the thread a borrowing"
        " view of the writer, `writer = exitsafe.adopt(writer, close=\"close\").borrowing()`"
        " (the close waits for the write in flight, then the thread parks), or stop the"
        " thread before it is closed, with `exitsafe.quiesce()` (it parks between two"
        " writes) or `exitsafe.worker(thread, stop=stop_event, uses=[handle])`",
        "threads.md#objects-threads-use-handleborrowing",
    ),
    "audit": (
        "each of these finalizers ran in an order nobody chose; declare the object with"
        " the suggested exitsafe call so it is released, in dependency order, before"
        " finalization",
        "testing.md#audit-mode-latent-exit-hazards",
    ),
}


#: The page a report links to when no rule recognised the cause: the kinds and what each
#: needs, to compare the report with.
UNRECOGNISED_DOC = "testing.md#what-the-diagnosis-names"


def docs_url(doc: str, base: Optional[str] = None) -> str:
    """The address of a documentation section on the docs site.

    Args:
        doc: ``"page.md#anchor"`` (a key's section in `HINTS`).
        base: the site's root; `None`: ``EXITSAFE_DOCS_URL``, else `DOCS_URL`.

    Returns:
        ``"https://.../threads/#workers"`` (the site's pages are directories).
    """
    root = base or os.environ.get("EXITSAFE_DOCS_URL") or DOCS_URL
    page, _, anchor = doc.partition("#")
    path = "" if page in ("", "index.md") else page[: -len(".md")] + "/"
    return root.rstrip("/") + "/" + path + (f"#{anchor}" if anchor else "")

"""Naming the cause of a bad exit: [`Diagnosis`][exitsafe.testing.Diagnosis] and `diagnose`.

The classification reads only what a run leaves behind: the exit status, faulthandler's
dumps (of the program and, through the start-up hook, of its child processes), the
program's stderr (uncaught exceptions of threads, "Exception ignored" blocks, the lines a
native library prints when it aborts), exitsafe's trace lines (``EXITSAFE_TRACE=1``:
teardown steps, the threads alive at exit with their stacks and the locks they hold, the
end of the exit hooks, the audit) and the checks.

Every kind's fix is in one table, `HINTS`: the hint (each piece of code in it between
backquotes is runnable as written, with the names it uses bound: a test runs them) and
the documentation section of the recipe, shown as a link to the docs site
(`DOCS_URL`, or ``EXITSAFE_DOCS_URL``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .parsers import Frame, NativeFatal, ThreadStack

if TYPE_CHECKING:
    from ._result import AuditFinding, ExitResult

#: The documentation site the hints link to; ``EXITSAFE_DOCS_URL`` (or
#: ``exitsafe run --docs-url``) replaces it, for a mirror or a local build
#: (``file:///.../site/``).
DOCS_URL = "https://exitsafe.github.io/exitsafe/"

#: What fixes each kind: (the hint, the documentation section of its recipe as
#: ``page.md#anchor``).  Code between backquotes is runnable as written, the names it uses
#: standing for the program's objects (``thread``, ``stop_event``, ``handle``, ``obj``,
#: ``writer``, ``executor``, ``ffi``, ``lib``, ``fn``); tests/testing/test_hints.py runs each.
HINTS: dict[str, tuple[str, str]] = {
    "thread-in-native": (
        "a thread must not be inside a native call when the interpreter finalizes: declare"
        " the thread with `exitsafe.worker(thread, stop=stop_event, uses=[handle])`, so it is"
        " stopped and joined before the handles it uses are released, and make each native"
        " call inside `with handle.borrow():` in the thread (the teardown waits for a call in"
        " flight, and a later one parks the thread instead of entering native code)",
        "threads.md#workers",
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
        " closes the sockets or stops the threads the handler waits for), and declare the"
        " threads that use the library: `exitsafe.worker(thread, stop=stop_event,"
        " uses=[handle])`",
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
    "deadlock-at-exit": (
        "a thread that was stopped or left blocked at exit still holds a lock that the"
        " exit needs: stop that thread and let it leave the lock before the teardown, by"
        " declaring it: `exitsafe.worker(thread, stop=stop_event, uses=[handle])` (it is"
        " asked to stop in the early phase and joined before its handles are released),"
        " with its native calls inside `with handle.borrow():`",
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
    "crash-at-exit": (
        "native code crashed at exit and the program does not use exitsafe (or crashed"
        " before its teardown): declare the handles and their dependencies, so they are"
        " released in a safe order before finalization (`device = exitsafe.track(raw, fn,"
        " depends_on=[handle])`); exitsafe run --audit lists the late finalizers",
        "concepts.md#dependencies",
    ),
    "native-fatal": (
        "a native library stopped the process on one of its own checks (the line above"
        " names it): release the objects it names in order before finalization (`handle ="
        " exitsafe.adopt(obj, close=\"close\")`), and stop the threads that use them first:"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])`",
        "adapters.md#third-party-objects-adopt",
    ),
    "native-fatal-qthread": (
        "Qt aborts when a QThread object is destroyed while its thread runs: quit and wait"
        " for it before the interpreter finalizes, in an early-phase hook:"
        " `exitsafe.on_early_exit(lambda: (thread.quit(), thread.wait()))`",
        "threads.md#the-early-phase",
    ),
    "native-fatal-thread-in-native": (
        "a thread was ended while inside native code: declare the thread with"
        " `exitsafe.worker(thread, stop=stop_event, uses=[handle])` and make each native"
        " call inside `with handle.borrow():` in the thread",
        "threads.md#workers",
    ),
    "thread-exception": (
        "a thread ended with an uncaught exception (at exit: the runtime it called was"
        " finalized under it); declare the thread so it is stopped and joined before the"
        " objects it uses are released: `exitsafe.worker(thread, stop=stop_event,"
        " uses=[handle])`, with each call into them inside `with handle.borrow():`",
        "threads.md#workers",
    ),
    "atexit-error": (
        "an atexit callback raised: it ran after (or before) what it needed; declare it as"
        " an exitsafe hook ordered with the handles it uses: `exitsafe.on_teardown(fn,"
        " before=[handle])`",
        "concepts.md#hooks",
    ),
    "unraisable-at-exit": (
        "a finalizer raised while the interpreter was shutting down: declare the object so"
        " it is released in order before modules are torn down (`handle ="
        " exitsafe.adopt(obj, close=\"close\")`, or `exitsafe.lowlevel.neutralize_at_exit(obj,"
        " attr=\"_handle\")` for an object you do not own)",
        "adapters.md#third-party-objects-adopt",
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
        " enough (it would close under a write in flight): declare the thread with the"
        " writer it uses, `exitsafe.worker(thread, stop=stop_event, uses=[handle])` where"
        " `handle = exitsafe.adopt(writer, close=\"close\")`, and make each write inside"
        " `with handle.borrow():`",
        "threads.md#workers",
    ),
    "audit": (
        "each of these finalizers ran in an order nobody chose; declare the object with"
        " the suggested exitsafe call so it is released, in dependency order, before"
        " finalization",
        "testing.md#audit-mode-latent-exit-hazards",
    ),
}

#: Lines a C++ runtime prints when a thread is unwound through a frame that cannot be
#: unwound (``pthread_exit``'s forced unwind through ``noexcept`` or ``catch (...)``).
_FORCED_UNWIND = (
    "terminate called without an active exception",
    "FATAL: exception not rethrown",
    "terminate called after throwing an instance of 'abi::__forced_unwind'",
)
_WAIT_FUNCTIONS = {"waitpid", "wait", "_wait", "join", "poll", "_try_wait", "communicate"}
#: Frames that say a thread was parked by exitsafe's borrow gate.
_PARK_FUNCTIONS = {"park", "_park"}


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


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a bad exit, in words a person can act on.

    Attributes:
        kind: a stable label, named in the report's first line: ``"thread-in-native"``,
            ``"hang-before-teardown"``, ``"hang-in-atexit"``, ``"hang-in-finalizer"``,
            ``"deadlock-at-exit"``, ``"hang-in-teardown"``, ``"hang-in-main"``,
            ``"timeout"``, ``"crash-in-teardown"``, ``"crash-after-teardown"``,
            ``"crash-at-exit"``, ``"native-fatal"``, ``"child-process"``,
            ``"thread-exception"``, ``"atexit-error"``, ``"unraisable-at-exit"``,
            ``"lost-output"`` or ``"audit"``.
        headline: one line naming the cause (the report's first line carries it).
        details: further lines (which thread, which step, which process ...).
        hint: what fixes it, naming the exitsafe feature.
        doc: the documentation section of that recipe (``"threads.md#workers"``); its
            address on the docs site is `url`.
    """

    kind: str
    headline: str
    details: Sequence[str] = field(default_factory=tuple)
    hint: Optional[str] = None
    doc: Optional[str] = None

    @property
    def specific(self) -> bool:
        """Whether the cause says more than the decoded status (every kind but
        ``"timeout"`` and ``"other"``)."""
        return self.kind not in ("timeout", "other")

    @property
    def url(self) -> Optional[str]:
        """The address of `doc` on the docs site (``EXITSAFE_DOCS_URL`` or `DOCS_URL`)."""
        return None if self.doc is None else docs_url(self.doc)

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 3, see the testing page).

        Returns:
            One key per attribute, and `url`.
        """
        return {
            "kind": self.kind,
            "headline": self.headline,
            "details": list(self.details),
            "hint": self.hint,
            "doc": self.doc,
            "url": self.url,
        }


def _made(kind: str, headline: str, details: Sequence[str] = (), hint: Optional[str] = None
          ) -> Diagnosis:
    text, doc = HINTS[hint or kind]
    return Diagnosis(kind, headline, tuple(details), text, doc)


@dataclass(frozen=True)
class LateThread:
    """A thread still alive when exitsafe's exit teardown (or the last exit hook) ran,
    from the ``thread`` trace line."""

    ident: str
    name: str
    daemon: bool
    frame: Optional[str]
    target: Optional[str]
    stack: Optional[str] = None
    holds: Optional[str] = None

    def label(self) -> str:
        kind = "daemon thread" if self.daemon else "thread"
        return f"{kind} {self.name!r} ({self.ident})"


def late_threads(result: ExitResult) -> list[LateThread]:
    """The threads the trace listed as alive at the end of the exit teardown (or, when
    the exit never got there, as the exit began: ``when="shutdown"``)."""
    lines = [s for s in result.trace if s.event == "thread"]
    at_exit = [s for s in lines if s.get("when") in (None, "exit")]
    out = []
    for step in at_exit or lines:
        if step.event == "thread":
            out.append(
                LateThread(
                    ident=(step.get("ident") or "").lower(),
                    name=step.get("name") or "?",
                    daemon=step.get("daemon") == "true",
                    frame=step.get("frame"),
                    target=step.get("target"),
                    stack=step.get("stack"),
                    holds=step.get("holds"),
                )
            )
    return out


def _frame_text(frame: Frame) -> str:
    line = "?" if frame.line is None else str(frame.line)
    return f"{frame.function} ({frame.file}:{line})"


def _file_name(frame: Frame) -> str:
    return frame.file.replace("\\", "/").rsplit("/", 1)[-1]


def _bottom_user_frame(thread: ThreadStack) -> Optional[Frame]:
    """The outermost frame that is not the threading machinery: the thread's target."""
    for frame in reversed(thread.frames):
        if not frame.file.replace("\\", "/").endswith(("/threading.py", "/thread.py")):
            return frame
    return None


def _is_main_stack(thread: ThreadStack) -> bool:
    return any(f.function == "<module>" for f in thread.frames) or (
        any(f.function == "_shutdown" and f.file.endswith("threading.py") for f in thread.frames)
    )


def _stderr_before(result: ExitResult, count: int = 5) -> list[str]:
    """The program's own last stderr lines before the first fatal-error block (trace and
    exitsafe lines left out)."""
    lines = result.stderr.splitlines()
    end = len(lines)
    for index, line in enumerate(lines):
        if line.startswith(("Fatal Python error", "Windows fatal exception")):
            end = index
            break
    own = [
        line
        for line in lines[:end]
        if line.strip() and not line.startswith("exitsafe: ")
    ]
    return own[-count:]


def _library_of(frames: Sequence[Frame]) -> Optional[str]:
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if "-packages/" in path:
            top = path.split("-packages/", 1)[1].split("/", 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


def _stack_lines(frames: Sequence[Frame], indent: str = "    ", limit: int = 12) -> list[str]:
    lines = [f"{indent}{_frame_text(f)}" for f in frames[:limit]]
    if len(frames) > limit:
        lines.append(f"{indent}... {len(frames) - limit} more frame(s)")
    return lines


def _trace_stack_lines(stack: Optional[str], indent: str = "    ") -> list[str]:
    if not stack:
        return [f"{indent}(no stack recorded)"]
    return [f"{indent}{part}" for part in stack.split(" <- ")]


# ------------------------------------------------------------------------ the rules


def _thread_in_native(result: ExitResult) -> Optional[Diagnosis]:
    text = result.stderr
    unwound = next((m for m in _FORCED_UNWIND if m in text), None)
    threads = [t for t in late_threads(result) if t.daemon] or late_threads(result)
    fatal = result.fatal_error
    if unwound is None or not (result.signal == "SIGABRT" or fatal is not None):
        return None
    details = [f"the C++ runtime printed: {unwound!r}"]
    for thread in threads:
        where = f", last Python frame: {thread.frame}" if thread.frame else ""
        details.append(f"thread {thread.name!r} ({thread.ident}){where}")
    main = fatal.current_thread if fatal is not None else None
    if main is not None and main.frames:
        details.append(
            f"meanwhile the finalizing thread was in {_frame_text(main.frames[0])}, which"
            " let the thread run again (a native call that releases the GIL)"
        )
    if not threads:
        details.append(
            "run it with exitsafe run (or import exitsafe with EXITSAFE_TRACE=1) to name"
            " the thread: the start-up hook lists the threads alive at exit"
        )
    name = f" {threads[0].name!r}" if len(threads) == 1 else ""
    return _made(
        "thread-in-native",
        f"a daemon thread{name} was unwound inside native code while the interpreter"
        " finalized (C++ forced unwind: abort)",
        details,
    )


def _thread_hung_in_native(result: ExitResult) -> Optional[Diagnosis]:
    # 3.14+: a thread that wakes during finalization hangs instead of being unwound; the
    # main thread is then stuck in native code with no Python frame left.
    fatal = result.fatal_error
    threads = [t for t in late_threads(result) if t.daemon] or late_threads(result)
    if not (result.timed_out and fatal is not None and fatal.threads):
        return None
    main = next((t for t in fatal.threads if not t.frames), None)
    others = [t for t in fatal.threads if t.frames and t is not main]
    if (
        main is None
        or not others
        or any(_is_main_stack(t) for t in fatal.threads)
        or not (result.registries_finished or threads)
    ):
        return None
    details = []
    for stack in others:
        known: Optional[str] = stack.name or next(
            (t.name for t in threads if t.ident == (stack.thread_id or "").lower()), None
        )
        label = f"{known!r} ({stack.thread_id})" if known else str(stack.thread_id)
        details.append(f"thread {label}, last Python frame: {_frame_text(stack.frames[0])}")
    return _made(
        "thread-in-native",
        "the interpreter hung while finalizing, with a thread still inside native"
        " code (since Python 3.14 such a thread hangs instead of being unwound)",
        details,
    )


def _hang_before_teardown(result: ExitResult) -> Optional[Diagnosis]:
    fatal = result.fatal_error
    if not result.timed_out or fatal is None:
        return None
    # The thread that joins: any of the dumped threads (a signal sent to the process may
    # be taken by another thread than the main one, which is then not the "current" one).
    main = None
    in_shutdown = in_executor = False
    for thread in fatal.threads:
        functions = {(f.function, _file_name(f)) for f in thread.frames}
        in_shutdown = ("_shutdown", "threading.py") in functions
        in_executor = ("_python_exit", "thread.py") in functions or (
            "_python_exit", "process.py") in functions
        if in_shutdown or in_executor:
            main = thread
            break
    if main is None:
        return None
    if any(r.reason is not None for r in result.registries):
        return None  # the teardown had begun: not before it
    details = []
    for thread in fatal.threads:
        if thread is main or not thread.frames:
            continue
        target = _bottom_user_frame(thread)
        files = {_file_name(f) for f in thread.frames}
        kind = "an executor worker" if "thread.py" in files and any(
            f.function == "_worker" for f in thread.frames
        ) else "a non-daemon thread"
        where = f" running {_frame_text(target)}" if target is not None else ""
        listed = next((t for t in late_threads(result)
                       if t.ident == (thread.thread_id or "").lower()), None)
        if listed is not None and target is None and listed.target:
            where = f" running {listed.target}"
        now = ""
        if target is None or thread.frames[0] != target:
            now = f", now in {_frame_text(thread.frames[0])}"
        name = thread.name or (f"{listed.name!r} ({thread.thread_id})" if listed is not None
                               else thread.thread_id)
        details.append(f"{kind} {name}{where}{now}")
    what = "concurrent.futures joining its workers" if in_executor else (
        "threading._shutdown joining the non-daemon threads"
    )
    return _made(
        "hang-before-teardown",
        f"hang before exitsafe's teardown: the interpreter waited forever in {what}",
        details,
    )


def _teardown_cut(result: ExitResult) -> Optional[Diagnosis]:
    for registry in result.registries:
        if registry.reason is None or registry.finished:
            continue
        done = len(registry.steps)
        nxt = done + 1
        of = "?" if registry.planned is None else str(registry.planned)
        started = [s for s in result.trace if s.event == "step-begin"
                   and s.registry == registry.registry and s.index == nxt]
        handle = ""
        if started:
            handle = f" ({started[-1].action or 'release'} {started[-1].kind}"
            handle += f" {started[-1].name!r})"
        details = [f"registry {registry.registry!r}: {done} of {of} steps completed"]
        if registry.steps:
            details.append(f"last step that ended: {registry.steps[-1].describe()}")
        fatal = result.fatal_error
        if fatal is not None and fatal.top_frames:
            # the frames above exitsafe's own: the release function and what it called
            own = []
            for frame in fatal.top_frames:
                if "/exitsafe/" in frame.file.replace("\\", "/"):
                    break
                own.append(_frame_text(frame))
            if own:
                details.append("in " + " <- ".join(own[:4]))
        if result.timed_out:
            return _made(
                "hang-in-teardown",
                f"hang inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                details,
            )
        if result.signal or result.ntstatus or result.fatal_error is not None:
            return _made(
                "crash-in-teardown",
                f"crash inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                details,
            )
    return None


class _Hang:
    """What a timed-out run's dump says about where the main thread was."""

    def __init__(self, result: ExitResult) -> None:
        fatal = result.fatal_error
        self.result = result
        self.threads: Sequence[ThreadStack] = () if fatal is None else fatal.threads
        phase = result.exit_phase.split()
        self.finalizing = bool(phase) and phase[0] == "finalizing"
        main_ident = phase[1] if len(phase) > 1 else None
        main = None
        if main_ident is not None:
            main = next((t for t in self.threads
                         if (t.thread_id or "").lower() == main_ident.lower()), None)
        if main is None and fatal is not None:
            main = _main_thread(fatal.threads, fatal.current_thread)
        self.main = main
        self.frames: Sequence[Frame] = () if main is None else main.frames
        outer = self.frames[-1] if self.frames else None
        self.outer = outer
        self.in_main_code = outer is not None and (
            outer.function == "<module>"
            or (outer.function == "_run_module_as_main" and _file_name(outer) == "runpy.py")
        )

    def dumped(self, ident: str) -> Optional[ThreadStack]:
        return next((t for t in self.threads if (t.thread_id or "").lower() == ident), None)

    def main_lines(self) -> list[str]:
        main = self.main
        if main is None:
            return ["the main thread: (no stack was dumped)"]
        head = f"the main thread ({main.thread_id}), whole stack, most recent call first:"
        if not self.frames:
            return [head, "    <no Python frame> (native code: a C finalizer or a C exit"
                    " handler)"]
        return [head, *_stack_lines(self.frames)]


def _started_by_threading(thread: ThreadStack) -> bool:
    outer = thread.frames[-1] if thread.frames else None
    return outer is not None and _file_name(outer) == "threading.py" and outer.function in (
        "_bootstrap", "_bootstrap_inner")


def _main_thread(
    threads: Sequence[ThreadStack], current: Optional[ThreadStack]
) -> Optional[ThreadStack]:
    """The main thread of a dump: not one that threading started (a signal sent to the
    process may be taken by any thread, which is then the "current" one)."""
    candidates = [t for t in threads if not _started_by_threading(t)]
    if current is not None and current in candidates:
        return current
    with_frames = [t for t in candidates if t.frames]
    if with_frames:
        return with_frames[0]
    return candidates[0] if candidates else current


def _finalizer_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    for frame in frames:
        if frame.function == "__del__":
            return frame
        if _file_name(frame) == "weakref.py" and frame.function in ("__call__", "_exitfunc"):
            return frame
    return None


def _running(result: ExitResult) -> Optional[AuditFinding]:
    return result.audit_running


def _deadlock(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if hang.in_main_code or hang.main is None:
        return None
    holders = [t for t in late_threads(result) if t.holds]
    if not holders:
        return None
    details = list(hang.main_lines())
    stuck = _finalizer_frame(hang.frames)
    for thread in holders:
        dumped = hang.dumped(thread.ident)
        if dumped is None:
            state = "stopped at exit (its thread state was deleted when finalization began)"
        elif any(f.function in _PARK_FUNCTIONS for f in dumped.frames):
            state = "parked by exitsafe's borrow gate"
        else:
            state = "still alive, blocked"
        details.append(f"{thread.label()}, {state}, holding {thread.holds}; its whole stack"
                       " at exit, most recent call first:")
        details.extend(_trace_stack_lines(thread.stack))
        if dumped is not None and dumped.frames:
            details.append("  and when the run was killed:")
            details.extend(_stack_lines(dumped.frames))
    where = "a finalizer" if stuck is not None or hang.finalizing else "an exit handler"
    if not hang.frames:
        where = "native code (no Python frame)"
    holder = holders[0]
    return _made(
        "deadlock-at-exit",
        f"deadlock at exit: the main thread waits in {where} for a lock held by"
        f" {holder.label()}, which will never release it",
        details,
    )


def _finalizer(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if hang.in_main_code:
        return None
    frame = _finalizer_frame(hang.frames)
    running = _running(result)
    if frame is None and not (not hang.frames and (hang.finalizing or running is not None)):
        return None
    details = list(hang.main_lines())
    if running is not None:
        what = running.describe()
        details.insert(0, f"the audit saw this release begin and never end: {what}")
        if running.via:
            details.insert(1, f"  finalizer: {running.via}")
    if frame is not None:
        owner = f"{running.type}." if running is not None and running.what == "__del__" else ""
        headline = (
            f"hang in a finalizer: {owner}{frame.function} ({frame.file}:{frame.line}) blocked"
            " while the interpreter was finalizing"
        )
    elif running is not None:
        headline = f"hang in a finalizer: {running.describe()} blocked in native code"
    else:
        headline = (
            "hang in a native finalizer while the interpreter was finalizing (no Python"
            " frame: an ffi.gc destructor or an extension type's deallocator; run with"
            " --audit to name it)"
        )
    if running is None and frame is not None and result.audited:
        details.append("the audit saw no release begin (the object was released before the"
                       " audit window opened)")
    elif running is None and frame is not None:
        details.append("run with --audit to name the object's type and where it was made")
    return _made("hang-in-finalizer", headline, details)


def _atexit(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if hang.in_main_code or hang.finalizing or hang.main is None:
        return None
    details = hang.main_lines()
    outer = hang.outer
    if outer is None:
        if not any(s.event in ("thread", "audit-begin", "teardown-end") for s in result.trace):
            return None  # nothing tells that the exit had begun
        return _made(
            "hang-in-atexit",
            "hang in an exit handler with no Python frame (a C function registered with"
            " atexit), before the interpreter finalized",
            details,
        )
    library = _library_of([outer])
    where = f" of {library}" if library else ""
    return _made(
        "hang-in-atexit",
        f"hang in an atexit handler{where}: {outer.function} ({outer.file}:{outer.line})"
        f" never returned, now in {_frame_text(hang.frames[0])}",
        details,
    )


def _in_main(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if not hang.in_main_code:
        return None
    top = _frame_text(hang.frames[0])
    return _made(
        "hang-in-main",
        f"the program was still running its main code at the timeout, in {top}: not an"
        " exit hang",
        hang.main_lines(),
    )


def _hang_state(result: ExitResult) -> Optional[_Hang]:
    if not result.timed_out:
        return None
    if result.returncode == 0 and result.fatal_error is None:
        return None  # exited; only its children held the pipes (see _children)
    return _Hang(result)


def _hang_deadlock(result: ExitResult) -> Optional[Diagnosis]:
    hang = _hang_state(result)
    return None if hang is None else _deadlock(result, hang)


def _hang(result: ExitResult) -> Optional[Diagnosis]:
    hang = _hang_state(result)
    if hang is None:
        return None
    for rule in (_finalizer, _atexit, _in_main):
        found = rule(result, hang)
        if found is not None:
            return found
    return None


def _native_fatal(result: ExitResult) -> Optional[Diagnosis]:
    lines: Sequence[NativeFatal] = result.native_fatal
    if not lines or result.timed_out:
        return None
    if result.signal not in (None, "SIGABRT") or (result.ntstatus is not None and not (
        "BUFFER_OVERRUN" in result.ntstatus.name or "ABORT" in result.ntstatus.name
    )):
        return None  # a crash: the crash rules say where, and quote the line
    first = lines[0]
    details = [f"{line.source}: {line.line}" for line in lines[1:4]]
    frames = result.fatal_error.top_frames if result.fatal_error is not None else ()
    if frames:
        details.append(f"the Python frame it came from: {_frame_text(frames[0])}")
    threads = late_threads(result)
    for thread in threads[:4]:
        where = f", in {thread.frame}" if thread.frame else ""
        details.append(f"alive at exit: {thread.label()}{where}")
    hint = "native-fatal"
    if first.line.startswith("QThread: Destroyed"):
        hint = "native-fatal-qthread"
    how = "aborted" if result.signal == "SIGABRT" or result.fatal_error is not None else (
        f"ended with {result.exit_description}"
    )
    return _made(
        "native-fatal",
        f"a native library {how} on its own check ({first.source}): {first.line}",
        details,
        hint,
    )


def _crashed(result: ExitResult) -> bool:
    return bool(result.signal or result.ntstatus) or (
        result.fatal_error is not None and not result.timed_out
    )


def _crash_after(result: ExitResult) -> Optional[Diagnosis]:
    if not _crashed(result) or result.timed_out:
        return None
    registries = [r for r in result.registries if r.reason is not None]
    fatal = result.fatal_error
    before = _stderr_before(result, 3)
    frames = fatal.top_frames if fatal is not None else ()
    library = _library_of(frames)
    findings = result.audit
    details = []
    if before:
        details.append("the program's last stderr lines: " + " | ".join(before))
    if frames:
        details.append(f"top Python frame: {_frame_text(frames[0])}")
    if fatal is not None and fatal.extension_modules:
        details.append("extension modules loaded: " + ", ".join(fatal.extension_modules[:8]))
    running = result.audit_running
    if running is not None:
        details.append(f"the native release running when it crashed (audit): {running.describe()}")
    elif findings:
        details.append(f"last native release recorded by the audit: {findings[-1].describe()}")
    crash = result.exit_description.split(" (")[0]
    where = f" in {library}" if library else ""
    if registries and all(r.finished for r in registries):
        return _made(
            "crash-after-teardown",
            f"crash after exitsafe's teardown finished: native code{where} ran while the"
            f" interpreter finalized ({crash})",
            details,
        )
    if not registries and (
        (fatal is not None and (fatal.during_finalization or not fatal.top_frames))
        or any(f.function == "__del__" for f in frames)
    ):
        return _made(
            "crash-at-exit",
            f"crash at exit{where} ({crash}), with no exitsafe teardown traced",
            details,
        )
    return None


def _children(result: ExitResult) -> Optional[Diagnosis]:
    bad = [c for c in result.children if c.failed]
    if not bad:
        return None
    details = []
    for child in bad:
        fatal = child.fatal_error
        top = ""
        if fatal is not None and fatal.top_frames:
            top = f", in {_frame_text(fatal.top_frames[0])}"
        details.append(child.describe() + top)
    first = bad[0]
    waited = ""
    main = result.fatal_error.current_thread if result.fatal_error is not None else None
    if main is not None and any(f.function in _WAIT_FUNCTIONS for f in main.frames[:4]):
        waited = f" while the program waited in {main.frames[0].function}"
    if first.state == "hung" and result.returncode == 0:
        headline = (
            f"the program exited 0, but child process {first.pid} kept its stdout or stderr"
            " open past the timeout"
        )
    elif first.state == "hung":
        headline = f"child process {first.pid} hung{waited}"
    else:
        headline = f"child process {first.pid} {first.describe().split(': ', 1)[1]}{waited}"
    if len(bad) > 1:
        headline += f" (and {len(bad) - 1} more)"
    return _made(
        "child-process", headline, details, None if first.forked else "child-process-exec"
    )


def _lost_output(result: ExitResult) -> Optional[Diagnosis]:
    failed = [c for c in result.checks if not c.passed]
    exited_well = result.returncode == 0 and not result.timed_out and result.fatal_error is None
    if not (failed and exited_well):
        return None
    check = failed[0]
    details = [f"check {c.command_text!r}: {c.describe_status()}" for c in failed[1:]]
    daemons = [t for t in late_threads(result) if t.daemon]
    for thread in daemons:
        where = f", in {thread.frame}" if thread.frame else ""
        details.append(f"still running at exit: {thread.label()}{where}")
    return _made(
        "lost-output",
        f"the program exited 0 but the check {check.command_text!r} failed"
        f" ({check.describe_status()}): output lost at exit?",
        details,
        "lost-output-thread" if daemons else None,
    )


def _thread_exception(result: ExitResult) -> Optional[Diagnosis]:
    reports = list(result.thread_exceptions) + [
        r for r in result.unraisable if "thread started by" in r.context
    ]
    if not reports:
        return None
    first = reports[0]
    name = first.object or first.where
    details = [f"thread {r.object or r.where}: {r.describe()}" for r in reports[1:4]]
    exc = first.exc_type or "an exception"
    message = f": {first.message}" if first.message else ""
    return _made(
        "thread-exception",
        f"thread {name!r} ended with an uncaught exception ({exc}{message})",
        details,
    )


def _unraisable(result: ExitResult) -> Optional[Diagnosis]:
    reports = [r for r in result.unraisable if "thread started by" not in r.context]
    if not reports:
        return None
    atexit = [r for r in reports if "atexit" in r.context]
    if atexit:
        first = atexit[0]
        where = first.object or "an atexit callback"
        return _made(
            "atexit-error",
            f"an atexit callback raised at exit ({first.exc_type or 'an exception'}"
            f"{': ' + first.message if first.message else ''} in {where})",
            [r.describe() for r in reports if r is not first][:3],
        )
    first = reports[0]
    what = "a __del__ raised" if "__del__" in first.where else "a finalizer raised"
    return _made(
        "unraisable-at-exit",
        f"{what} while the interpreter shut down ({first.describe()})",
        [r.describe() for r in reports[1:4]],
    )


def _audit(result: ExitResult) -> Optional[Diagnosis]:
    findings = result.audit
    if not findings:
        return None
    count = sum(f.count for f in findings)
    return _made(
        "audit",
        f"{count} native release(s) ran after exitsafe's teardown, during finalization:"
        " latent exit hazards",
    )


def _timeout(result: ExitResult) -> Optional[Diagnosis]:
    if not result.timed_out:
        return None
    return _made(
        "timeout",
        "timed out with no Python stack to tell where",
    )


#: The rules, most specific first: the first that recognises the run names its cause.
RULES = (
    _thread_in_native, _children, _teardown_cut, _hang_before_teardown, _hang_deadlock,
    _thread_hung_in_native, _hang, _native_fatal, _crash_after, _lost_output, _thread_exception,
    _unraisable, _audit, _timeout,
)


def diagnose(result: ExitResult) -> Optional[Diagnosis]:
    """The cause of ``result``'s bad exit, or ``None`` for a clean run (or one whose
    cause none of the rules recognises: then the decoded status speaks for itself)."""
    if result.clean:
        return None
    for rule in RULES:
        found = rule(result)
        if found is not None:
            return found
    return None

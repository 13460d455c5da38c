"""Naming the cause of a bad exit: [`Diagnosis`][exitsafe.testing.Diagnosis] and `diagnose`.

The classification reads only what a run leaves behind: the exit status, faulthandler's
dumps (of the program and, through the start-up hook, of its child processes), the
program's last lines on stderr, exitsafe's trace lines (``EXITSAFE_TRACE=1``: teardown
steps, the threads alive when the exit teardown finished, the audit) and the checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .parsers import Frame, ThreadStack

if TYPE_CHECKING:
    from ._result import ExitResult

#: Where each fix is documented (relative to the documentation's root).
DOCS = {
    "thread-in-native": "threads.md#workers",
    "hang-before-teardown": "threads.md#the-early-phase",
    "hang-in-teardown": "policies.md",
    "crash-in-teardown": "policies.md",
    "crash-after-teardown": "policies.md",
    "crash-at-exit": "concepts.md",
    "child-process": "fork.md#leaving-a-child-quietly",
    "lost-output": "testing.md#checking-what-the-program-wrote",
    "unraisable-at-exit": "adapters.md",
    "audit": "testing.md#audit-mode-latent-exit-hazards",
}

#: Lines a C++ runtime prints when a thread is unwound through a frame that cannot be
#: unwound (``pthread_exit``'s forced unwind through ``noexcept`` or ``catch (...)``).
_FORCED_UNWIND = (
    "terminate called without an active exception",
    "FATAL: exception not rethrown",
    "terminate called after throwing an instance of 'abi::__forced_unwind'",
)
_JOIN_FUNCTIONS = {"_shutdown", "_wait_for_tstate_lock", "join", "_python_exit", "wait"}
_WAIT_FUNCTIONS = {"waitpid", "wait", "_wait", "join", "poll", "_try_wait", "communicate"}


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a bad exit, in words a person can act on.

    Attributes:
        kind: a stable label: ``"thread-in-native"``, ``"hang-before-teardown"``,
            ``"hang-in-teardown"``, ``"crash-in-teardown"``, ``"crash-after-teardown"``,
            ``"crash-at-exit"``, ``"child-process"``, ``"lost-output"``, ``"unraisable-at-exit"``,
            ``"audit"``, or ``"other"``.
        headline: one line naming the cause (the report's first line carries it).
        details: further lines (which thread, which step, which process ...).
        hint: what fixes it, naming the exitsafe feature.
        doc: the documentation section of that feature (``"threads.md#workers"``).
    """

    kind: str
    headline: str
    details: Sequence[str] = field(default_factory=tuple)
    hint: Optional[str] = None
    doc: Optional[str] = None

    @property
    def specific(self) -> bool:
        """Whether the cause says more than the decoded status (the summary line then
        starts with `headline`)."""
        return self.kind not in ("crash-at-exit", "unraisable-at-exit", "audit", "other")

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 2, see the testing page).

        Returns:
            One key per attribute.
        """
        return {
            "kind": self.kind,
            "headline": self.headline,
            "details": list(self.details),
            "hint": self.hint,
            "doc": self.doc,
        }


@dataclass(frozen=True)
class LateThread:
    """A thread still alive when exitsafe's exit teardown (or the last exit hook) ran,
    from the ``thread`` trace line."""

    ident: str
    name: str
    daemon: bool
    frame: Optional[str]
    target: Optional[str]


def late_threads(result: ExitResult) -> list[LateThread]:
    """The threads the trace listed as alive at the end of the exit teardown."""
    out = []
    for step in result.trace:
        if step.event == "thread":
            out.append(
                LateThread(
                    ident=(step.get("ident") or "").lower(),
                    name=step.get("name") or "?",
                    daemon=step.get("daemon") == "true",
                    frame=step.get("frame"),
                    target=step.get("target"),
                )
            )
    return out


def _frame_text(frame: Frame) -> str:
    line = "?" if frame.line is None else str(frame.line)
    return f"{frame.function} ({frame.file}:{line})"


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


def _thread_in_native(result: ExitResult) -> Optional[Diagnosis]:
    text = result.stderr
    unwound = next((m for m in _FORCED_UNWIND if m in text), None)
    threads = [t for t in late_threads(result) if t.daemon] or late_threads(result)
    fatal = result.fatal_error
    if unwound is not None and (result.signal == "SIGABRT" or fatal is not None):
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
        return Diagnosis(
            "thread-in-native",
            f"a daemon thread{name} was unwound inside native code while the interpreter"
            " finalized (C++ forced unwind: abort)",
            tuple(details),
            _HINTS["thread-in-native"],
            DOCS["thread-in-native"],
        )
    # 3.14+: a thread that wakes during finalization hangs instead of being unwound; the
    # main thread is then stuck in native code with no Python frame left.
    if result.timed_out and fatal is not None and fatal.threads:
        main = next((t for t in fatal.threads if not t.frames), None)
        others = [t for t in fatal.threads if t.frames and t is not main]
        if (
            main is not None
            and others
            and not any(_is_main_stack(t) for t in fatal.threads)
            and (result.registries_finished or threads)
        ):
            details = []
            for stack in others:
                known: Optional[str] = stack.name or next(
                    (t.name for t in threads if t.ident == (stack.thread_id or "").lower()),
                    None,
                )
                label = f"{known!r} ({stack.thread_id})" if known else str(stack.thread_id)
                top = _frame_text(stack.frames[0])
                details.append(f"thread {label}, last Python frame: {top}")
            return Diagnosis(
                "thread-in-native",
                "the interpreter hung while finalizing, with a thread still inside native"
                " code (since Python 3.14 such a thread hangs instead of being unwound)",
                tuple(details),
                _HINTS["thread-in-native"],
                DOCS["thread-in-native"],
            )
    return None


def _hang_before_teardown(result: ExitResult) -> Optional[Diagnosis]:
    fatal = result.fatal_error
    if not result.timed_out or fatal is None:
        return None
    # The thread that joins: any of the dumped threads (a signal sent to the process may
    # be taken by another thread than the main one, which is then not the "current" one).
    main = None
    in_shutdown = in_executor = False
    for thread in fatal.threads:
        functions = {
            (f.function, f.file.replace("\\", "/").rsplit("/", 1)[-1]) for f in thread.frames
        }
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
        files = {f.file.replace("\\", "/").rsplit("/", 1)[-1] for f in thread.frames}
        kind = "an executor worker" if "thread.py" in files and any(
            f.function == "_worker" for f in thread.frames
        ) else "a non-daemon thread"
        where = f" running {_frame_text(target)}" if target is not None else ""
        now = ""
        if target is None or thread.frames[0] != target:
            now = f", now in {_frame_text(thread.frames[0])}"
        details.append(f"{kind} {thread.name or thread.thread_id}{where}{now}")
    what = "concurrent.futures joining its workers" if in_executor else (
        "threading._shutdown joining the non-daemon threads"
    )
    return Diagnosis(
        "hang-before-teardown",
        f"hang before exitsafe's teardown: the interpreter waited forever in {what}",
        tuple(details),
        _HINTS["hang-before-teardown"],
        DOCS["hang-before-teardown"],
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
            handle = f" ({started[-1].action} {started[-1].kind} {started[-1].name!r})"
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
            return Diagnosis(
                "hang-in-teardown",
                f"hang inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                tuple(details),
                _HINTS["hang-in-teardown"],
                DOCS["hang-in-teardown"],
            )
        if result.signal or result.ntstatus or result.fatal_error is not None:
            return Diagnosis(
                "crash-in-teardown",
                f"crash inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                tuple(details),
                _HINTS["crash-in-teardown"],
                DOCS["crash-in-teardown"],
            )
    return None


def _library_of(frames: Sequence[Frame]) -> Optional[str]:
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if "site-packages/" in path:
            top = path.split("site-packages/", 1)[1].split("/", 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


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
    if findings:
        last = findings[-1]
        details.append(f"last native release recorded by the audit: {last.describe()}")
    crash = result.exit_description.split(" (")[0]
    if registries and all(r.finished for r in registries):
        where = f" in {library}" if library else ""
        return Diagnosis(
            "crash-after-teardown",
            f"crash after exitsafe's teardown finished: native code{where} ran while the"
            f" interpreter finalized ({crash})",
            tuple(details),
            _HINTS["crash-after-teardown"],
            DOCS["crash-after-teardown"],
        )
    if not registries and (
        (fatal is not None and (fatal.during_finalization or not fatal.top_frames))
        or any(f.function == "__del__" for f in frames)
    ):
        where = f" in {library}" if library else ""
        return Diagnosis(
            "crash-at-exit",
            f"crash at exit{where} ({crash}), with no exitsafe teardown traced",
            tuple(details),
            _HINTS["crash-at-exit"],
            DOCS["crash-at-exit"],
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
    if first.forked:
        return Diagnosis(
            "child-process", headline, tuple(details), _HINTS["child-process"],
            DOCS["child-process"],
        )
    return Diagnosis(
        "child-process", headline, tuple(details), _HINTS["child-process-exec"], None
    )


def diagnose(result: ExitResult) -> Optional[Diagnosis]:
    """The cause of ``result``'s bad exit, or ``None`` for a clean run (or one whose
    cause none of the rules recognises: then the decoded status speaks for itself)."""
    if result.clean:
        return None
    for rule in (_thread_in_native, _children, _teardown_cut, _hang_before_teardown,
                 _crash_after):
        found = rule(result)
        if found is not None:
            return found
    failed = [c for c in result.checks if not c.passed]
    exited_well = result.returncode == 0 and not result.timed_out and result.fatal_error is None
    if failed and exited_well:
        check = failed[0]
        return Diagnosis(
            "lost-output",
            f"the program exited 0 but the check {check.command_text!r} failed"
            f" ({check.describe_status()}): output lost at exit?",
            tuple(f"check {c.command_text!r}: {c.describe_status()}" for c in failed[1:]),
            _HINTS["lost-output"],
            DOCS["lost-output"],
        )
    if result.unraisable and any("__del__" in r.where for r in result.unraisable):
        return Diagnosis(
            "unraisable-at-exit",
            f"a __del__ raised while the interpreter shut down ({result.unraisable[0].describe()})",
            (),
            _HINTS["unraisable-at-exit"],
            DOCS["unraisable-at-exit"],
        )
    if result.audit and exited_well and not result.unraisable and not failed:
        return Diagnosis(
            "audit",
            f"{len(result.audit)} native release(s) ran after exitsafe's teardown, during"
            " finalization: latent exit hazards",
            (),
            _HINTS["audit"],
            DOCS["audit"],
        )
    return None


_HINTS = {
    "thread-in-native": (
        "a thread must not be inside a native call when the interpreter finalizes: enter"
        " native code with `with handle.borrow():` in the worker (teardown waits for it)"
        " (docs/threads.md#borrow-waits-at-exit), and declare the thread with"
        " `exitsafe.worker(thread, stop=..., uses=[...])` so it is stopped and joined"
        " before the handles it uses are released"
    ),
    "hang-before-teardown": (
        "the interpreter joins non-daemon threads and executors before any atexit"
        " callback, so a per-step timeout cannot apply; stop servers, executors and pools"
        " in an early-phase hook: `exitsafe.on_early_exit(fn)`"
    ),
    "hang-in-teardown": (
        "give the release a per-step timeout (EXITSAFE_STEP_TIMEOUT=seconds, or"
        " `timeout=` on the handle): a step that blocks past it is leaked and recorded,"
        " and the exit goes on"
    ),
    "crash-in-teardown": (
        "the release in that step crashed: check its dependencies (`depends_on=`: the"
        " library it calls into must be pinned with `exitsafe.pin`), or leak it at exit"
        " (`exit_policy=\"leak\"`)"
    ),
    "crash-after-teardown": (
        "native code ran after exitsafe's teardown, from a finalizer exitsafe does not"
        " know: declare that object (`exitsafe.track`, `exitsafe.adopt`), make its own"
        " finalizer a no-op with `exitsafe.lowlevel.neutralize_at_exit`, keep its library loaded"
        " with `exitsafe.pin`, or leak it at exit (exit policy \"leak\");"
        " `exitsafe run --audit` lists every such finalizer"
    ),
    "crash-at-exit": (
        "native code crashed at exit and the program does not use exitsafe (or crashed"
        " before its teardown): declare the handles and their dependencies with"
        " `exitsafe.track(..., depends_on=...)` so they are released in a safe order"
        " before finalization; `exitsafe run --audit` lists the late finalizers"
    ),
    "child-process": (
        "a forked child that ends normally runs the parent's finalizers on objects it does"
        " not own: end it with `exitsafe.exit()` (own teardown, flush, os._exit), or set"
        " EXITSAFE_FORK_EXIT=quiet so every forked child leaves quietly"
    ),
    "child-process-exec": (
        "a process the program started crashed or hung (its stack is above): fix it as its"
        " own program (`exitsafe run` on it alone), and give the wait for it a timeout"
        " (`subprocess.run(..., timeout=...)`, `Process.join(timeout)`)"
    ),
    "lost-output": (
        "data the program meant to write was not complete when it exited: flush and"
        " close writers in a teardown hook (`exitsafe.on_teardown(writer.close,"
        " before=[...])`) or adopt the writer (`exitsafe.adopt(writer)`) so it is closed"
        " in order before exit"
    ),
    "unraisable-at-exit": (
        "a __del__ ran while the interpreter was shutting down: track the native handle"
        " with `exitsafe.track(...)` (or `exitsafe.adopt` / `exitsafe.lowlevel.neutralize_at_exit`"
        " for an object you do not own) so it is released in order before modules are"
        " torn down"
    ),
    "audit": (
        "each of these finalizers ran in an order nobody chose; declare the object with"
        " the suggested exitsafe call so it is released, in dependency order, before"
        " finalization"
    ),
}


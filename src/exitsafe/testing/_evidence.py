"""What the diagnosis rules read off a result besides its fields: the threads alive at
exit (from the ``thread`` trace lines), and frames and stacks as the details show them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from .parsers import FatalError, Frame, ThreadStack

if TYPE_CHECKING:
    from ._result import ExitResult


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
    #: for a ``concurrent.futures`` worker: the callable it was running (``None`` when idle)
    task: Optional[str] = None

    def label(self) -> str:
        kind = "daemon thread" if self.daemon else "thread"
        return f"{kind} {self.name!r} ({self.ident})"

    def where(self, limit: int = 4) -> Optional[str]:
        """Where the thread was, most recent call first: its top frame and the frames
        below it down to the first of the program's own code (the ``worker`` function a
        ``threading.py:327 in wait`` was called from), at most ``limit`` frames; ``None``
        when the trace did not say."""
        if not self.stack:
            return self.frame
        frames = self.stack.split(" <- ")
        kept = []
        for frame in frames[:limit]:
            kept.append(frame)
            if not _library_frame(frame):
                break
        return " <- ".join(kept)


#: Where the standard library and installed packages live, as paths show them.
_LIBRARY_MARKS = ("/lib/python", "\\lib\\", "site-packages", "dist-packages", "<frozen")


def _library_frame(frame: str) -> bool:
    """Whether a ``file:line in function`` frame of a thread line is the standard
    library's or an installed package's (not the program's own code)."""
    return any(mark in frame for mark in _LIBRARY_MARKS)


def still_running(threads: Sequence[LateThread]) -> list[str]:
    """One detail line per thread still running at exit: its label and where it was."""
    lines = []
    for thread in threads:
        where = thread.where()
        line = f"still running at exit: {thread.label()}"
        lines.append(line + (f", in {where}" if where else ""))
    return lines


def late_threads(result: ExitResult) -> list[LateThread]:
    """The threads the trace listed as alive at the end of the exit teardown (or, when
    the exit never got there, as the exit began: ``when="shutdown"``).  A run whose every
    exit hook ran (``exit_phase`` written: the start-up hook lists the threads then) and
    that listed none at the end had none left: the threads listed as the exit began (idle
    executor workers joined since) are not returned."""
    lines = [s for s in result.trace if s.event == "thread"]
    at_exit = [s for s in lines if s.get("when") in (None, "exit")]
    if not at_exit and result.exit_phase:
        return []
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
                    task=step.get("task"),
                )
            )
    return out


def frame_text(frame: Frame) -> str:
    line = "?" if frame.line is None else str(frame.line)
    return f"{frame.function} ({frame.file}:{line})"


def file_name(frame: Frame) -> str:
    return frame.file.replace("\\", "/").rsplit("/", 1)[-1]


def bottom_user_frame(thread: ThreadStack) -> Optional[Frame]:
    """The outermost frame that is not the threading machinery: the thread's target."""
    for frame in reversed(thread.frames):
        if not frame.file.replace("\\", "/").endswith(("/threading.py", "/thread.py")):
            return frame
    return None


def is_main_stack(thread: ThreadStack) -> bool:
    return any(f.function == "<module>" for f in thread.frames) or (
        any(f.function == "_shutdown" and f.file.endswith("threading.py") for f in thread.frames)
    )


def main_stack(fatal: FatalError) -> Optional[ThreadStack]:
    """The main thread of a dump: not one that ``threading`` started (a signal sent to the
    process, the runner's own SIGABRT included, may be taken by any thread, which the dump
    then calls the "current" one)."""
    candidates = [t for t in fatal.threads if not started_thread(t)]
    current = fatal.current_thread
    if current is not None and current in candidates:
        return current
    with_frames = [t for t in candidates if t.frames]
    if with_frames:
        return with_frames[0]
    return candidates[0] if candidates else current


#: What faulthandler calls the crash signals it caught (``Fatal Python error: <this>``).
CRASH_FAULTS = ("Segmentation fault", "Bus error", "Illegal instruction",
                "Floating point exception")


def crash_fault(result: ExitResult) -> bool:
    """Whether the run's (first) fatal error is a crash faulthandler caught, whatever ended
    the process after it: glibc may abort it during the fault's dump (its heap check on
    another thread, its message even written into the dump's lines), and the process then
    dies by SIGABRT although a crash came first."""
    fatal = result.fatal_error
    return fatal is not None and not fatal.windows and fatal.message.strip() in CRASH_FAULTS


def started_thread(thread: ThreadStack) -> bool:
    """Whether a dumped stack is a thread that ``threading`` started (its outermost frame
    is ``threading``'s ``_bootstrap``, or ``_bootstrap_inner`` where the dump was cut
    short), not the main thread."""
    outer = thread.frames[-1] if thread.frames else None
    return outer is not None and file_name(outer) == "threading.py" and outer.function in (
        "_bootstrap", "_bootstrap_inner")


def in_exitsafe(thread: ThreadStack) -> bool:
    """Whether a dumped stack runs exitsafe's own code (the teardown, one of its steps)."""
    return any("/exitsafe/" in f.file.replace("\\", "/") for f in thread.frames)


def stderr_before(result: ExitResult, count: int = 5) -> list[str]:
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


def library_of(frames: Sequence[Frame]) -> Optional[str]:
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if "-packages/" in path:
            top = path.split("-packages/", 1)[1].split("/", 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


#: Frames of one stack a diagnosis shows: faulthandler dumps at most 100 per thread, so a
#: dumped stack is shown whole.
WHOLE_STACK = 100


def stack_lines(
    frames: Sequence[Frame], indent: str = "    ", limit: int = WHOLE_STACK
) -> list[str]:
    lines = [f"{indent}{frame_text(f)}" for f in frames[:limit]]
    if len(frames) > limit:
        lines.append(f"{indent}... {len(frames) - limit} more frame(s)")
    return lines


def trace_stack_lines(stack: Optional[str], indent: str = "    ") -> list[str]:
    if not stack:
        return [f"{indent}(no stack recorded)"]
    return [f"{indent}{part}" for part in stack.split(" <- ")]

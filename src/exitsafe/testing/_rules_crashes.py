"""The diagnosis rules of a crash: ``crash-in-teardown`` and ``hang-in-teardown`` (the
teardown cut short in a step), ``native-fatal`` (a native library's own check stopped the
process), ``crash-after-teardown`` and ``crash-at-exit``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ._diagnosis import Diagnosis, make_diagnosis
from ._evidence import (
    crash_fault,
    frame_text,
    in_exitsafe,
    late_threads,
    library_of,
    started_thread,
    stderr_before,
    still_running,
)
from .parsers import NativeFatal

if TYPE_CHECKING:
    from ._result import ExitResult


def teardown_cut(result: ExitResult) -> Optional[Diagnosis]:
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
                own.append(frame_text(frame))
            if own:
                details.append("in " + " <- ".join(own[:4]))
        if result.timed_out:
            return make_diagnosis(
                "hang-in-teardown",
                f"hang inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                details,
            )
        current = next((t for t in fatal.threads if t.current), None) if fatal else None
        if current is not None and started_thread(current) and not in_exitsafe(current):
            return None  # crashed on another thread of the program: not in the step
        if result.signal or result.ntstatus or result.fatal_error is not None:
            return make_diagnosis(
                "crash-in-teardown",
                f"crash inside exitsafe's teardown, in step {nxt}/{of}{handle}",
                details,
            )
    return None


def native_fatal(result: ExitResult) -> Optional[Diagnosis]:
    lines: Sequence[NativeFatal] = result.native_fatal
    if not lines or result.timed_out:
        return None
    first = lines[0]
    # (Qt's "QThread: Destroyed ..." is a qFatal: the process is already ending by its own
    # check, and may crash on the way, the thread printing its traceback meanwhile)
    dying = first.line.startswith("QThread: Destroyed") and result.signal in ("SIGSEGV", "SIGBUS")
    if not dying and (crash_fault(result) or result.signal not in (None, "SIGABRT") or (
        result.ntstatus is not None and not (
            "BUFFER_OVERRUN" in result.ntstatus.name or "ABORT" in result.ntstatus.name
        )
    )):
        return None  # a crash (first): the crash rules say where, and quote the line
    details = [f"{line.source}: {line.line}" for line in lines[1:4]]
    frames = result.fatal_error.top_frames if result.fatal_error is not None else ()
    if frames:
        details.append(f"the Python frame it came from: {frame_text(frames[0])}")
    threads = late_threads(result)
    for thread in threads[:4]:
        where = thread.where()
        details.append(f"alive at exit: {thread.label()}" + (f", in {where}" if where else ""))
    hint = "native-fatal"
    if first.line.startswith("QThread: Destroyed"):
        hint = "native-fatal-qthread"
    how = "aborted" if result.signal == "SIGABRT" or result.fatal_error is not None else (
        f"ended with {result.exit_description}"
    )
    return make_diagnosis(
        "native-fatal",
        f"a native library {how} on its own check ({first.source}): {first.line}",
        details,
        hint,
    )


def _crashed(result: ExitResult) -> bool:
    return bool(result.signal or result.ntstatus) or (
        result.fatal_error is not None and not result.timed_out
    )


def crash_after(result: ExitResult) -> Optional[Diagnosis]:
    if not _crashed(result) or result.timed_out:
        return None
    registries = [r for r in result.registries if r.reason is not None]
    fatal = result.fatal_error
    before = stderr_before(result, 3)
    frames = fatal.top_frames if fatal is not None else ()
    library = library_of(frames)
    findings = result.audit
    details = []
    if before:
        details.append("the program's last stderr lines: " + " | ".join(before))
    if frames:
        details.append(f"top Python frame: {frame_text(frames[0])}")
    if fatal is not None and fatal.extension_modules:
        details.append("extension modules loaded: " + ", ".join(fatal.extension_modules[:8]))
    running = result.audit_running
    if running is not None:
        details.append(f"the native release running when it crashed (audit): {running.describe()}")
    elif findings:
        details.append(f"last native release recorded by the audit: {findings[-1].describe()}")
    # a daemon thread still running at exit may have been inside the same library: its
    # variant of the hint stops the thread before anything is released
    daemons = [t for t in late_threads(result) if t.daemon]
    details += still_running(daemons)
    crash = result.exit_description.split(" (")[0]
    where = f" in {library}" if library else ""
    if registries and all(r.finished for r in registries):
        return make_diagnosis(
            "crash-after-teardown",
            f"crash after exitsafe's teardown finished: native code{where} ran while the"
            f" interpreter finalized ({crash})",
            details,
            "crash-after-teardown-thread" if daemons else None,
        )
    if not registries and (
        (fatal is not None and (fatal.during_finalization or not fatal.top_frames))
        or any(f.function == "__del__" for f in frames)
    ):
        stream = _stream_held(fatal.message) if fatal is not None else None
        cause = (
            f": CPython aborted because {stream}'s lock was held by another thread (a"
            " daemon thread writing to it when the interpreter finalized)"
            if stream is not None else ""
        )
        return make_diagnosis(
            "crash-at-exit",
            f"crash at exit{where} ({crash}), with no exitsafe teardown traced{cause}",
            details,
            "crash-at-exit-thread" if daemons else None,
        )
    return None


#: CPython's fatal error when the finalizing thread cannot take a buffered stream's lock
#: (``_io``'s ``_enter_buffered_busy``): the lock's holder is a daemon thread frozen by the
#: finalization while it wrote.
_STREAM_BUSY = "_enter_buffered_busy: could not acquire lock for "


def _stream_held(message: str) -> Optional[str]:
    """The stream named by CPython's ``_enter_buffered_busy`` fatal error (``<stderr>``),
    or ``None`` for any other message."""
    if not message.startswith(_STREAM_BUSY):
        return None
    rest = message[len(_STREAM_BUSY):]
    start, end = rest.find("name='"), rest.find("'>")
    return rest[start + 6:end] if 0 <= start < end else "a buffered stream"

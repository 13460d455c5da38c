"""The diagnosis rules about threads: ``thread-in-native`` (a daemon thread unwound, or
hung, inside native code while the interpreter finalized), ``thread-crash-at-exit`` (a
crash while a daemon thread was still running, on that thread) and ``thread-exception``
(a thread's uncaught exception)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._diagnosis import Diagnosis, make_diagnosis
from ._evidence import (
    LateThread,
    crash_fault,
    frame_text,
    in_exitsafe,
    is_main_stack,
    late_threads,
    started_thread,
    stderr_before,
)

if TYPE_CHECKING:
    from ._result import ExitResult
    from .parsers import ThreadStack

#: Lines a C++ runtime prints when a thread is unwound through a frame that cannot be
#: unwound (``pthread_exit``'s forced unwind through ``noexcept`` or ``catch (...)``).
_FORCED_UNWIND = (
    "terminate called without an active exception",
    "FATAL: exception not rethrown",
    "terminate called after throwing an instance of 'abi::__forced_unwind'",
)


def thread_in_native(result: ExitResult) -> Optional[Diagnosis]:
    text = result.stderr
    unwound = next((m for m in _FORCED_UNWIND if m in text), None)
    threads = [t for t in late_threads(result) if t.daemon] or late_threads(result)
    fatal = result.fatal_error
    if unwound is None or not (result.signal == "SIGABRT" or fatal is not None):
        return None
    if result.timed_out:
        # The abort was the harness's kill at the timeout, not the C++ runtime's: a line
        # printed earlier is not what ended the run (a hang is diagnosed by its own rules).
        return None
    details = [f"the C++ runtime printed: {unwound!r}"]
    for thread in threads:
        where = thread.where()
        details.append(
            f"thread {thread.name!r} ({thread.ident})"
            + (f", last Python frame{'s' if ' <- ' in where else ''}: {where}" if where else "")
        )
    main = fatal.current_thread if fatal is not None else None
    if main is not None and main.frames:
        details.append(
            f"meanwhile the finalizing thread was in {frame_text(main.frames[0])}, which"
            " let the thread run again (a native call that releases the GIL)"
        )
    if not threads:
        details.append(
            "run it with exitsafe run (or import exitsafe with EXITSAFE_TRACE=1) to name"
            " the thread: the start-up hook lists the threads alive at exit"
        )
    name = f" {threads[0].name!r}" if len(threads) == 1 else ""
    return make_diagnosis(
        "thread-in-native",
        f"a daemon thread{name} was unwound inside native code while the interpreter"
        " finalized (C++ forced unwind: abort)",
        details,
    )


def thread_hung_in_native(result: ExitResult) -> Optional[Diagnosis]:
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
        or any(is_main_stack(t) for t in fatal.threads)
        or not (result.registries_finished or threads)
    ):
        return None
    details = []
    for stack in others:
        known: Optional[str] = stack.name or next(
            (t.name for t in threads if t.ident == (stack.thread_id or "").lower()), None
        )
        label = f"{known!r} ({stack.thread_id})" if known else str(stack.thread_id)
        details.append(f"thread {label}, last Python frame: {frame_text(stack.frames[0])}")
    return make_diagnosis(
        "thread-in-native",
        "the interpreter hung while finalizing, with a thread still inside native"
        " code (since Python 3.14 such a thread hangs instead of being unwound)",
        details,
    )


def thread_exception(result: ExitResult) -> Optional[Diagnosis]:
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
    return make_diagnosis(
        "thread-exception",
        f"thread {name!r} ended with an uncaught exception ({exc}{message})",
        details,
    )


#: The signals of a crash (an abort has rules of its own first: a forced unwind, a
#: library's check; a bare one counts as a crash, see `thread_crash_at_exit`).
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")


def thread_crash_at_exit(result: ExitResult) -> Optional[Diagnosis]:
    """A crash at exit while daemon threads were still running, and not on a thread the
    fatal error's dump shows in Python code of its own: the crash is a daemon thread's
    native code using what the exit freed (an ``atexit`` close, a finalizer, exitsafe's
    teardown without the thread declared).  A bare abort counts as a crash (no library
    message, no fatal error of the interpreter's own: FFmpeg's demuxer aborting on a
    container closed under it, as PyAV's does on CPython 3.12), and so does a crash
    faulthandler caught before something else ended the process (`crash_fault`)."""
    fatal = result.fatal_error
    bare_abort = (
        result.signal == "SIGABRT"
        and not result.native_fatal
        and (fatal is None or fatal.message.strip() == "Aborted")
    )
    faulted = crash_fault(result)
    crashed = bare_abort or faulted or result.signal in _CRASH_SIGNALS or (
        result.ntstatus is not None and "ACCESS_VIOLATION" in result.ntstatus.name
    )
    if not crashed or result.timed_out:
        return None
    daemons = [t for t in late_threads(result) if t.daemon]
    current = next((t for t in fatal.threads if t.current), None) if fatal is not None else None
    crashing = daemons
    if current is not None:
        ident = (current.thread_id or "").lower()
        listed = [t for t in daemons if t.ident == ident]
        if not listed and not (started_thread(current) and not in_exitsafe(current)):
            if daemons and current.frames and not is_main_stack(current):
                return _crash_in_exit_handler(result, current, daemons)
            return None  # crashed on a thread of its own (the main one): other rules say where
        # Where it crashed is the dump's stack (the list of threads is from the exit's start);
        # a thread of the program's not listed (no start-up hook, no trace) is named by it.
        dumped = " <- ".join(
            f"{f.file}:{'?' if f.line is None else f.line} in {f.function}"
            for f in current.frames
        )
        name = listed[0].name if listed else (current.name or ident)
        crashing = [LateThread(ident, name, True, dumped.split(" <- ")[0] or None, None, dumped)]
    if not crashing:
        return None
    details = []
    for thread in crashing[:4]:
        frames = (thread.stack or thread.frame or "?").split(" <- ")
        when = "when it crashed" if current is not None else "at exit"
        details.append(f"{thread.label()} {when}, whole stack: " + " <- ".join(frames[:8]))
    before = stderr_before(result, 3)
    if before:
        details.append("the program's last stderr lines: " + " | ".join(before))
    if fatal is not None and fatal.extension_modules:
        details.append("extension modules loaded: " + ", ".join(fatal.extension_modules[:8]))
    crash = result.exit_description.split(" (")[0]
    if faulted and fatal is not None and result.signal not in _CRASH_SIGNALS:
        crash = f"{fatal.message.strip()}, then {crash}"
        details += [f"then {line.source}: {line.line}" for line in result.native_fatal[:2]]
    name = f" {crashing[0].name!r}" if len(crashing) == 1 else "s"
    place = crashing[0].where() if len(crashing) == 1 else None
    where = f", in {place}" if place else ""
    on = "on that thread" if current is not None else "on a thread with no Python frame dumped"
    return make_diagnosis(
        "thread-crash-at-exit",
        f"crash at exit ({crash}) {on} while the daemon thread{name} was still running"
        f"{where}: its native code used what the exit freed",
        details,
    )


def _crash_in_exit_handler(
    result: ExitResult, main: ThreadStack, daemons: list[LateThread]
) -> Diagnosis:
    """The main thread crashed in an exit handler (its stack has no frame of the program's
    own body any more: an ``atexit`` callback) while daemon threads still ran: the handler
    released what one of them was using, and the crash came on the releasing side (a
    close freeing a structure the thread's native call was writing)."""
    handler = frame_text(main.frames[-1])  # (the outermost frame: the handler called)
    stack = " <- ".join(frame_text(f) for f in main.frames[:8])
    details = [f"the main thread crashed in the exit handler {handler} (no frame of the"
               f" program's body is left on its stack), whole stack: {stack}"]
    for thread in daemons[:4]:
        frames = (thread.stack or thread.frame or "?").split(" <- ")
        details.append(f"{thread.label()} at exit, whole stack: " + " <- ".join(frames[:8]))
    before = stderr_before(result, 3)
    if before:
        details.append("the program's last stderr lines: " + " | ".join(before))
    crash = result.exit_description.split(" (")[0]
    name = f" {daemons[0].name!r}" if len(daemons) == 1 else "s"
    return make_diagnosis(
        "thread-crash-at-exit",
        f"crash at exit ({crash}) in an exit handler, {handler}, while the daemon thread{name}"
        " was still running: the handler released what the thread was using",
        details,
    )

"""The diagnosis rules of a run that timed out: where the main thread waited, from
faulthandler's dump and the trace.  ``hang-before-teardown``, ``deadlock-at-exit``,
``hang-in-finalizer``, ``hang-in-atexit``, ``hang-in-main``, and ``timeout`` when nothing
tells where."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ._diagnosis import Diagnosis, make_diagnosis
from ._evidence import (
    bottom_user_frame,
    file_name,
    frame_text,
    late_threads,
    library_of,
    main_stack,
    stack_lines,
    still_running,
    trace_stack_lines,
)
from .parsers import Frame, ThreadStack

if TYPE_CHECKING:
    from ._records import AuditFinding
    from ._result import ExitResult

#: Frames that say a thread was parked by exitsafe's borrow gate.
_PARK_FUNCTIONS = {"park", "_park"}


def hang_before_teardown(result: ExitResult) -> Optional[Diagnosis]:
    fatal = result.fatal_error
    if not result.timed_out or fatal is None:
        return None
    # The thread that joins: any of the dumped threads (a signal sent to the process may
    # be taken by another thread than the main one, which is then not the "current" one).
    main = None
    in_shutdown = in_executor = False
    for thread in fatal.threads:
        functions = {(f.function, file_name(f)) for f in thread.frames}
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
        target = bottom_user_frame(thread)
        files = {file_name(f) for f in thread.frames}
        kind = "an executor worker" if "thread.py" in files and any(
            f.function == "_worker" for f in thread.frames
        ) else "a non-daemon thread"
        where = f" running {frame_text(target)}" if target is not None else ""
        listed = next((t for t in late_threads(result)
                       if t.ident == (thread.thread_id or "").lower()), None)
        if listed is not None and target is None and (listed.task or listed.target):
            # (an executor worker's target is concurrent.futures' _worker: its task says more)
            where = f" running {listed.task or listed.target}"
        now = ""
        if target is None or thread.frames[0] != target:
            now = f", now in {frame_text(thread.frames[0])}"
        known = thread.name or (listed.name if listed is not None else None)  # (3.14+ dumps)
        name = f"{known!r} ({thread.thread_id})" if known else thread.thread_id
        details.append(f"{kind} {name}{where}{now}")
    what = "concurrent.futures joining its workers" if in_executor else (
        "threading._shutdown joining the non-daemon threads"
    )
    return make_diagnosis(
        "hang-before-teardown",
        f"hang before exitsafe's teardown: the interpreter waited forever in {what}",
        details,
    )


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
            main = main_stack(fatal)
        self.main = main
        self.frames: Sequence[Frame] = () if main is None else main.frames
        outer = self.frames[-1] if self.frames else None
        self.outer = outer
        self.in_main_code = outer is not None and (
            outer.function == "<module>"
            or (outer.function == "_run_module_as_main" and file_name(outer) == "runpy.py")
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
        return [head, *stack_lines(self.frames)]


def _finalizer_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    for frame in frames:
        if frame.function == "__del__":
            return frame
        if file_name(frame) == "weakref.py" and frame.function in ("__call__", "_exitfunc"):
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
        details.extend(trace_stack_lines(thread.stack))
        if dumped is not None and dumped.frames:
            details.append("  and when the run was killed:")
            details.extend(stack_lines(dumped.frames))
    where = "a finalizer" if stuck is not None or hang.finalizing else "an exit handler"
    if not hang.frames:
        where = "native code (no Python frame)"
    holder = holders[0]
    return make_diagnosis(
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
        details.append("the audit saw no release begin: it watches ffi.gc pointers,"
                       " weakref.finalize, known bindings and objects with a __del__ that"
                       " hold a native pointer, from exitsafe's teardown on; this one is"
                       " none of them, or was released before")
    elif running is None and frame is not None:
        details.append("run with --audit to name the object's type and where it was made")
    daemons = [t for t in late_threads(result) if t.daemon]
    details += still_running(daemons)
    return make_diagnosis(
        "hang-in-finalizer", headline, details, "hang-in-finalizer-thread" if daemons else None
    )


def _atexit(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if hang.in_main_code or hang.finalizing or hang.main is None:
        return None
    details = hang.main_lines()
    outer = hang.outer
    if outer is None:
        if not any(s.event in ("thread", "audit-begin", "teardown-end") for s in result.trace):
            return None  # nothing tells that the exit had begun
        return make_diagnosis(
            "hang-in-atexit",
            "hang in an exit handler with no Python frame (a C function registered with"
            " atexit), before the interpreter finalized",
            details,
        )
    library = library_of([outer])
    where = f" of {library}" if library else ""
    return make_diagnosis(
        "hang-in-atexit",
        f"hang in an atexit handler{where}: {outer.function} ({outer.file}:{outer.line})"
        f" never returned, now in {frame_text(hang.frames[0])}",
        details,
    )


def _in_main(result: ExitResult, hang: _Hang) -> Optional[Diagnosis]:
    if not hang.in_main_code:
        return None
    top = frame_text(hang.frames[0])
    return make_diagnosis(
        "hang-in-main",
        f"the program was still running its main code at the timeout, in {top}: not an"
        " exit hang",
        hang.main_lines(),
    )


def _hang_state(result: ExitResult) -> Optional[_Hang]:
    if not result.timed_out:
        return None
    if result.returncode == 0 and result.fatal_error is None:
        return None  # exited; only its children held the pipes (see _rules_exit)
    return _Hang(result)


def hang_deadlock(result: ExitResult) -> Optional[Diagnosis]:
    hang = _hang_state(result)
    return None if hang is None else _deadlock(result, hang)


def hang_at_exit(result: ExitResult) -> Optional[Diagnosis]:
    hang = _hang_state(result)
    if hang is None:
        return None
    for rule in (_finalizer, _atexit, _in_main):
        found = rule(result, hang)
        if found is not None:
            return found
    return None


def timeout(result: ExitResult) -> Optional[Diagnosis]:
    if not result.timed_out:
        return None
    return make_diagnosis(
        "timeout",
        "timed out with no Python stack to tell where",
    )

"""The diagnosis rules of what else went wrong at exit: ``child-process`` (a process of
the run crashed or hung), ``lost-output`` (a check failed after a clean exit),
``atexit-error`` and ``unraisable-at-exit`` (exceptions at exit), and ``audit`` (the
audit's findings)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._diagnosis import Diagnosis, make_diagnosis
from ._evidence import frame_text, late_threads, main_stack, still_running

if TYPE_CHECKING:
    from ._result import ExitResult

_WAIT_FUNCTIONS = {"waitpid", "wait", "_wait", "join", "poll", "_try_wait", "communicate"}


def child_processes(result: ExitResult) -> Optional[Diagnosis]:
    bad = [c for c in result.children if c.failed]
    if not bad:
        return None
    details = []
    for child in bad:
        fatal = child.fatal_error
        top = ""
        if fatal is not None and fatal.top_frames:
            top = f", in {frame_text(fatal.top_frames[0])}"
        details.append(child.describe() + top)
    first = bad[0]
    waited = ""
    main = main_stack(result.fatal_error) if result.fatal_error is not None else None
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
    return make_diagnosis(
        "child-process", headline, details, None if first.forked else "child-process-exec"
    )


def lost_output(result: ExitResult) -> Optional[Diagnosis]:
    failed = [c for c in result.checks if not c.passed]
    exited_well = result.returncode == 0 and not result.timed_out and result.fatal_error is None
    if not (failed and exited_well):
        return None
    check = failed[0]
    details = [f"check {c.command_text!r}: {c.describe_status()}" for c in failed[1:]]
    daemons = [t for t in late_threads(result) if t.daemon]
    details += still_running(daemons)
    return make_diagnosis(
        "lost-output",
        f"the program exited 0 but the check {check.command_text!r} failed"
        f" ({check.describe_status()}): output lost at exit?",
        details,
        "lost-output-thread" if daemons else None,
    )


def unraisable(result: ExitResult) -> Optional[Diagnosis]:
    reports = [r for r in result.unraisable if "thread started by" not in r.context]
    if not reports:
        return None
    daemons = [t for t in late_threads(result) if t.daemon]
    atexit = [r for r in reports if "atexit" in r.context]
    if atexit:
        first = atexit[0]
        where = first.object or "an atexit callback"
        return make_diagnosis(
            "atexit-error",
            f"an atexit callback raised at exit ({first.exc_type or 'an exception'}"
            f"{': ' + first.message if first.message else ''} in {where})",
            [r.describe() for r in reports if r is not first][:3] + still_running(daemons),
            "atexit-error-thread" if daemons else None,
        )
    first = reports[0]
    what = "a __del__ raised" if "__del__" in first.where else "a finalizer raised"
    return make_diagnosis(
        "unraisable-at-exit",
        f"{what} while the interpreter shut down ({first.describe()})",
        [r.describe() for r in reports[1:4]] + still_running(daemons),
        "unraisable-at-exit-thread" if daemons else None,
    )


def audit_findings(result: ExitResult) -> Optional[Diagnosis]:
    findings = result.audit
    if not findings:
        return None
    count = sum(f.count for f in findings)
    return make_diagnosis(
        "audit",
        f"{count} native release(s) ran after exitsafe's teardown, during finalization:"
        " latent exit hazards",
    )

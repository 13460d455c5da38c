"""Naming the cause of a bad exit: `diagnose`, which tries the rules in order.

The classification reads only what a run leaves behind: the exit status, faulthandler's
dumps (of the program and, through the start-up hook, of its child processes), the
program's stderr (uncaught exceptions of threads, "Exception ignored" blocks, the lines a
native library prints when it aborts), exitsafe's trace lines (``EXITSAFE_TRACE=1``:
teardown steps, the threads alive at exit with their stacks and the locks they hold, the
end of the exit hooks, the audit) and the checks.

The rules are in one module per family of kinds (`_rules_threads`, `_rules_hangs`,
`_rules_crashes`, `_rules_exit`); what each kind's fix is, in one table (`HINTS` of
`_hints`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._diagnosis import Diagnosis
from ._rules_crashes import crash_after, native_fatal, teardown_cut
from ._rules_exit import audit_findings, child_processes, lost_output, unraisable
from ._rules_hangs import hang_at_exit, hang_before_teardown, hang_deadlock, timeout
from ._rules_threads import (
    thread_crash_at_exit,
    thread_exception,
    thread_hung_in_native,
    thread_in_native,
)

if TYPE_CHECKING:
    from ._result import ExitResult

#: The rules, most specific first: the first that recognises the run names its cause.
RULES = (
    thread_in_native, child_processes, teardown_cut, hang_before_teardown, hang_deadlock,
    thread_hung_in_native, hang_at_exit, native_fatal, thread_crash_at_exit, crash_after,
    lost_output,
    thread_exception, unraisable, audit_findings, timeout,
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

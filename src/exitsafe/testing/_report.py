"""The text of a result: the summary line, the report a person acts on (the cause, where
it crashed or hung, the exceptions, the child processes, the checks, exitsafe's teardown,
the audit, the hint and the program's last output lines), and the stable failure label."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional, Sequence

from ._hints import UNRECOGNISED_DOC, docs_url
from ._records import quote_argv
from .parsers import FatalError, untangle

if TYPE_CHECKING:
    from ._result import ExitResult, ExitResults

#: How many frames of the crashing thread, and teardown steps before a crash, reports show.
TOP_FRAMES = 8
LAST_STEPS = 5
#: How many steps of a finished teardown reports list.
SHOWN_STEPS = 10
_STDERR_TAIL = 15
#: How much of the program's own output a report of a failed run shows: the last lines of
#: stdout and of stderr, each line cut at a width (the whole output is in `stdout` and
#: `stderr`, and `exitsafe run --show-output` prints it).
OUTPUT_TAIL_LINES = 20
OUTPUT_LINE_WIDTH = 400
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
#: Lines of the program's own stderr shown before a fatal error.
STDERR_BEFORE_FATAL = 5


def failure_kind(result: ExitResult) -> Optional[str]:
    """The label of [`ExitResult.failure_kind`][exitsafe.testing.ExitResult.failure_kind]."""
    if result.clean:
        return None
    parts: list[str] = []
    if result.timed_out:
        diagnosis = result.diagnosis
        parts.append("timeout" if diagnosis is None or diagnosis.kind == "timeout"
                     else f"timeout ({diagnosis.kind})")
    elif result.signal is not None:
        parts.append(result.signal)
    elif result.ntstatus is not None:
        parts.append(result.ntstatus.name)
    elif result.returncode != 0:
        part = f"exit status {result.returncode}"
        if result.uncaught is not None and result.uncaught.exc_type:
            part += f": {result.uncaught.exc_type}"
        parts.append(part)
    if result.fatal_error is not None and not (
        result.signal or result.ntstatus or dumped_on_timeout(result)  # (the kill's dump)
    ):
        parts.append(f"fatal error {_ADDRESS.sub('0x?', result.fatal_error.message)!r}")
    seen: set[str] = set()
    for report in result.unraisable:
        label = f"unraisable {report.exc_type or 'exception'} in {report.where}"
        if label not in seen:
            seen.add(label)
            parts.append(label)
    for report in result.thread_exceptions:
        label = f"thread exception {report.exc_type or 'exception'}"
        if label not in seen:
            seen.add(label)
            parts.append(label)
    for line in result.native_fatal[:1]:
        parts.append(f"native {line.source}: {_ADDRESS.sub('0x?', line.line)[:120]}")
    for check in result.checks:
        if not check.passed:
            parts.append(f"check failed: {check.command_text}")
    if result.audit:
        parts.append("audit findings")
    return "; ".join(parts)


def summary(result: ExitResult) -> str:
    """The line of [`ExitResult.summary`][exitsafe.testing.ExitResult.summary]."""
    if result.clean:
        return f"CLEAN: exit status 0 in {result.duration:.2f} s"
    parts: list[str] = []
    diagnosis = result.diagnosis
    head = "NOT CLEAN"
    if diagnosis is not None:
        head = f"NOT CLEAN [{diagnosis.kind}]"
        if diagnosis.specific:
            parts.append(diagnosis.headline)
    if result.timed_out:
        parts.append(
            f"timed out after {result.timeout:g} s, process group killed"
            if result.timeout is not None
            else "timed out, process group killed"
        )
    if result.returncode != 0 and not result.timed_out:
        parts.append(result.exit_description)
    if result.fatal_error is not None and not dumped_on_timeout(result):
        prefix = "Windows fatal exception" if result.fatal_error.windows else "Fatal Python error"
        parts.append(f"{prefix}: {result.fatal_error.message}")
    if result.uncaught is not None and result.returncode != 0 and not result.timed_out:
        parts.append(f"uncaught {result.uncaught.exc_type}")
    if result.thread_exceptions:
        count = len(result.thread_exceptions)
        parts.append(f"{count} uncaught exception{'s' if count > 1 else ''} in threads")
    if result.unraisable:
        count = len(result.unraisable)
        parts.append(f"{count} unraisable exception{'s' if count > 1 else ''} at exit")
    if result.native_fatal and (
        diagnosis is None or diagnosis.kind not in ("native-fatal", "thread-in-native")
    ):
        parts.append(f"native message ({result.native_fatal[0].source}):"
                     f" {result.native_fatal[0].line[:160]}")
    failed = [c for c in result.checks if not c.passed]
    if failed:
        parts.append(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed")
    if result.audit:
        count = sum(f.count for f in result.audit)
        parts.append(f"{count} latent exit hazard(s) found by the audit")
    return f"{head}: " + "; ".join(parts)


def report(result: ExitResult, output: bool = True) -> str:
    """The text of [`ExitResult.report`][exitsafe.testing.ExitResult.report]."""
    lines = [result.summary(), f"  command: {quote_argv(result.args)}"]
    lines.append(f"  exit: {_exit_line(result)}")
    diagnosis = result.diagnosis
    if diagnosis is not None:
        if not diagnosis.specific:  # a specific cause already leads the summary line
            lines.append(f"cause: {diagnosis.headline}")
        lines.extend(_indent(list(diagnosis.details), "  "))
    lines.extend(_fatal_error_lines(result))
    lines.extend(_exception_lines(result))
    lines.extend(_children_lines(result))
    lines.extend(_check_lines(result))
    lines.extend(_teardown_lines(result))
    lines.extend(_audit_lines(result))
    hint = diagnosis.hint if diagnosis is not None else _hint(result)
    if hint:
        lines.append(f"hint: {hint}")
    if diagnosis is not None and diagnosis.url:
        lines.append(f"  see: {diagnosis.url}")
    elif diagnosis is None and not result.clean:
        # (no rule named the cause: the kinds the diagnosis knows, to compare with)
        lines.append(f"  see: {docs_url(UNRECOGNISED_DOC)}")
    if output and not result.clean:
        lines.extend(_output_tails(result))
    return "\n".join(lines)


def _fatal_error_lines(result: ExitResult) -> list[str]:
    """A native library's messages, and the fatal error with its stacks (and the
    program's last stderr lines before it)."""
    lines: list[str] = []
    if result.native_fatal:
        lines.append("native library messages:")
        lines.extend(f"  {n.line}" for n in result.native_fatal[:5])
    if result.fatal_error is not None:
        before = stderr_before_fatal(result)
        if before:
            lines.append("the program's last stderr lines before the fatal error:")
            lines.extend(_indent(before, "  "))
        title = None
        if dumped_on_timeout(result):
            title = "Where it hung (faulthandler's dump on the SIGABRT sent at the timeout):"
        lines.extend(_fatal_lines(result.fatal_error, title))
    return lines


def _exception_lines(result: ExitResult) -> list[str]:
    """The uncaught exception, the exceptions of threads and the unraisable ones."""
    lines: list[str] = []
    if result.uncaught is not None and (result.returncode != 0 or result.timed_out):
        lines.append(f"Uncaught exception: {result.uncaught.describe()}")
        lines.extend(_indent(_last_traceback_lines(result.uncaught.traceback), "  "))
    if result.thread_exceptions:
        lines.append(f"Uncaught exceptions in threads ({len(result.thread_exceptions)}):")
        for number, report in enumerate(result.thread_exceptions, 1):
            lines.append(f"  {number}. thread {report.object!r}: {report.describe()}")
            lines.extend(_indent(_last_traceback_lines(report.traceback), "     "))
    if result.unraisable:
        lines.append(f"Unraisable exceptions at exit ({len(result.unraisable)}):")
        for number, report in enumerate(result.unraisable, 1):
            lines.append(f"  {number}. {report.describe()}")
            lines.extend(_indent(_last_traceback_lines(report.traceback), "     "))
    return lines


def _children_lines(result: ExitResult) -> list[str]:
    """The child processes that crashed or hung."""
    lines: list[str] = []
    shown_children = [c for c in result.children if c.failed]
    if shown_children:
        lines.append(f"Child processes ({len(shown_children)} of {len(result.children)}):")
        for child in shown_children:
            lines.append(f"  {child.describe()}")
            if child.argv:
                lines.append(f"    command: {quote_argv(child.argv)}")
            if child.fatal_error is not None:
                title = "its stacks at the timeout:" if child.state == "hung" else None
                lines.extend(_indent(_fatal_lines(child.fatal_error, title)[1:], "  "))
    return lines


def _check_lines(result: ExitResult) -> list[str]:
    """Each check, and the output of a failed one."""
    lines: list[str] = []
    for check in result.checks:
        status = "passed" if check.passed else f"FAILED ({check.describe_status()})"
        lines.append(f"check {check.command_text!r}: {status}")
        if not check.passed:
            output_lines = [line for line in check.output.splitlines() if line.strip()]
            lines.extend(_indent(output_lines[-_STDERR_TAIL:], "  "))
    return lines


def _output_tails(result: ExitResult) -> list[str]:
    """The last lines of the program's own stdout and stderr: the trace lines and the
    blocks decoded above left out, each line cut at `OUTPUT_LINE_WIDTH`."""
    lines: list[str] = []
    decoded: set[str] = set()
    for block in (
        [result.fatal_error] if result.fatal_error is not None else []
    ):
        decoded.update(block.text.splitlines())
    for report in (*result.unraisable, *result.thread_exceptions,
                   *([result.uncaught] if result.uncaught is not None else [])):
        decoded.update(report.text.splitlines())
    stderr = untangle(result.stderr)
    for name, text, skip in (("stdout", result.stdout, set()), ("stderr", stderr, decoded)):
        own = [
            line for line in text.splitlines()
            if line.strip() and not line.startswith("exitsafe: ") and line not in skip
        ]
        if not own:
            continue
        tail = own[-OUTPUT_TAIL_LINES:]
        shown = f"last {len(tail)} of {len(own)} lines" if len(own) > len(tail) else (
            f"{len(own)} line{'s' if len(own) > 1 else ''}")
        left = ", exitsafe trace and decoded blocks left out" if name == "stderr" else ""
        lines.append(f"captured {name} ({shown}{left}):")
        for line in tail:
            if len(line) > OUTPUT_LINE_WIDTH:
                line = line[: OUTPUT_LINE_WIDTH - 3] + "..."
            lines.append(f"  {line}")
    return lines


def stderr_before_fatal(result: ExitResult) -> list[str]:
    """The program's own last stderr lines right before the fatal error block (a
    native library's ``FATAL: ...`` message, a C++ ``terminate called ...``)."""
    lines = untangle(result.stderr).splitlines()
    end = next(
        (
            i
            for i, line in enumerate(lines)
            if line.startswith(("Fatal Python error", "Windows fatal exception"))
        ),
        len(lines),
    )
    own = [line for line in lines[:end] if line.strip() and not line.startswith("exitsafe: ")]
    return own[-STDERR_BEFORE_FATAL:]


def _audit_lines(result: ExitResult) -> list[str]:
    findings = result.audit
    if not result.audited and not findings:
        return []
    begun = [s for s in result.trace if s.event == "audit-begin"]
    ended = not result.timed_out and not (result.signal or result.ntstatus)
    if not findings:
        if not begun and result.timed_out:
            return ["audit: the audit window never opened: the process hung before its"
                    " exit hooks had all run (the window opens after them)"]
        if not begun:
            return ["audit: no audit window was opened (the program is not Python, or"
                    " exited without running its exit hooks)"]
        if not ended:
            return ["audit: no native release began after exitsafe's teardown before the"
                    " process ended"]
        return ["audit: no native release ran after exitsafe's teardown"]
    after = begun[0].get("after") if begun else None
    when = "the exit teardown" if after == "teardown" else "the exit hooks"
    total = sum(f.count for f in findings)
    lines = [
        f"audit: {total} native release(s) ran after {when}, while the"
        " interpreter finalized (latent exit hazards; this order may crash elsewhere):"
    ]
    running = result.audit_running
    for number, finding in enumerate(findings, 1):
        mark = ""
        if running is not None and finding.group == running.group and not ended:
            mark = " [RUNNING when the process ended]" if finding.what != "ffi.gc" else (
                " [the last release that began before the process ended]")
        lines.append(f"  {number}. {finding.describe()}{mark}")
        if finding.stack:
            lines.append(f"     created: {finding.stack}")
        if finding.holds:
            lines.append(f"     holds: {finding.holds}")
        if finding.via:
            lines.append(f"     finalizer: {finding.via}")
        lines.append(f"     suggest: {finding.suggest}")
        if finding.alternative:
            lines.append(f"     or, for an object you do not own: {finding.alternative}")
    return lines


def dumped_on_timeout(result: ExitResult) -> bool:
    """Whether the fatal error is the stack dump requested when the run timed out."""
    fatal = result.fatal_error
    return result.timed_out and fatal is not None and fatal.message == "Aborted"


def _exit_line(result: ExitResult) -> str:
    when = f"after {result.duration:.2f} s"
    if result.timed_out and result.returncode == 0:
        timeout = "" if result.timeout is None else f" after {result.timeout:g} s"
        return (
            f"exit status 0 {when}, but the run timed out{timeout}: processes it"
            " started kept its output open; the process group was killed"
        )
    if result.timed_out:
        timeout = "" if result.timeout is None else f" after {result.timeout:g} s"
        how = "SIGABRT for its stacks, then SIGKILL" if dumped_on_timeout(result) else "SIGKILL"
        return (
            f"timed out{timeout}: exitsafe run stopped it ({how} to the process group);"
            " that signal is exitsafe's, not the program's"
        )
    if result.signal is not None:
        return f"killed by {result.exit_description} {when}"
    return f"{result.exit_description} {when}"


def _teardown_lines(result: ExitResult) -> list[str]:
    registries = result.registries
    if not registries:
        return []
    lines = ["exitsafe teardown:"]
    for registry in registries:
        lines.append(f"  {registry.describe()}")
        if registry.outcomes:
            ledger = ", ".join(f"{k} {v}" for k, v in registry.outcomes.items())
            lines.append(f"    ledger: {ledger}")
        crashed = not registry.finished and registry.reason is not None
        if not crashed:
            for step in registry.steps[:SHOWN_STEPS]:
                mark = "FAILED " if step.failed else ""
                lines.append(f"    {mark}{step.describe()}")
            if len(registry.steps) > SHOWN_STEPS:
                failed = [s for s in registry.steps[SHOWN_STEPS:] if s.failed]
                more = len(registry.steps) - SHOWN_STEPS
                lines.append(f"    ... {more} more step(s), {len(failed)} of them failed")
                lines.extend(f"    FAILED {s.describe()}" for s in failed[:LAST_STEPS])
        elif not result.clean:
            shown = registry.steps[-LAST_STEPS:]
            if shown:
                lines.append("    last steps before the end of the trace:")
                lines.extend(f"      {step.describe()}" for step in shown)
            nxt = len(registry.steps) + 1
            of = "?" if registry.planned is None else str(registry.planned)
            lines.append(
                f"    the process ended during step {nxt}/{of} (a step is traced when it"
                " ends) or right after the steps above"
            )
    return lines


def _hint(result: ExitResult) -> Optional[str]:
    if result.clean:
        return None
    finalizing = result.fatal_error is not None and result.fatal_error.during_finalization
    if result.timed_out and result.returncode == 0 and result.fatal_error is None:
        return (
            "the main process exited 0, but processes it started kept its stdout or"
            " stderr open past the timeout; they were killed with its process group."
        )
    if (result.signal or result.ntstatus or finalizing) and not result.teardown:
        return (
            "native code crashed and exitsafe's trace is empty: the program does not use"
            " exitsafe, or the crash came before its teardown. Declaring the handles and"
            " their dependencies with exitsafe releases them in a safe order at exit."
        )
    return None


def _indent(lines: Sequence[str], prefix: str) -> list[str]:
    return [prefix + line for line in lines]


def _last_traceback_lines(traceback: str, frames: int = 3) -> list[str]:
    """The last ``frames`` frames of a traceback (each ``File`` line and its source line)."""
    lines = traceback.splitlines()[1:]
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
    if not starts:
        return [line.strip() for line in lines]
    kept = lines[starts[-frames] if len(starts) >= frames else starts[0] :]
    out = [line.strip() for line in kept if line.strip() and set(line.strip()) - set("^~ ")]
    if len(starts) > frames:
        out.insert(0, f"... {len(starts) - frames} earlier frame(s)")
    return out


def _fatal_lines(fatal: FatalError, title: Optional[str] = None) -> list[str]:
    prefix = "Windows fatal exception" if fatal.windows else "Fatal Python error"
    lines = [title or f"{prefix}: {fatal.message}"]
    if fatal.runtime_state:
        lines.append(f"  Python runtime state: {fatal.runtime_state}")
    current = fatal.current_thread
    if current is None:
        lines.append("  (no thread stacks were printed)")
        return lines
    label = "crashing thread" if current.current and title is None else "thread"
    ident = current.thread_id or "(stack)"
    name = f" [{current.name}]" if current.name else ""
    lines.append(f"  {label} {ident}{name}, most recent call first:")
    for frame in current.frames[:TOP_FRAMES]:
        lines.append(f"    {frame}")
    if len(current.frames) > TOP_FRAMES:
        lines.append(f"    ... {len(current.frames) - TOP_FRAMES} more frame(s)")
    if not current.frames:
        notes = "; ".join(current.notes) or "no Python frame"
        lines.append(f"    ({notes})")
    others = [t for t in fatal.threads if t is not current]
    if others:
        lines.append(f"  other threads ({len(others)}), most recent call first:")
        for thread in others:
            name = f" [{thread.name}]" if thread.name else ""
            if not thread.frames:
                notes = "; ".join(thread.notes) or "no Python frame"
                lines.append(f"    {thread.thread_id}{name}: ({notes})")
                continue
            lines.append(f"    {thread.thread_id}{name}:")
            for frame in thread.frames[:TOP_FRAMES]:
                lines.append(f"      {frame}")
            if len(thread.frames) > TOP_FRAMES:
                lines.append(f"      ... {len(thread.frames) - TOP_FRAMES} more frame(s)")
    return lines


def results_summary(results: ExitResults) -> str:
    """The line of [`ExitResults.summary`][exitsafe.testing.ExitResults.summary]."""
    total = len(results)
    if results.clean:
        return f"CLEAN: {total} of {total} runs clean in {results.duration:.2f} s"
    failed = len(results.failures)
    kinds = ", ".join(f"{kind} x{count}" for kind, count in results.kinds.items())
    # The diagnosed kinds in brackets, as a single run's summary shows its own.
    diagnosed: dict[str, int] = {}
    for result in results.failures:
        diagnosis = result.diagnosis
        if diagnosis is not None:
            diagnosed[diagnosis.kind] = diagnosed.get(diagnosis.kind, 0) + 1
    head = "NOT CLEAN"
    if diagnosed:
        head += " [" + ", ".join(
            kind if count == failed else f"{kind} x{count}" for kind, count in diagnosed.items()
        ) + "]"
    return f"{head}: {failed} of {total} runs failed ({results.failure_rate:.0%}): {kinds}"


def results_report(results: ExitResults) -> str:
    """The text of [`ExitResults.report`][exitsafe.testing.ExitResults.report]."""
    lines = [results.summary()]
    if results.clean:
        return "\n".join(lines)
    first: dict[str, tuple[int, ExitResult]] = {}
    runs: dict[str, list[int]] = {}
    for number, result in enumerate(results, 1):
        if result.clean:
            continue
        kind = result.failure_kind or "?"
        first.setdefault(kind, (number, result))
        runs.setdefault(kind, []).append(number)
    lines.append(f"failure kinds ({len(first)}):")
    for kind, numbers in runs.items():
        shown = ", ".join(str(n) for n in numbers[:10]) + (", ..." if len(numbers) > 10 else "")
        lines.append(f"  {kind}: {len(numbers)} run(s) (run {shown})")
    for kind, (number, result) in first.items():
        lines.append("")
        lines.append(f"--- run {number} of {len(results)} ({kind}) ---")
        lines.append(result.report())
    return "\n".join(lines)


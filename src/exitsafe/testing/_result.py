"""The structured result of running a program: [`ExitResult`][exitsafe.testing.ExitResult] and
[`ExitResults`][exitsafe.testing.ExitResults]."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence, Union, overload

from ._children import ChildProcess
from ._decode import NtStatus, decode_ntstatus, decode_signal, describe_exit
from ._diagnose import Diagnosis, diagnose
from .parsers import (
    ExceptionReport,
    FatalError,
    NativeFatal,
    parse_fatal_errors,
    parse_native_fatal,
    parse_thread_exceptions,
    parse_uncaught,
    parse_unraisable,
    untangle,
)
from .trace import RegistryTeardown, TeardownStep, parse_trace, summarize

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

#: The version of the JSON that `ExitResult.to_dict` gives (see docs/testing.md).
JSON_SCHEMA_VERSION = 3
#: Trace events that are not part of a teardown: the threads alive at exit, the end of
#: the exit hooks and the audit.
DIAGNOSTIC_EVENTS = frozenset(
    {"thread", "exit-phase", "audit-begin", "audit-release", "audit-repeat"}
)
#: Lines of the program's own stderr shown before a fatal error.
STDERR_BEFORE_FATAL = 5


class ExitNotClean(AssertionError):
    """Raised by [`assert_clean_exit`][exitsafe.testing.assert_clean_exit]: the run did not exit
    cleanly.

    An `AssertionError`, so test frameworks report it as a failed assertion.  Its
    message is the result's report, whose first line is the decoded summary.

    Attributes:
        result: the [`ExitResult`][exitsafe.testing.ExitResult] or
            [`ExitResults`][exitsafe.testing.ExitResults] that failed.
    """

    __module__ = "exitsafe.testing"  # the name pytest prints: where users import it from

    def __init__(self, result: Union[ExitResult, ExitResults]) -> None:
        """Make the error for a failed result; its message is `result.report()`.

        Args:
            result: the [`ExitResult`][exitsafe.testing.ExitResult] or
                [`ExitResults`][exitsafe.testing.ExitResults] that is not clean.
        """
        super().__init__(result.report())
        self.result = result


@dataclass(frozen=True)
class CheckResult:
    """One ``--check`` command, run after the program in the same directory.

    Attributes:
        command: the command as given (a shell string, or an argument list).
        returncode: its exit status (negative: killed by that signal).
        output: its stdout and stderr, interleaved.
        timed_out: it ran past the run's timeout and was killed.
    """

    command: Union[str, tuple[str, ...]]
    returncode: int
    output: str = ""
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        """Exit status 0 within the timeout."""
        return self.returncode == 0 and not self.timed_out

    @property
    def command_text(self) -> str:
        """The command as one line."""
        if isinstance(self.command, str):
            return self.command
        return _quote_argv(self.command)

    def describe_status(self) -> str:
        """``"exit status 1"``, ``"timed out"``, ``"passed"``."""
        if self.timed_out:
            return "timed out"
        if self.passed:
            return "passed"
        return describe_exit(self.returncode)

    def to_dict(self) -> dict[str, Any]:
        """The check as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 2, see the testing page).

        Returns:
            `command`, `returncode`, `passed`, `timed_out` and `output`.
        """
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "returncode": self.returncode,
            "passed": self.passed,
            "timed_out": self.timed_out,
            "output": self.output,
        }


@dataclass(frozen=True)
class AuditFinding:
    """A native release that ran after exitsafe's exit teardown (``EXITSAFE_AUDIT=1``).

    Attributes:
        what: ``"__del__"``, ``"ffi.gc"`` or ``"weakref.finalize"``.
        type: the object's type (``"mylib.Device"``, ``"cdata 'struct dev *'"``).
        site: where the object was created (``"app.py:12"``), from tracemalloc.
        stack: the frames that led there, most recent first, if more than one.
        holds: the native pointers it held (``"_ptr (cffi pointer)"``).
        via: the finalizer that ran (its file:line, or the destructor's name).
        thread: the thread it ran on.
        suggest: the exitsafe declaration that would release it in order instead: code,
            where ``obj`` names the object (``ptr`` the pointer, ``raw`` the finalizer's
            argument, ``ffi`` and ``lib`` the cffi objects); statements separated by ``; ``.
        alternative: another declaration, for an object the program does not own
            (``exitsafe.lowlevel.neutralize_at_exit(obj, attr=...)``), or ``None``.
        group: the audit's number for releases of the same kind, type and creation site.
        count: how many such releases ran (at least; the audit reports the first and counts
            the others, writing the count at 2, 4, 8 ...).
    """

    what: str
    type: str
    site: str
    stack: Optional[str] = None
    holds: Optional[str] = None
    via: Optional[str] = None
    thread: Optional[str] = None
    suggest: str = ""
    alternative: Optional[str] = None
    group: Optional[int] = None
    count: int = 1

    @classmethod
    def from_step(cls, step: TeardownStep) -> AuditFinding:
        """Read a finding from the audit's trace line (`exitsafe: audit-release ...`).

        Args:
            step: the parsed `audit-release` trace line; missing fields read `"?"`,
                `"unknown"` or `None`.

        Returns:
            The finding.
        """
        get = step.get
        return cls(
            what=get("what") or "?",
            type=get("type") or "?",
            site=get("site") or "unknown",
            stack=get("stack"),
            holds=get("holds"),
            via=get("via"),
            thread=get("thread"),
            suggest=get("suggest") or "",
            alternative=get("alternative"),
            group=step._int("group"),
        )

    def describe(self) -> str:
        """One line: ``__del__ of mylib.Device created at app.py:12``."""
        more = f" ({self.count} of them)" if self.count > 1 else ""
        return f"{self.what} of {self.type} created at {self.site}{more}"

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 2, see the testing page).

        Returns:
            One key per attribute.
        """
        return {
            "what": self.what,
            "type": self.type,
            "site": self.site,
            "stack": self.stack,
            "holds": self.holds,
            "via": self.via,
            "thread": self.thread,
            "suggest": self.suggest,
            "alternative": self.alternative,
            "group": self.group,
            "count": self.count,
        }


def _quote_argv(args: Sequence[str]) -> str:
    text = " ".join(shlex.quote(a) for a in args).replace("\n", "\\n")
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass(frozen=True, repr=False)
class ExitResult:
    """How one run of a program ended, decoded.

    Attributes:
        args: the command that ran.
        returncode: the exit status as `subprocess` reports it (negative: killed by that POSIX
            signal).
        signal: the name of the POSIX signal that killed the process (``"SIGSEGV"``), else ``None``.
        ntstatus: the decoded Windows status (``STATUS_ACCESS_VIOLATION 0xC0000005``), or ``None``;
            see [`NtStatus`][exitsafe.testing.NtStatus].
        timed_out: the run exceeded its timeout and its whole process group was killed.
        fatal_error: the first ``Fatal Python error`` / ``Windows fatal exception`` block with its
            thread stacks, or ``None``.
        unraisable: every "Exception ignored ..." block (and ``Error in atexit._run_exitfuncs``), in
            order.
        uncaught: the uncaught exception that ended the program, if one was printed.
        thread_exceptions: every ``Exception in thread NAME:`` block (a thread's uncaught
            exception), in order.
        native_fatal: the lines a native library printed when it aborted or one of its
            checks failed ([`NativeFatal`][exitsafe.testing.parsers.NativeFatal]).
        teardown: exitsafe's teardown trace lines (``EXITSAFE_TRACE=1``), parsed; empty when the
            program does not use exitsafe.
        children: the run's other processes ([`ChildProcess`][exitsafe.testing.ChildProcess]), as
            the start-up hook and the timeout saw them.
        checks: the ``checks`` run after the program
            ([`CheckResult`][exitsafe.testing.CheckResult]).
        audited: whether the run was audited (``audit=True``).
        trace: every ``exitsafe:`` line, including the threads listed at exit and the audit's lines.
        stdout: everything the program wrote on stdout, decoded as UTF-8 (bad bytes replaced).
        stderr: everything it wrote on stderr, decoded the same way.
        duration: wall-clock seconds from start to exit (or to the kill).
        timeout: the timeout the run had, in seconds (``None``: none).
        audit_state: what the audit's state file held when the process ended (``"3 R"``:
            a release of the audit's group 3 had begun and not returned; ``""``: nothing
            recorded); see [`audit_running`][exitsafe.testing.ExitResult.audit_running].
        exit_phase: ``"finalizing 0x<thread ident>"`` when the start-up hook saw every exit
            hook run (the interpreter was finalizing modules afterwards), else ``""``.
    """

    args: tuple[str, ...]
    returncode: int
    signal: Optional[str] = None
    ntstatus: Optional[NtStatus] = None
    timed_out: bool = False
    fatal_error: Optional[FatalError] = None
    unraisable: tuple[ExceptionReport, ...] = ()
    uncaught: Optional[ExceptionReport] = None
    teardown: tuple[TeardownStep, ...] = ()
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    timeout: Optional[float] = field(default=None, compare=False)
    children: tuple[ChildProcess, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    audited: bool = False
    trace: tuple[TeardownStep, ...] = field(default=(), compare=False)
    thread_exceptions: tuple[ExceptionReport, ...] = ()
    native_fatal: tuple[NativeFatal, ...] = ()
    audit_state: str = ""
    exit_phase: str = ""

    @classmethod
    def from_output(
        cls,
        args: Sequence[str],
        returncode: int,
        stdout: str,
        stderr: str,
        *,
        duration: float = 0.0,
        timed_out: bool = False,
        timeout: Optional[float] = None,
        children: Sequence[ChildProcess] = (),
        checks: Sequence[CheckResult] = (),
        audited: bool = False,
        audit_state: str = "",
        exit_phase: str = "",
    ) -> ExitResult:
        """Decode a finished process: its exit status and everything on its stderr.

        What [`run_command`][exitsafe.testing.run_command] does with each run; use it to decode
        a process you ran yourself.

        Args:
            args: the command that ran.
            returncode: its exit status as `subprocess` reports it (negative: killed by that
                POSIX signal).
            stdout: its stdout, decoded.
            stderr: its stderr, decoded: the fatal errors, unraisable exceptions, uncaught
                exception and exitsafe trace lines are parsed from it.
            duration: wall-clock seconds it took.
            timed_out: whether it was killed for running past its timeout.
            timeout: the timeout it had, in seconds (`None`: none).
            children: its other processes, if known.
            checks: the results of the checks run after it.
            audited: whether it ran with exitsafe's audit.
            audit_state: the content of the audit's state file (the release in progress).
            exit_phase: the content of the start-up hook's ``exit-<pid>.txt``.

        Returns:
            The decoded result.

        Example:
            ```python
            proc = subprocess.run([sys.executable, "app.py"], capture_output=True, text=True)
            result = ExitResult.from_output(proc.args, proc.returncode, proc.stdout, proc.stderr)
            print(result.summary())
            ```
        """
        raw = stderr
        stderr = untangle(stderr)  # trace lines written into another thread's line
        fatal = parse_fatal_errors(stderr)
        trace = parse_trace(stderr)
        return cls(
            args=tuple(args),
            returncode=returncode,
            signal=decode_signal(returncode),
            ntstatus=decode_ntstatus(returncode),
            timed_out=timed_out,
            fatal_error=fatal[0] if fatal else None,
            unraisable=tuple(parse_unraisable(stderr)),
            uncaught=parse_uncaught(stderr),
            teardown=tuple(s for s in trace if s.event not in DIAGNOSTIC_EVENTS),
            trace=tuple(trace),
            stdout=stdout,
            stderr=raw,
            duration=duration,
            timeout=timeout,
            children=tuple(children),
            checks=tuple(checks),
            audited=audited,
            thread_exceptions=tuple(parse_thread_exceptions(stderr)),
            native_fatal=tuple(parse_native_fatal(stderr)),
            audit_state=audit_state.strip(),
            exit_phase=exit_phase.strip(),
        )

    @property
    def clean(self) -> bool:
        """Exit status 0, no fatal error, no unraisable exception, no uncaught exception of
        a thread, no line of a native library's abort or failed check, no timeout, no child
        process that crashed or hung, every check passed, and no finding of the audit
        (when the run was audited)."""
        return (
            self.returncode == 0
            and self.fatal_error is None
            and not self.unraisable
            and not self.thread_exceptions
            and not self.native_fatal
            and not self.timed_out
            and not any(c.failed for c in self.children)
            and all(c.passed for c in self.checks)
            and not self.audit
        )

    @property
    def audit(self) -> list[AuditFinding]:
        """The native releases the audit saw after exitsafe's teardown (empty unless the
        run was audited: ``audit=True``, ``exitsafe run --audit``, ``EXITSAFE_AUDIT=1``)."""
        counts: dict[int, int] = {}
        for step in self.trace:
            if step.event == "audit-repeat":
                group, count = step._int("group"), step._int("count")
                if group is not None and count is not None:
                    counts[group] = max(counts.get(group, 1), count)
        findings = []
        for step in self.trace:
            if step.event == "audit-release":
                finding = AuditFinding.from_step(step)
                if finding.group is not None and finding.group in counts:
                    finding = replace(finding, count=counts[finding.group])
                findings.append(finding)
        return findings

    @property
    def audit_running(self) -> Optional[AuditFinding]:
        """The native release that had begun and not returned when the process ended
        (hung or crashed in it), from the audit's state file; ``None`` when none was, or
        the run was not audited by ``exitsafe run``.  For an ``ffi.gc`` destructor, whose
        end cannot be seen, the last one that began."""
        parts = self.audit_state.split()
        if len(parts) != 2 or parts[1] != "R" or not parts[0].isdigit():
            return None
        group = int(parts[0])
        return next((f for f in self.audit if f.group == group), None)

    @property
    def registries_finished(self) -> bool:
        """Whether at least one exitsafe teardown ran and every one that began finished."""
        begun = [r for r in self.registries if r.reason is not None]
        return bool(begun) and all(r.finished for r in begun)

    @property
    def diagnosis(self) -> Optional[Diagnosis]:
        """The cause of a bad exit ([`Diagnosis`][exitsafe.testing.Diagnosis]), or ``None`` when the
        run was
        clean or no rule recognised the cause."""
        return diagnose(self)

    @property
    def registries(self) -> list[RegistryTeardown]:
        """exitsafe's teardowns as the trace tells them, one per registry."""
        return summarize(self.teardown)

    @property
    def exit_description(self) -> str:
        """How the process ended in a few words: ``"SIGSEGV (signal 11)"``,
        ``"STATUS_ACCESS_VIOLATION 0xC0000005 (...)"``, ``"exit status 0"``."""
        return describe_exit(self.returncode)

    @property
    def failure_kind(self) -> Optional[str]:
        """A short label of what went wrong, stable from run to run (no addresses, no
        timings), or ``None`` when clean: ``"SIGSEGV"``, ``"timeout"``, ``"exit status 1:
        ValueError"``, ``"unraisable ZeroDivisionError in <function A.__del__>"``, or
        several of them joined by ``"; "``. [`ExitResults`][exitsafe.testing.ExitResults] groups
        runs by it."""
        if self.clean:
            return None
        parts: list[str] = []
        if self.timed_out:
            diagnosis = self.diagnosis
            parts.append("timeout" if diagnosis is None or diagnosis.kind == "timeout"
                         else f"timeout ({diagnosis.kind})")
        elif self.signal is not None:
            parts.append(self.signal)
        elif self.ntstatus is not None:
            parts.append(self.ntstatus.name)
        elif self.returncode != 0:
            part = f"exit status {self.returncode}"
            if self.uncaught is not None and self.uncaught.exc_type:
                part += f": {self.uncaught.exc_type}"
            parts.append(part)
        if self.fatal_error is not None and not (self.signal or self.ntstatus):
            parts.append(f"fatal error {_ADDRESS.sub('0x?', self.fatal_error.message)!r}")
        seen: set[str] = set()
        for report in self.unraisable:
            label = f"unraisable {report.exc_type or 'exception'} in {report.where}"
            if label not in seen:
                seen.add(label)
                parts.append(label)
        for report in self.thread_exceptions:
            label = f"thread exception {report.exc_type or 'exception'}"
            if label not in seen:
                seen.add(label)
                parts.append(label)
        for line in self.native_fatal[:1]:
            parts.append(f"native {line.source}: {_ADDRESS.sub('0x?', line.line)[:120]}")
        for check in self.checks:
            if not check.passed:
                parts.append(f"check failed: {check.command_text}")
        if self.audit:
            parts.append("audit findings")
        return "; ".join(parts)

    def summary(self) -> str:
        """One line: ``CLEAN: exit status 0 in 0.05 s`` or ``NOT CLEAN``, the kind of the
        cause in brackets when it is recognised
        ([`diagnosis`][exitsafe.testing.ExitResult.diagnosis]), its headline, then the
        decoded status: ``NOT CLEAN [crash-at-exit]: crash at exit (SIGSEGV), with no
        exitsafe teardown traced; SIGSEGV (signal 11); Fatal Python error: Segmentation
        fault``."""
        if self.clean:
            return f"CLEAN: exit status 0 in {self.duration:.2f} s"
        parts: list[str] = []
        diagnosis = self.diagnosis
        head = "NOT CLEAN"
        if diagnosis is not None:
            head = f"NOT CLEAN [{diagnosis.kind}]"
            if diagnosis.specific:
                parts.append(diagnosis.headline)
        if self.timed_out:
            parts.append(
                f"timed out after {self.timeout:g} s, process group killed"
                if self.timeout is not None
                else "timed out, process group killed"
            )
        if self.returncode != 0 and not self.timed_out:
            parts.append(self.exit_description)
        if self.fatal_error is not None and not self._dumped_on_timeout:
            prefix = "Windows fatal exception" if self.fatal_error.windows else "Fatal Python error"
            parts.append(f"{prefix}: {self.fatal_error.message}")
        if self.uncaught is not None and self.returncode != 0 and not self.timed_out:
            parts.append(f"uncaught {self.uncaught.exc_type}")
        if self.thread_exceptions:
            count = len(self.thread_exceptions)
            parts.append(f"{count} uncaught exception{'s' if count > 1 else ''} in threads")
        if self.unraisable:
            count = len(self.unraisable)
            parts.append(f"{count} unraisable exception{'s' if count > 1 else ''} at exit")
        if self.native_fatal and (
            diagnosis is None or diagnosis.kind not in ("native-fatal", "thread-in-native")
        ):
            parts.append(f"native message ({self.native_fatal[0].source}):"
                         f" {self.native_fatal[0].line[:160]}")
        failed = [c for c in self.checks if not c.passed]
        if failed:
            parts.append(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed")
        if self.audit:
            count = sum(f.count for f in self.audit)
            parts.append(f"{count} latent exit hazard(s) found by the audit")
        return f"{head}: " + "; ".join(parts)

    def report(self, output: bool = True) -> str:
        """A multi-line diagnosis a person can act on: the summary, then the cause's
        details, where it crashed or hung (every thread's stack), the exceptions of
        threads, the unraisable exceptions, the uncaught exception, the child processes,
        the checks, exitsafe's teardown, the audit, the hint with the address of its
        recipe on the docs site, and, for a run that is not clean, the last lines of the
        program's own stdout and stderr (as pytest shows a failed test's captured output).

        Args:
            output: show those last lines of stdout and stderr (`exitsafe run
                --show-output` prints the whole output instead).

        Returns:
            The report; its first line is [`summary`][exitsafe.testing.ExitResult.summary].
        """
        lines = [self.summary(), f"  command: {_quote_argv(self.args)}"]
        lines.append(f"  exit: {self._exit_line()}")
        diagnosis = self.diagnosis
        if diagnosis is not None:
            if not diagnosis.specific:  # a specific cause already leads the summary line
                lines.append(f"cause: {diagnosis.headline}")
            lines.extend(_indent(list(diagnosis.details), "  "))
        if self.native_fatal:
            lines.append("native library messages:")
            lines.extend(f"  {n.line}" for n in self.native_fatal[:5])
        if self.fatal_error is not None:
            before = self._stderr_before_fatal()
            if before:
                lines.append("the program's last stderr lines before the fatal error:")
                lines.extend(_indent(before, "  "))
            title = None
            if self._dumped_on_timeout:
                title = "Where it hung (faulthandler's dump on the SIGABRT sent at the timeout):"
            lines.extend(_fatal_lines(self.fatal_error, title))
        if self.uncaught is not None and (self.returncode != 0 or self.timed_out):
            lines.append(f"Uncaught exception: {self.uncaught.describe()}")
            lines.extend(_indent(_last_traceback_lines(self.uncaught.traceback), "  "))
        if self.thread_exceptions:
            lines.append(f"Uncaught exceptions in threads ({len(self.thread_exceptions)}):")
            for number, report in enumerate(self.thread_exceptions, 1):
                lines.append(f"  {number}. thread {report.object!r}: {report.describe()}")
                lines.extend(_indent(_last_traceback_lines(report.traceback), "     "))
        if self.unraisable:
            lines.append(f"Unraisable exceptions at exit ({len(self.unraisable)}):")
            for number, report in enumerate(self.unraisable, 1):
                lines.append(f"  {number}. {report.describe()}")
                lines.extend(_indent(_last_traceback_lines(report.traceback), "     "))
        shown_children = [c for c in self.children if c.failed]
        if shown_children:
            lines.append(f"Child processes ({len(shown_children)} of {len(self.children)}):")
            for child in shown_children:
                lines.append(f"  {child.describe()}")
                if child.argv:
                    lines.append(f"    command: {_quote_argv(child.argv)}")
                if child.fatal_error is not None:
                    title = "its stacks at the timeout:" if child.state == "hung" else None
                    lines.extend(_indent(_fatal_lines(child.fatal_error, title)[1:], "  "))
        for check in self.checks:
            status = "passed" if check.passed else f"FAILED ({check.describe_status()})"
            lines.append(f"check {check.command_text!r}: {status}")
            if not check.passed:
                output_lines = [line for line in check.output.splitlines() if line.strip()]
                lines.extend(_indent(output_lines[-_STDERR_TAIL:], "  "))
        lines.extend(self._teardown_lines())
        lines.extend(self._audit_lines())
        hint = diagnosis.hint if diagnosis is not None else self._hint()
        if hint:
            lines.append(f"hint: {hint}")
            if diagnosis is not None and diagnosis.url:
                lines.append(f"  see: {diagnosis.url}")
        if output and not self.clean:
            lines.extend(self._output_tails())
        return "\n".join(lines)

    def _output_tails(self) -> list[str]:
        """The last lines of the program's own stdout and stderr: the trace lines and the
        blocks decoded above left out, each line cut at `OUTPUT_LINE_WIDTH`."""
        lines: list[str] = []
        decoded: set[str] = set()
        for block in (
            [self.fatal_error] if self.fatal_error is not None else []
        ):
            decoded.update(block.text.splitlines())
        for report in (*self.unraisable, *self.thread_exceptions,
                       *([self.uncaught] if self.uncaught is not None else [])):
            decoded.update(report.text.splitlines())
        stderr = untangle(self.stderr)
        for name, text, skip in (("stdout", self.stdout, set()), ("stderr", stderr, decoded)):
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

    def _stderr_before_fatal(self) -> list[str]:
        """The program's own last stderr lines right before the fatal error block (a
        native library's ``FATAL: ...`` message, a C++ ``terminate called ...``)."""
        lines = untangle(self.stderr).splitlines()
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

    def _audit_lines(self) -> list[str]:
        findings = self.audit
        if not self.audited and not findings:
            return []
        begun = [s for s in self.trace if s.event == "audit-begin"]
        ended = not self.timed_out and not (self.signal or self.ntstatus)
        if not findings:
            if not begun and self.timed_out:
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
        running = self.audit_running
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

    @property
    def _dumped_on_timeout(self) -> bool:
        """Whether the fatal error is the stack dump requested when the run timed out."""
        fatal = self.fatal_error
        return self.timed_out and fatal is not None and fatal.message == "Aborted"

    def _exit_line(self) -> str:
        when = f"after {self.duration:.2f} s"
        if self.timed_out and self.returncode == 0:
            timeout = "" if self.timeout is None else f" after {self.timeout:g} s"
            return (
                f"exit status 0 {when}, but the run timed out{timeout}: processes it"
                " started kept its output open; the process group was killed"
            )
        if self.timed_out:
            timeout = "" if self.timeout is None else f" after {self.timeout:g} s"
            how = "SIGABRT for its stacks, then SIGKILL" if self._dumped_on_timeout else "SIGKILL"
            return (
                f"timed out{timeout}: exitsafe run stopped it ({how} to the process group);"
                " that signal is exitsafe's, not the program's"
            )
        if self.signal is not None:
            return f"killed by {self.exit_description} {when}"
        return f"{self.exit_description} {when}"

    def _teardown_lines(self) -> list[str]:
        registries = self.registries
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
            elif not self.clean:
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

    def _hint(self) -> Optional[str]:
        if self.clean:
            return None
        finalizing = self.fatal_error is not None and self.fatal_error.during_finalization
        if self.timed_out and self.returncode == 0 and self.fatal_error is None:
            return (
                "the main process exited 0, but processes it started kept its stdout or"
                " stderr open past the timeout; they were killed with its process group."
            )
        if (self.signal or self.ntstatus or finalizing) and not self.teardown:
            return (
                "native code crashed and exitsafe's trace is empty: the program does not use"
                " exitsafe, or the crash came before its teardown. Declaring the handles and"
                " their dependencies with exitsafe releases them in a safe order at exit."
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the decoded result, numbers as numbers; the schema
        (version `JSON_SCHEMA_VERSION`) is documented in the testing docs."""
        fatal = self.fatal_error
        diagnosis = self.diagnosis
        return {
            "schema": JSON_SCHEMA_VERSION,
            "args": list(self.args),
            "clean": self.clean,
            "summary": self.summary(),
            "failure_kind": self.failure_kind,
            "diagnosis": None if diagnosis is None else diagnosis.to_dict(),
            "returncode": self.returncode,
            "signal": self.signal,
            "ntstatus": None
            if self.ntstatus is None
            else {"name": self.ntstatus.name, "hex": self.ntstatus.hex, "code": self.ntstatus.code},
            "timed_out": self.timed_out,
            "timeout": self.timeout,
            "duration": self.duration,
            "fatal_error": None if fatal is None else fatal.to_dict(),
            "stderr_before_fatal": self._stderr_before_fatal() if fatal is not None else [],
            "unraisable": [_exception_dict(r) for r in self.unraisable],
            "thread_exceptions": [_exception_dict(r) for r in self.thread_exceptions],
            "native_fatal": [
                {"line": n.line, "source": n.source, "number": n.number} for n in self.native_fatal
            ],
            "uncaught": None if self.uncaught is None else _exception_dict(self.uncaught),
            "teardown": [s.to_dict() for s in self.teardown],
            "threads_at_exit": [s.to_dict() for s in self.trace if s.event == "thread"],
            "registries": [_registry_dict(r) for r in self.registries],
            "children": [c.to_dict() for c in self.children],
            "checks": [c.to_dict() for c in self.checks],
            "exit_phase": self.exit_phase,
            "audited": self.audited,
            "audit": [f.to_dict() for f in self.audit],
            "audit_running": None if self.audit_running is None else self.audit_running.to_dict(),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }

    def __repr__(self) -> str:
        # Short on purpose: pytest shows reprs in assertion failures, and a raw stderr dump
        # there would bury the decoded result.
        return f"<ExitResult {self.summary()}>"


def _exception_dict(report: ExceptionReport) -> dict[str, Any]:
    return {
        "context": report.context,
        "object": report.object,
        "type": report.exc_type,
        "message": report.message,
        "traceback": report.traceback,
    }


def _registry_dict(registry: RegistryTeardown) -> dict[str, Any]:
    return {
        "registry": registry.registry,
        "reason": registry.reason,
        "live": registry.live,
        "hooks": registry.hooks,
        "planned": registry.planned,
        "finished": registry.finished,
        "released": registry.released,
        "leaked": registry.leaked,
        "failed": registry.failed,
        "ms": registry.ms,
        "late_releases": registry.late_releases,
        "outcomes": registry.outcomes,
    }


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


class ExitResults(Sequence[ExitResult]):
    """The results of running the same program several times, in order.

    A sequence of [`ExitResult`][exitsafe.testing.ExitResult], with the aggregate view a flaky exit
    needs: [`failures`][exitsafe.testing.ExitResults.failures],
    [`failure_rate`][exitsafe.testing.ExitResults.failure_rate],
    [`kinds`][exitsafe.testing.ExitResults.kinds] (the distinct failure kinds and how often each
    happened) and [`clean`][exitsafe.testing.ExitResults.clean] (every run clean).
    """

    def __init__(self, results: Sequence[ExitResult]) -> None:
        """Collect the results of several runs.

        Args:
            results: one [`ExitResult`][exitsafe.testing.ExitResult] per run, in order (at least
                one).
        """
        if not results:
            raise ValueError("ExitResults needs at least one result")
        self._results = tuple(results)

    @overload
    def __getitem__(self, index: int) -> ExitResult: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ExitResult]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[ExitResult, Sequence[ExitResult]]:
        return self._results[index]

    def __len__(self) -> int:
        return len(self._results)

    def __iter__(self) -> Iterator[ExitResult]:
        return iter(self._results)

    @property
    def failures(self) -> list[ExitResult]:
        """The runs that were not clean, in order."""
        return [r for r in self._results if not r.clean]

    @property
    def failure_rate(self) -> float:
        """The fraction of runs that were not clean, 0.0 to 1.0."""
        return len(self.failures) / len(self._results)

    @property
    def kinds(self) -> dict[str, int]:
        """Each distinct [`ExitResult.failure_kind`][exitsafe.testing.ExitResult.failure_kind] and
        how many runs ended that way,
        in order of first appearance."""
        counts: dict[str, int] = {}
        for result in self.failures:
            kind = result.failure_kind or "?"
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    @property
    def clean(self) -> bool:
        """Whether every run was clean."""
        return all(r.clean for r in self._results)

    @property
    def duration(self) -> float:
        """The total wall-clock time of all runs, in seconds."""
        return sum(r.duration for r in self._results)

    def summary(self) -> str:
        """One line: ``CLEAN: 20 of 20 runs clean`` or ``NOT CLEAN: 3 of 20 runs failed (15%):
        SIGSEGV x2, timeout x1``."""
        total = len(self._results)
        if self.clean:
            return f"CLEAN: {total} of {total} runs clean in {self.duration:.2f} s"
        failed = len(self.failures)
        kinds = ", ".join(f"{kind} x{count}" for kind, count in self.kinds.items())
        return f"NOT CLEAN: {failed} of {total} runs failed ({self.failure_rate:.0%}): {kinds}"

    def report(self) -> str:
        """The summary, the failure kinds with the runs they happened in, and the full
        [`ExitResult.report`][exitsafe.testing.ExitResult.report] of the first run of each kind."""
        lines = [self.summary()]
        if self.clean:
            return "\n".join(lines)
        first: dict[str, tuple[int, ExitResult]] = {}
        runs: dict[str, list[int]] = {}
        for number, result in enumerate(self._results, 1):
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
            lines.append(f"--- run {number} of {len(self._results)} ({kind}) ---")
            lines.append(result.report())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the aggregate and every run's
        [`ExitResult.to_dict`][exitsafe.testing.ExitResult.to_dict]."""
        return {
            "clean": self.clean,
            "summary": self.summary(),
            "runs": len(self._results),
            "failures": len(self.failures),
            "failure_rate": self.failure_rate,
            "kinds": self.kinds,
            "results": [r.to_dict() for r in self._results],
        }

    def __repr__(self) -> str:
        return f"<ExitResults {self.summary()}>"


def assert_clean_exit(result: Union[ExitResult, ExitResults]) -> None:
    """Raise [`ExitNotClean`][exitsafe.testing.ExitNotClean] (an `AssertionError`) unless
    `result` is clean.

    The message is [`ExitResult.report`][exitsafe.testing.ExitResult.report] (or
    [`ExitResults.report`][exitsafe.testing.ExitResults.report]): what went wrong, the
    decoded signal or status, the fatal error's top frames, the unraisable exceptions, the
    last teardown steps before a crash; for several runs also the failure rate and the
    distinct failure kinds.  Under pytest the failure points at the caller's line.

    Args:
        result: one run, or several runs (then every run must be clean).

    Raises:
        ExitNotClean: the run (or a run) did not exit cleanly.
        TypeError: `result` is neither an `ExitResult` nor an `ExitResults`.

    Example:
        ```python
        assert_clean_exit(run(script="app.py", repeat=20))
        ```
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's body
    if not isinstance(result, (ExitResult, ExitResults)):
        raise TypeError(
            f"assert_clean_exit expects an ExitResult or ExitResults, not {type(result).__name__}"
        )
    if not result.clean:
        raise ExitNotClean(result)

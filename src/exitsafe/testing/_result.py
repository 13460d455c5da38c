"""The result of running a program, as data: [`ExitResult`][exitsafe.testing.ExitResult] (one
run, decoded) and [`ExitResults`][exitsafe.testing.ExitResults] (several runs), and
[`assert_clean_exit`][exitsafe.testing.assert_clean_exit].

Their text (`summary`, `report`) is made by `_report`, their JSON (`to_dict`) by `_json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence, Union, overload

from . import _json, _report
from ._children import ChildProcess
from ._decode import NtStatus, decode_ntstatus, decode_signal, describe_exit
from ._diagnose import diagnose
from ._diagnosis import Diagnosis
from ._records import AuditFinding, CheckResult, audit_findings
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

#: Trace events that are not part of a teardown: the threads alive at exit, the end of
#: the exit hooks and the audit.
DIAGNOSTIC_EVENTS = frozenset(
    {"thread", "exit-phase", "audit-begin", "audit-release", "audit-repeat"}
)


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


@dataclass(frozen=True, repr=False)
class ExitResult:
    """How one run of a program ended, decoded.

    Attributes:
        args: the command that ran.
        returncode: the exit status as `subprocess` reports it (negative: killed by that POSIX
            signal).
        signal: the name of the POSIX signal that killed the process (``"SIGSEGV"``), else ``None``;
            ``None`` too when the run timed out (then the signal was the harness's own kill,
            sent to dump the threads' stacks, and `returncode` still shows it).
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
            # (a run killed for its timeout died by the harness's own signal, not its own)
            signal=None if timed_out else decode_signal(returncode),
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
        return audit_findings(self.trace)

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
        return _report.failure_kind(self)

    def summary(self) -> str:
        """One line: ``CLEAN: exit status 0 in 0.05 s`` or ``NOT CLEAN``, the kind of the
        cause in brackets when it is recognised
        ([`diagnosis`][exitsafe.testing.ExitResult.diagnosis]), its headline, then the
        decoded status: ``NOT CLEAN [crash-at-exit]: crash at exit (SIGSEGV), with no
        exitsafe teardown traced; SIGSEGV (signal 11); Fatal Python error: Segmentation
        fault``."""
        return _report.summary(self)

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
        return _report.report(self, output)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the decoded result, numbers as numbers; the schema
        (version `JSON_SCHEMA_VERSION`) is documented in the testing docs."""
        return _json.result_dict(self)

    def __repr__(self) -> str:
        # Short on purpose: pytest shows reprs in assertion failures, and a raw stderr dump
        # there would bury the decoded result.
        return f"<ExitResult {self.summary()}>"


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
        """One line: ``CLEAN: 20 of 20 runs clean`` or ``NOT CLEAN [crash-at-exit x2,
        hang-in-teardown x1]: 3 of 20 runs failed (15%): SIGSEGV x2, timeout x1``: the
        diagnosed kinds of the failed runs (a count when not every failed run has it), then
        each distinct [`ExitResult.failure_kind`][exitsafe.testing.ExitResult.failure_kind]."""
        return _report.results_summary(self)

    def report(self) -> str:
        """The summary, the failure kinds with the runs they happened in, and the full
        [`ExitResult.report`][exitsafe.testing.ExitResult.report] of the first run of each kind."""
        return _report.results_report(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the aggregate and every run's
        [`ExitResult.to_dict`][exitsafe.testing.ExitResult.to_dict]."""
        return _json.results_dict(self)

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

"""The structured result of running a program: :class:`ExitResult` and :class:`ExitResults`."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence, Union, overload

from ._decode import NtStatus, decode_ntstatus, decode_signal, describe_exit
from ._stderr import (
    ExceptionReport,
    FatalError,
    parse_fatal_errors,
    parse_uncaught,
    parse_unraisable,
)
from .trace import RegistryTeardown, TeardownStep, parse_trace, summarize

#: How many frames of the crashing thread, and teardown steps before a crash, reports show.
TOP_FRAMES = 8
LAST_STEPS = 5
#: How many steps of a finished teardown reports list.
SHOWN_STEPS = 10
_STDERR_TAIL = 15
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")

#: The first line of :func:`assert_clean_exit`'s message.
NOT_CLEAN_PREFIX = "the program did not exit cleanly\n"


def _quote_argv(args: Sequence[str]) -> str:
    text = " ".join(shlex.quote(a) for a in args).replace("\n", "\\n")
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass(frozen=True, repr=False)
class ExitResult:
    """How one run of a program ended, decoded.

    :ivar args: the command that ran.
    :ivar returncode: the exit status as :mod:`subprocess` reports it (negative: killed by
        that POSIX signal).
    :ivar signal: the name of the POSIX signal that killed the process (``"SIGSEGV"``),
        else ``None``.
    :ivar ntstatus: the decoded Windows status (``STATUS_ACCESS_VIOLATION 0xC0000005``), or
        ``None``; see :class:`NtStatus`.
    :ivar timed_out: the run exceeded its timeout and its whole process group was killed.
    :ivar fatal_error: the first ``Fatal Python error`` / ``Windows fatal exception`` block
        with its thread stacks, or ``None``.
    :ivar unraisable: every "Exception ignored ..." block (and ``Error in
        atexit._run_exitfuncs``), in order.
    :ivar uncaught: the uncaught exception that ended the program, if one was printed.
    :ivar teardown: exitsafe's trace lines (``EXITSAFE_TRACE=1``), parsed; empty when the
        program does not use exitsafe.
    :ivar stdout: everything the program wrote on stdout, decoded as UTF-8 (bad bytes
        replaced).
    :ivar stderr: everything it wrote on stderr, decoded the same way.
    :ivar duration: wall-clock seconds from start to exit (or to the kill).
    :ivar timeout: the timeout the run had, in seconds (``None``: none).
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
    ) -> ExitResult:
        """Decode a finished process: its exit status and everything on its stderr."""
        fatal = parse_fatal_errors(stderr)
        return cls(
            args=tuple(args),
            returncode=returncode,
            signal=decode_signal(returncode),
            ntstatus=decode_ntstatus(returncode),
            timed_out=timed_out,
            fatal_error=fatal[0] if fatal else None,
            unraisable=tuple(parse_unraisable(stderr)),
            uncaught=parse_uncaught(stderr),
            teardown=tuple(parse_trace(stderr)),
            stdout=stdout,
            stderr=stderr,
            duration=duration,
            timeout=timeout,
        )

    @property
    def clean(self) -> bool:
        """Exit status 0, no fatal error, no unraisable exception, no timeout."""
        return (
            self.returncode == 0
            and self.fatal_error is None
            and not self.unraisable
            and not self.timed_out
        )

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
        several of them joined by ``"; "``.  :class:`ExitResults` groups runs by it."""
        if self.clean:
            return None
        parts: list[str] = []
        if self.timed_out:
            parts.append("timeout")
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
        return "; ".join(parts)

    def summary(self) -> str:
        """One line: ``CLEAN: exit status 0 in 0.05 s`` or ``NOT CLEAN: SIGSEGV (signal 11);
        Fatal Python error: Segmentation fault; 1 unraisable exception``."""
        if self.clean:
            return f"CLEAN: exit status 0 in {self.duration:.2f} s"
        parts: list[str] = []
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
        if self.unraisable:
            count = len(self.unraisable)
            parts.append(f"{count} unraisable exception{'s' if count > 1 else ''} at exit")
        return "NOT CLEAN: " + "; ".join(parts)

    def report(self) -> str:
        """A multi-line diagnosis a person can act on: the summary, then where it crashed
        (the crashing thread's top frames), the unraisable exceptions, the uncaught
        exception, exitsafe's teardown (the last steps before a crash), and the end of
        stderr when nothing on it could be decoded."""
        lines = [self.summary(), f"  command: {_quote_argv(self.args)}"]
        lines.append(f"  exit: {self._exit_line()}")
        if self.fatal_error is not None:
            title = None
            if self._dumped_on_timeout:
                title = "Where it hung (faulthandler's dump on the SIGABRT sent at the timeout):"
            lines.extend(_fatal_lines(self.fatal_error, title))
        if self.uncaught is not None and (self.returncode != 0 or self.timed_out):
            lines.append(f"Uncaught exception: {self.uncaught.describe()}")
            lines.extend(_indent(_last_traceback_lines(self.uncaught.traceback), "  "))
        if self.unraisable:
            lines.append(f"Unraisable exceptions at exit ({len(self.unraisable)}):")
            for number, report in enumerate(self.unraisable, 1):
                lines.append(f"  {number}. {report.describe()}")
                lines.extend(_indent(_last_traceback_lines(report.traceback), "     "))
        lines.extend(self._teardown_lines())
        hint = self._hint()
        if hint:
            lines.append(f"hint: {hint}")
        if (
            not self.clean
            and self.fatal_error is None
            and not self.unraisable
            and self.uncaught is None
        ):
            tail = [line for line in self.stderr.splitlines() if line.strip()]
            tail = [line for line in tail if not line.startswith("exitsafe: ")][-_STDERR_TAIL:]
            if tail:
                lines.append(f"stderr (last {len(tail)} lines, exitsafe trace left out):")
                lines.extend(_indent(tail, "  "))
        return "\n".join(lines)

    @property
    def _dumped_on_timeout(self) -> bool:
        """Whether the fatal error is the stack dump requested when the run timed out."""
        fatal = self.fatal_error
        return self.timed_out and fatal is not None and fatal.message == "Aborted"

    def _exit_line(self) -> str:
        when = f"after {self.duration:.2f} s"
        if self.timed_out:
            timeout = "" if self.timeout is None else f" after {self.timeout:g} s"
            return (
                f"timed out{timeout}; the process group was killed; the main process ended"
                f" with {self.exit_description}"
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
        if self.timed_out:
            return (
                "the program did not exit in time; the stacks above (faulthandler, on SIGABRT"
                " before the kill) show where it hung. A release that blocks at exit can get"
                " a per-step timeout in exitsafe (it is then leaked and logged)."
            )
        if self.unraisable and any("__del__" in r.where for r in self.unraisable):
            return (
                "a __del__ ran while the interpreter was shutting down. Track the native"
                " handle with exitsafe.track(...) (or exitsafe.adopt / neutralize_at_exit for"
                " an object you do not own) so it is released in order before modules are"
                " torn down."
            )
        if (self.signal or self.ntstatus or finalizing) and not self.teardown:
            return (
                "native code crashed and exitsafe's trace is empty: the program does not use"
                " exitsafe, or the crash came before its teardown. Declaring the handles and"
                " their dependencies with exitsafe releases them in a safe order at exit."
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the decoded result (without the raw output, which is under
        ``"stdout"`` and ``"stderr"``)."""
        fatal = self.fatal_error
        return {
            "args": list(self.args),
            "clean": self.clean,
            "summary": self.summary(),
            "failure_kind": self.failure_kind,
            "returncode": self.returncode,
            "signal": self.signal,
            "ntstatus": None
            if self.ntstatus is None
            else {"name": self.ntstatus.name, "hex": self.ntstatus.hex},
            "timed_out": self.timed_out,
            "duration": self.duration,
            "fatal_error": None
            if fatal is None
            else {
                "message": fatal.message,
                "windows": fatal.windows,
                "runtime_state": fatal.runtime_state,
                "threads": [
                    {
                        "thread_id": t.thread_id,
                        "current": t.current,
                        "name": t.name,
                        "frames": [
                            {"file": f.file, "line": f.line, "function": f.function}
                            for f in t.frames
                        ],
                    }
                    for t in fatal.threads
                ],
            },
            "unraisable": [_exception_dict(r) for r in self.unraisable],
            "uncaught": None if self.uncaught is None else _exception_dict(self.uncaught),
            "teardown": [{"event": s.event, **s.fields} for s in self.teardown],
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
        lines.append(f"  other threads ({len(others)}):")
        for thread in others:
            top = str(thread.frames[0]) if thread.frames else "; ".join(thread.notes) or "-"
            lines.append(f"    {thread.thread_id}: {top}")
    return lines


class ExitResults(Sequence[ExitResult]):
    """The results of running the same program several times, in order.

    A sequence of :class:`ExitResult`, with the aggregate view a flaky exit needs:
    :attr:`failures`, :attr:`failure_rate`, :attr:`kinds` (the distinct failure kinds and
    how often each happened) and :attr:`clean` (every run clean).
    """

    def __init__(self, results: Sequence[ExitResult]) -> None:
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
        """Each distinct :attr:`ExitResult.failure_kind` and how many runs ended that way,
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
        :meth:`ExitResult.report` of the first run of each kind."""
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
        """A JSON-ready dict: the aggregate and every run's :meth:`ExitResult.to_dict`."""
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
    """Raise :class:`AssertionError` unless ``result`` (one run, or every run of several)
    is clean.

    The message is :meth:`ExitResult.report` (or :meth:`ExitResults.report`): what went
    wrong, the decoded signal or status, the fatal error's top frames, the unraisable
    exceptions, the last teardown steps before a crash; for several runs also the
    failure rate and the distinct failure kinds.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's body
    if not isinstance(result, (ExitResult, ExitResults)):
        raise TypeError(
            f"assert_clean_exit expects an ExitResult or ExitResults, not {type(result).__name__}"
        )
    if not result.clean:
        raise AssertionError(NOT_CLEAN_PREFIX + result.report())

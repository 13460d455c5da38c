"""What a result holds besides the parsed output: [`CheckResult`][exitsafe.testing.CheckResult]
(a check run after the program) and [`AuditFinding`][exitsafe.testing.AuditFinding] (a
native release the audit saw after exitsafe's teardown), and `audit_findings`, which reads
the findings off the audit's trace lines."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

from ._decode import describe_exit
from .trace import TeardownStep


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
        return quote_argv(self.command)

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
            where ``obj`` names the object (``ptr`` the pointer before ``ffi.gc`` and
            ``release`` its destructor, ``ffi`` and ``lib`` the cffi objects; ``raw`` the
            only argument of a ``weakref.finalize``, ``args`` and ``kwargs`` its arguments,
            ``callback`` its callback); statements separated by ``; ``.  A ``handle`` it
            assigns must be kept while the object lives: dropping it releases the object.
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
            group=_int_field(step, "group"),
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


def audit_findings(trace: Sequence[TeardownStep]) -> list[AuditFinding]:
    """The findings of the audit's ``audit-release`` lines, in order, each with the count
    its group's ``audit-repeat`` lines give."""
    counts: dict[int, int] = {}
    for step in trace:
        if step.event == "audit-repeat":
            group, count = _int_field(step, "group"), _int_field(step, "count")
            if group is not None and count is not None:
                counts[group] = max(counts.get(group, 1), count)
    findings = []
    for step in trace:
        if step.event == "audit-release":
            finding = AuditFinding.from_step(step)
            if finding.group is not None and finding.group in counts:
                finding = replace(finding, count=counts[finding.group])
            findings.append(finding)
    return findings


def quote_argv(args: Sequence[str]) -> str:
    """A command as one line, cut at 160 characters."""
    text = " ".join(shlex.quote(a) for a in args).replace("\n", "\\n")
    return text if len(text) <= 160 else text[:157] + "..."


def _int_field(step: TeardownStep, key: str) -> Optional[int]:
    value = step.get(key)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None

"""Parsing exitsafe's teardown trace (``EXITSAFE_TRACE=1``) back into data.

Every trace line starts with ``exitsafe: ``, then an event word, then ``key=value``
pairs, where a value is a bare token without spaces or a JSON string:

```text
exitsafe: teardown-begin registry="default" reason="atexit" live=5 hooks=1
exitsafe: plan registry="default" steps=6
exitsafe: step registry="default" index=3 of=6 action=release kind="device" name="dev0" outcome=released_at_exit ms=0.012
exitsafe: teardown-end registry="default" released=3 leaked=2 failed=0 ms=1.234
exitsafe: late-release registry="default" kind="device" name="dev0"
```

The parser never raises on its input: an unknown event or key is kept as it is in
[`TeardownStep.fields`][exitsafe.testing.trace.TeardownStep], and a line that starts with
``exitsafe: `` but is not in the ``key=value`` grammar (exitsafe's `logging` messages when logging goes to
stderr) becomes an event named ``"message"`` whose ``text`` field is the rest of the line.
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .._ledger import TRACE_PREFIX, parse_trace_line

PREFIX = TRACE_PREFIX

#: Step outcomes that mean the handle or hook did not end as planned.
FAILED_OUTCOMES = frozenset({"release_failed", "hook_failed", "hook_timeout", "leaked_timeout"})

#: Keys whose values are numbers (``to_dict`` gives them as numbers, not strings).
INT_KEYS = frozenset(
    {"index", "of", "live", "hooks", "steps", "released", "leaked", "failed", "seq",
     "candidates", "tracemalloc", "pid", "group", "count"}
)
FLOAT_KEYS = frozenset({"ms"})
BOOL_KEYS = frozenset({"daemon"})



@dataclass(frozen=True)
class TeardownStep:
    """One trace line.

    Attributes:
        event: ``"teardown-begin"``, ``"plan"``, ``"step-begin"``, ``"step"``,
            ``"teardown-end"``, ``"late-release"``, any other word a newer exitsafe prints, or
            ``"message"`` for a line outside the grammar.
        fields: every ``key=value`` pair, values decoded to ``str`` (JSON strings unquoted, bare
            tokens as written).
        line: the line as printed, without the newline.
    """

    event: str
    fields: Mapping[str, str] = field(default_factory=dict)
    line: str = ""

    def __hash__(self) -> int:
        # The line determines every field; hashing it keeps results hashable.
        return hash((self.event, self.line))

    def get(self, key: str) -> Optional[str]:
        """The value of a field, or `None`.

        Args:
            key: the field's name (`"outcome"`, `"kind"`...).

        Returns:
            The value as a string, or `None` when the line has no such field.
        """
        return self.fields.get(key)

    def _int(self, key: str) -> Optional[int]:
        value = self.fields.get(key)
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    def _float(self, key: str) -> Optional[float]:
        value = self.fields.get(key)
        try:
            return None if value is None else float(value)
        except ValueError:
            return None

    @property
    def registry(self) -> Optional[str]:
        """The registry the event belongs to."""
        return self.fields.get("registry")

    @property
    def index(self) -> Optional[int]:
        """A step's 1-based position in the plan."""
        return self._int("index")

    @property
    def of(self) -> Optional[int]:
        """The number of steps in the plan a step belongs to."""
        return self._int("of")

    @property
    def action(self) -> Optional[str]:
        """A step's action: ``"release"``, ``"leak"`` or ``"hook"``."""
        return self.fields.get("action")

    @property
    def kind(self) -> Optional[str]:
        """The handle's kind (``"device"``)."""
        return self.fields.get("kind")

    @property
    def name(self) -> Optional[str]:
        """The handle's or hook's name."""
        return self.fields.get("name")

    @property
    def outcome(self) -> Optional[str]:
        """A step's ledger outcome (``"released_at_exit"``, ``"leaked_timeout"`` ...)."""
        return self.fields.get("outcome")

    @property
    def error(self) -> Optional[str]:
        """The error a failed or leaked step reports, if any."""
        return self.fields.get("error")

    @property
    def ms(self) -> Optional[float]:
        """How long the step (or the whole teardown, on ``teardown-end``) took, in ms."""
        return self._float("ms")

    @property
    def failed(self) -> bool:
        """Whether this is a step whose outcome is a failure or a timeout."""
        return self.event == "step" and self.outcome in FAILED_OUTCOMES

    def to_dict(self) -> dict[str, Any]:
        """``{"event": ..., key: value ...}`` with numbers as numbers (``index``, ``of``,
        ``ms`` ...) and ``true`` / ``false`` as booleans; other values as strings."""
        out: dict[str, Any] = {"event": self.event}
        for key, value in self.fields.items():
            converted: Any = value
            try:
                if key in INT_KEYS:
                    converted = int(value)
                elif key in FLOAT_KEYS:
                    converted = float(value)
                elif key in BOOL_KEYS and value in ("true", "false"):
                    converted = value == "true"
            except ValueError:
                converted = value
            out[key] = converted
        return out

    def describe(self) -> str:
        """One line for people: ``step 3/6 release device 'dev0' -> released_at_exit``."""
        if self.event == "step":
            where = f"{self.index}/{self.of}" if self.index is not None else "?"
            text = f"step {where} {self.action} {self.kind} {self.name!r} -> {self.outcome}"
            if self.error:
                text += f" ({self.error})"
            return text
        if self.event == "message":
            return self.fields.get("text", "")
        pairs = " ".join(f"{k}={v}" for k, v in self.fields.items() if k != "registry")
        registry = self.registry
        head = f"{self.event} [{registry}]" if registry is not None else self.event
        return f"{head} {pairs}".rstrip()


def parse_line(line: str) -> Optional[TeardownStep]:
    """Parse one line; `None` when it does not start with `exitsafe: `.

    The grammar is exitsafe's own (the same definitions the core writes with); a line that
    starts with `exitsafe: ` but is outside it (a logging message) becomes a `"message"`
    step.

    Args:
        line: one line of stderr, with or without its newline.

    Returns:
        The parsed line, or `None`.
    """
    line = line.rstrip("\r\n")
    if not line.startswith(PREFIX):
        return None
    parsed = parse_trace_line(line)
    if parsed is None:
        return TeardownStep("message", {"text": line[len(PREFIX) :]}, line)
    event, fields = parsed
    return TeardownStep(event, fields, line)


def parse_trace(text: str) -> list[TeardownStep]:
    """All exitsafe lines of `text`, in order.

    Args:
        text: a process's stderr, decoded.

    Returns:
        One [`TeardownStep`][exitsafe.testing.trace.TeardownStep] per `exitsafe: ` line.
    """
    steps = []
    for line in text.splitlines():
        step = parse_line(line)
        if step is not None:
            steps.append(step)
    return steps


@dataclass(frozen=True)
class RegistryTeardown:
    """The teardown of one registry, as the trace tells it.

    Attributes:
        registry: the registry's name.
        reason: why the teardown ran (``"atexit"``, ``"signal"``, ...), if traced.
        live: live handles when it began.
        hooks: teardown hooks when it began.
        planned: steps in the plan.
        steps: the ``step`` events, in order.
        finished: whether ``teardown-end`` was printed: a teardown that began and did not finish was
            cut short, by a crash during the step after the last one listed.
        released: handles released at exit, from ``teardown-end``.
        leaked: handles leaked at exit, from ``teardown-end``.
        failed: failed steps, from ``teardown-end``.
        ms: the teardown's duration in milliseconds, from ``teardown-end``.
        late_releases: release requests that came after the registry closed (no-ops).
    """

    registry: str
    reason: Optional[str] = None
    live: Optional[int] = None
    hooks: Optional[int] = None
    planned: Optional[int] = None
    steps: Sequence[TeardownStep] = ()
    finished: bool = False
    released: Optional[int] = None
    leaked: Optional[int] = None
    failed: Optional[int] = None
    ms: Optional[float] = None
    late_releases: int = 0

    @property
    def outcomes(self) -> dict[str, int]:
        """How many steps ended in each outcome (the ledger summary of the teardown)."""
        counts: dict[str, int] = {}
        for step in self.steps:
            outcome = step.outcome or "?"
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def describe(self) -> str:
        """One line: ``registry 'default' (atexit): 6 steps, released 3, leaked 2, failed 0``."""
        head = f"registry {self.registry!r}"
        if self.reason:
            head += f" ({self.reason})"
        if not self.finished:
            done = len(self.steps)
            planned = "?" if self.planned is None else str(self.planned)
            if self.planned is None and not self.steps and self.reason is None:
                return f"{head}: no teardown traced, {self.late_releases} late release(s)"
            return f"{head}: teardown did NOT finish: {done} of {planned} steps completed"
        return (
            f"{head}: {self.planned if self.planned is not None else len(self.steps)} steps, "
            f"released {self.released}, leaked {self.leaked}, failed {self.failed}"
            + (f", {self.late_releases} late release(s) ignored" if self.late_releases else "")
        )


def _as_int(value: Optional[str]) -> Optional[int]:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


class _Builder:
    """The mutable state of one registry's teardown while the trace is read."""

    def __init__(self, registry: str) -> None:
        self.registry = registry
        self.reason: Optional[str] = None
        self.live: Optional[int] = None
        self.hooks: Optional[int] = None
        self.planned: Optional[int] = None
        self.steps: list[TeardownStep] = []
        self.end: Optional[TeardownStep] = None
        self.late_releases = 0

    def build(self) -> RegistryTeardown:
        end = self.end
        return RegistryTeardown(
            registry=self.registry,
            reason=self.reason,
            live=self.live,
            hooks=self.hooks,
            planned=self.planned,
            steps=tuple(self.steps),
            finished=end is not None,
            released=None if end is None else _as_int(end.get("released")),
            leaked=None if end is None else _as_int(end.get("leaked")),
            failed=None if end is None else _as_int(end.get("failed")),
            ms=None if end is None else end.ms,
            late_releases=self.late_releases,
        )


def summarize(steps: Sequence[TeardownStep]) -> list[RegistryTeardown]:
    """Group trace events by registry, in order of first appearance.

    A registry whose teardown begins twice on the same stderr (a forked child's and its
    parent's) is reported once per `teardown-begin`.

    Args:
        steps: parsed trace lines, as [`parse_trace`][exitsafe.testing.trace.parse_trace]
            gives them.

    Returns:
        One [`RegistryTeardown`][exitsafe.testing.trace.RegistryTeardown] per registry
            teardown.
    """
    done: list[_Builder] = []
    open_: dict[str, _Builder] = {}
    for step in steps:
        name = step.registry
        if name is None or step.event == "message":
            continue
        builder = open_.get(name)
        if (
            step.event == "teardown-begin"
            and builder is not None
            and (builder.reason is not None or builder.steps or builder.end is not None)
        ):
            builder = None  # a second teardown of a registry with the same name
        if builder is None:
            builder = open_[name] = _Builder(name)
            done.append(builder)
        if step.event == "teardown-begin":
            builder.reason = step.get("reason")
            builder.live = _as_int(step.get("live"))
            builder.hooks = _as_int(step.get("hooks"))
        elif step.event == "plan":
            builder.planned = _as_int(step.get("steps"))
        elif step.event == "step":
            builder.steps.append(step)
        elif step.event == "teardown-end":
            builder.end = step
        elif step.event == "late-release":
            builder.late_releases += 1
    return [builder.build() for builder in done]

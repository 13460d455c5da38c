"""Parsers for what CPython prints on stderr when a process ends badly.

[`ExitResult`][exitsafe.testing.ExitResult] applies them for you; use them directly on a
stderr you captured some other way:

```python
from exitsafe.testing.parsers import parse_fatal_errors, parse_unraisable
```

and the exit-status decoders ([`decode_signal`][exitsafe.testing.parsers.decode_signal],
[`decode_ntstatus`][exitsafe.testing.parsers.decode_ntstatus],
[`describe_exit`][exitsafe.testing.parsers.describe_exit]). The teardown trace's parser is
[`exitsafe.testing.trace`][exitsafe.testing.trace].

* ``Fatal Python error: ...`` blocks, written by `faulthandler` when a fatal
  signal arrives (``Fatal Python error: Segmentation fault``) and by
  ``Py_FatalError`` (``Fatal Python error: _enter_buffered_busy: ...``), and
  ``Windows fatal exception: access violation`` blocks, with the thread stacks that
  follow them;
* "unraisable" exception blocks: ``Exception ignored in: <obj>`` and its variants
  (``Exception ignored in atexit callback <fn>:`` on 3.13+, ``Exception ignored while
  calling deallocator <fn>:`` on 3.14+), and ``Error in atexit._run_exitfuncs:`` from
  3.9-3.12, each with its traceback and exception line;
* an uncaught exception's traceback (``Traceback (most recent call last):`` at the
  top level).

The parsers never raise on their input; text they do not recognise is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

_FATAL = re.compile(r"^(?P<head>Fatal Python error|Windows fatal exception): ?(?P<msg>.*)$")
_THREAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread) (?P<id>0x[0-9a-fA-F]+)"
    r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):\s*$"
)
_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>-?\d+|\?+),? in (?P<func>.*?)\s*$')
_EXTENSIONS = re.compile(r"^Extension modules: (?P<mods>.*?)(?: \(total: \d+\))?\s*$")
_UNRAISABLE = re.compile(r"^Exception ignored(?P<rest>.*)$")
_ATEXIT_OLD = "Error in atexit._run_exitfuncs:"
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<msg>.*))?\s*$")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class Frame:
    """One Python frame of a thread dump.

    Attributes:
        file: the file name as printed.
        line: the line number, or `None` when the dump printed `???`.
        function: the function name.
    """

    file: str
    line: Optional[int]
    function: str

    def __str__(self) -> str:
        line = "?" if self.line is None else str(self.line)
        return f'File "{self.file}", line {line} in {self.function}'


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a fatal error's dump, frames most recent first.

    Attributes:
        frames: the thread's [`Frame`][exitsafe.testing.parsers.Frame]s, most recent first.
        thread_id: the thread identifier as printed (``"0x00007f2159b856c0"``), or ``None`` for a
            ``Stack (most recent call first):`` dump without threads.
        current: whether this is the thread that hit the error.
        name: the thread's name when the interpreter prints it (3.14+), else ``None``.
        notes: non-frame lines of the dump (``<no Python frame>``, ``...`` for a truncated stack,
            ``Garbage-collecting``).
    """

    thread_id: Optional[str]
    current: bool
    frames: Sequence[Frame] = ()
    name: Optional[str] = None
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class FatalError:
    """A ``Fatal Python error`` (or ``Windows fatal exception``) block.

    Attributes:
        message: the text after the colon (``"Segmentation fault"``, ``"_enter_buffered_busy: could
            not acquire lock ..."``, ``"access violation"``).
        windows: whether the header was ``Windows fatal exception``.
        runtime_state: the ``Python runtime state:`` line's value (``"finalizing (tstate=0x...)"``)
            when printed.
        threads: the thread stacks, in the printed order.
        extension_modules: the ``Extension modules:`` list (3.12+).
        text: the whole block as printed.
    """

    message: str
    windows: bool = False
    runtime_state: Optional[str] = None
    threads: Sequence[ThreadStack] = ()
    extension_modules: Sequence[str] = ()
    text: str = ""

    @property
    def current_thread(self) -> Optional[ThreadStack]:
        """The thread that crashed (the ``Current thread`` one), else the first dumped."""
        for thread in self.threads:
            if thread.current:
                return thread
        return self.threads[0] if self.threads else None

    @property
    def top_frames(self) -> Sequence[Frame]:
        """The crashing thread's frames, most recent first."""
        thread = self.current_thread
        return () if thread is None else thread.frames

    @property
    def during_finalization(self) -> bool:
        """Whether CPython said it was finalizing when the error happened."""
        return bool(self.runtime_state and self.runtime_state.startswith("finaliz"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (see the JSON schema in the testing docs)."""
        return {
            "message": self.message,
            "windows": self.windows,
            "runtime_state": self.runtime_state,
            "threads": [
                {
                    "thread_id": t.thread_id,
                    "current": t.current,
                    "name": t.name,
                    "frames": [
                        {"file": f.file, "line": f.line, "function": f.function}
                        for f in t.frames
                    ],
                    "notes": list(t.notes),
                }
                for t in self.threads
            ],
            "extension_modules": list(self.extension_modules),
        }


@dataclass(frozen=True)
class ExceptionReport:
    """An exception as the interpreter printed it.

    Attributes:
        context: for an unraisable exception, where it was ignored as printed (``"in: <function
            Foo.__del__ at 0x7f...>"``, ``"in atexit callback <fn>:"``,
            ``"atexit._run_exitfuncs"``); for an uncaught one, ``"uncaught"``.
        object: the repr of the object whose finalizer or callback raised (``"<function Foo.__del__
            at 0x7f...>"``), when printed.
        exc_type: the exception's type name (``"ZeroDivisionError"``); ``None`` when no exception
            line was found.
        message: the exception's message (``"division by zero"``), ``""`` if none.
        traceback: the ``Traceback ...`` lines, ``""`` if none was printed.
        text: the whole block as printed.
    """

    context: str
    object: Optional[str]
    exc_type: Optional[str]
    message: str
    traceback: str
    text: str

    @property
    def where(self) -> str:
        """The object (or context) without memory addresses, stable from run to run:
        ``<function Foo.__del__>``."""
        return _ADDRESS.sub("", self.object if self.object is not None else self.context)

    def describe(self) -> str:
        """One line: ``ZeroDivisionError: division by zero in <function Foo.__del__>``."""
        exc = self.exc_type or "an exception"
        if self.message:
            exc += f": {self.message}"
        if self.context == "uncaught":
            return exc
        return f"{exc} in {self.where}"


Unraisable = ExceptionReport
"""Another name of [`ExceptionReport`][exitsafe.testing.parsers.ExceptionReport], for an
"Exception ignored ..." block (an exception Python could not raise to a caller)."""


class _ThreadBuilder:
    def __init__(self, thread_id: Optional[str], current: bool, name: Optional[str]) -> None:
        self.thread_id = thread_id
        self.current = current
        self.name = name
        self.frames: list[Frame] = []
        self.notes: list[str] = []

    def build(self) -> ThreadStack:
        return ThreadStack(
            self.thread_id, self.current, tuple(self.frames), self.name, tuple(self.notes)
        )


def _parse_fatal(lines: Sequence[str], start: int) -> tuple[FatalError, int]:
    head = _FATAL.match(lines[start])
    assert head is not None
    runtime_state: Optional[str] = None
    extensions: list[str] = []
    threads: list[_ThreadBuilder] = []
    index = start + 1
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        thread = threads[-1] if threads else None
        header = _THREAD.match(line)
        frame = _FRAME.match(line) if thread is not None else None
        if header is not None:
            threads.append(_ThreadBuilder(header["id"], bool(header["current"]), header["name"]))
        elif _STACK.match(line):
            threads.append(_ThreadBuilder(None, True, None))
        elif thread is not None and frame is not None:
            number = frame["line"]
            line_no = int(number) if number.lstrip("-").isdigit() else None
            thread.frames.append(Frame(frame["file"], line_no, frame["func"]))
        elif thread is not None and stripped and (
            line.startswith((" ", "\t")) or (stripped.startswith("<") and stripped.endswith(">"))
        ):
            thread.notes.append(stripped)  # 3.9 prints "<no Python frame>" unindented
        elif line.startswith("Python runtime state: "):
            runtime_state = line[len("Python runtime state: ") :].strip()
        elif (mods := _EXTENSIONS.match(line)) is not None:
            extensions.extend(m.strip() for m in mods["mods"].split(",") if m.strip())
        elif not stripped:
            pass  # blank lines separate the parts of the block
        elif (
            thread is None
            and not line.startswith("exitsafe: ")
            and (
                line.startswith((_TRACEBACK, " ", "\t", "During handling", "The above exception"))
                or _EXCEPTION_LINE.match(line)
            )
        ):
            pass  # the pending exception Py_FatalError prints before the stacks
        else:
            break
        index += 1
    end = index
    while end > start and not lines[end - 1].strip():
        end -= 1
    error = FatalError(
        message=head["msg"].strip(),
        windows=head["head"].startswith("Windows"),
        runtime_state=runtime_state,
        threads=tuple(t.build() for t in threads),
        extension_modules=tuple(extensions),
        text="\n".join(lines[start:end]),
    )
    return error, index


def parse_fatal_errors(text: str) -> list[FatalError]:
    """Every fatal error block in `text`, in order (usually one).

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        One [`FatalError`][exitsafe.testing.parsers.FatalError] per `Fatal Python error` /
        `Windows fatal exception` block, with the thread stacks that follow it.
    """
    lines = text.splitlines()
    out = []
    index = 0
    while index < len(lines):
        if _FATAL.match(lines[index]):
            error, index = _parse_fatal(lines, index)
            out.append(error)
        else:
            index += 1
    return out


def _split_context(rest: str) -> tuple[str, Optional[str]]:
    """``" in: <obj>"`` -> (context, object); ``" in atexit callback <f>:"`` -> ..."""
    context = rest.strip()
    if context.startswith("in: "):
        return context, context[4:].strip() or None
    body = context[:-1] if context.endswith(":") else context
    if ": " in body:
        return context, body.split(": ", 1)[1].strip() or None
    angle = body.find("<")
    if angle != -1 and body.endswith(">"):
        return context, body[angle:]
    return context, None


def _parse_exception(
    lines: Sequence[str], header: int, start: int, context: str, obj: Optional[str]
) -> tuple[ExceptionReport, int]:
    """Read a traceback (optional) and an exception line from ``lines[start]``; the block
    as printed begins at ``lines[header]``."""
    index = start
    traceback: list[str] = []
    exc_type: Optional[str] = None
    message = ""
    if index < len(lines) and lines[index].startswith(_TRACEBACK):
        traceback.append(lines[index])
        index += 1
        while index < len(lines) and lines[index].startswith((" ", "\t")):
            traceback.append(lines[index])
            index += 1
    if index < len(lines) and not _FATAL.match(lines[index]):
        match = _EXCEPTION_LINE.match(lines[index])
        if match and not lines[index].startswith(("Exception ignored", "exitsafe: ")):
            exc_type, message = match["type"], (match["msg"] or "").strip()
            index += 1
    return (
        ExceptionReport(
            context=context,
            object=obj,
            exc_type=exc_type,
            message=message,
            traceback="\n".join(traceback),
            text="\n".join(lines[header:index]),
        ),
        index,
    )


def parse_unraisable(text: str) -> list[ExceptionReport]:
    """Every "Exception ignored ..." block in `text`, in order.

    3.9 to 3.12's `Error in atexit._run_exitfuncs:` blocks count too.

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        One [`ExceptionReport`][exitsafe.testing.parsers.ExceptionReport] per block.
    """
    lines = text.splitlines()
    out = []
    index = 0
    while index < len(lines):
        line = lines[index]
        match = _UNRAISABLE.match(line)
        if match is not None:
            context, obj = _split_context(match["rest"])
            report, index = _parse_exception(lines, index, index + 1, context, obj)
            out.append(report)
        elif line.strip() == _ATEXIT_OLD:
            report, index = _parse_exception(lines, index, index + 1, "atexit._run_exitfuncs", None)
            out.append(report)
        else:
            index += 1
    return out


def parse_uncaught(text: str) -> Optional[ExceptionReport]:
    """The last top-level uncaught exception traceback in `text`, if any.

    A traceback introduced by an "Exception ignored" or `Error in atexit` line does not
    count.

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        The exception, or `None` when the program printed none.
    """
    lines = text.splitlines()
    found: Optional[ExceptionReport] = None
    for index, line in enumerate(lines):
        if line != _TRACEBACK:
            continue
        previous = lines[index - 1] if index else ""
        if _UNRAISABLE.match(previous) or previous.strip() == _ATEXIT_OLD:
            continue
        found, _ = _parse_exception(lines, index, index, "uncaught", None)
    return found


from ._decode import decode_ntstatus, decode_signal, describe_exit  # noqa: E402

__all__ = [
    "ExceptionReport",
    "FatalError",
    "Frame",
    "ThreadStack",
    "Unraisable",
    "decode_ntstatus",
    "decode_signal",
    "describe_exit",
    "parse_fatal_errors",
    "parse_uncaught",
    "parse_unraisable",
]

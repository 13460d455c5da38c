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
  top level);
* a thread's uncaught exception (``Exception in thread NAME:`` and its traceback, printed
  by `threading.excepthook`);
* the headers of those blocks when another thread's output shares their line (two threads
  writing to stderr at exit: ``Exception in thread writer:Exception ignored in: <...>``);
* the lines native libraries print right before they abort or when one of their checks
  fails: an assertion (glibc's ``...: Assertion `x' failed.``, libzmq's ``Assertion failed:
  ... (src/file.cpp:12)``), Qt's ``QThread: Destroyed while thread is still running``, a
  C++ ``terminate called ...``, glibc's heap checks, a Rust panic, a JVM fatal error, the
  lab runtime's ``FATAL: ...`` (see `NATIVE_FATAL`).

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
#: CPython 3.14+'s faulthandler follows the Python stacks with the C stack of the crashing
#: thread ("Current thread's C stack trace (most recent call first):", then indented
#: ``Binary file "...", at symbol+0x...`` lines, or ``<cannot get C stack on this system>``):
#: part of the block, not one of its threads.
_C_STACK = re.compile(r"^.*\bC stack trace \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>-?\d+|\?+),? in (?P<func>.*?)\s*$')
_EXTENSIONS = re.compile(r"^Extension modules: (?P<mods>.*?)(?: \(total: \d+\))?\s*$")
_UNRAISABLE = re.compile(r"^Exception ignored(?P<rest>.*)$")
_ATEXIT_OLD = "Error in atexit._run_exitfuncs:"
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<msg>.*))?\s*$")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_THREAD_EXCEPTION = re.compile(r"^Exception in thread (?P<name>.*):\s*$")
#: The start of a thread's header at the very end of the output, no colon yet: the daemon
#: thread printing its uncaught exception was stopped by the end of the process.
_THREAD_EXCEPTION_CUT = re.compile(r"^Exception in thread(?: (?P<name>[^:]*))?$")
#: A thread's exception header anywhere in a line, when nothing but the end of the line or
#: another block's header follows it on that line (two threads writing to stderr at once:
#: ``Exception in thread writer:Exception ignored in: <...>``).
_THREAD_EXCEPTION_GLUED = re.compile(
    r"Exception in thread (?P<name>.+?):"
    r"(?=\s*$|Exception ignored |Exception in thread |Traceback \(most recent call last\):)"
)
#: An "Exception ignored ..." header written after other text on a line: the rest of the
#: line must look like a whole header (it ends with the object's repr or a colon).
_UNRAISABLE_GLUED = re.compile(r"Exception ignored (?:in|on|while)\b.*[>:]\s*$")

#: Lines a native library prints when it aborts the process or one of its own checks fails:
#: (label, pattern matched at the start of a line).  A match makes a run not clean, whatever
#: its exit status.  The label says what kind of message it is; the diagnosis chooses its hint
#: from it (and from the message itself for the ones it knows, such as Qt's QThread).
NATIVE_FATAL: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Qt", re.compile(r"^QThread: Destroyed while thread (?:'.*' )?is still running")),
    ("Qt", re.compile(r"^ASSERT(?: failure in [^:]*)?: .* in file .*, line \d+")),
    ("assertion", re.compile(r"^Assertion failed: .*\(.*:\d+\)\s*$")),
    ("assertion", re.compile(r"^.*:\d+: .*: Assertion [`'].*' failed\.\s*$")),
    ("C++ runtime", re.compile(r"^terminate called ")),
    ("C++ runtime", re.compile(r"^pure virtual method called")),
    ("C++ runtime", re.compile(r"^FATAL: exception not rethrown")),
    # (its heap checks name the function that found the damage: ``free(): invalid
    # pointer``, ``malloc_consolidate(): invalid chunk size``, ``_int_free(): invalid
    # size``, ``tcache_thread_shutdown(): unaligned tcache chunk detected``...)
    ("glibc", re.compile(
        r"^(?:double free or corruption|corrupted (?:size|double-linked)|Fatal glibc error: "
        r"|(?:_int_)?(?:free|malloc|realloc|calloc|memalign)\(\): "
        r"|(?:munmap|mremap)_chunk\(\): |malloc_consolidate\(\): "
        r"|tcache_thread_shutdown\(\): )"
    )),
    ("glibc", re.compile(r"^\*\*\* .* \*\*\*: terminated")),
    ("glog", re.compile(r"^F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")),
    ("Rust", re.compile(r"^thread '.*' panicked at ")),
    ("Rust", re.compile(r"^fatal runtime error: ")),
    ("JVM", re.compile(r"^# A fatal error has been detected by the Java Runtime Environment")),
    ("native", re.compile(r"^FATAL: ")),
)


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


@dataclass(frozen=True)
class NativeFatal:
    """A line a native library printed when it aborted or one of its checks failed.

    Attributes:
        line: the line as printed (trailing spaces removed).
        source: what kind of message it is: ``"Qt"``, ``"assertion"``, ``"C++ runtime"``,
            ``"glibc"``, ``"glog"``, ``"Rust"``, ``"JVM"`` or ``"native"`` (a ``FATAL:`` line).
        number: its line number in stderr (1-based).
    """

    line: str
    source: str
    number: int = 0
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
    c_stack = False  # in the C stack that 3.14+ prints after the Python stacks
    index = start + 1
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        thread = threads[-1] if threads else None
        header = _THREAD.match(line)
        frame = _FRAME.match(line) if thread is not None else None
        if c_stack and stripped and (
            line.startswith((" ", "\t")) or (stripped.startswith("<") and stripped.endswith(">"))
        ):
            pass  # one line of the C stack: kept in the block's text only
        elif _C_STACK.match(line):
            c_stack = True
        elif header is not None:
            c_stack = False
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
    index = _past_trace_lines(lines, start)
    traceback: list[str] = []
    exc_type: Optional[str] = None
    message = ""
    if index < len(lines) and lines[index].startswith(_TRACEBACK):
        traceback.append(lines[index])
        index = _past_trace_lines(lines, index + 1)
        while index < len(lines) and lines[index].startswith((" ", "\t")):
            traceback.append(lines[index])
            index = _past_trace_lines(lines, index + 1)
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


def _past_trace_lines(lines: Sequence[str], index: int) -> int:
    """The first line from ``index`` on that is not one of exitsafe's trace lines: another
    thread (the exiting one) may write whole trace lines between the lines of a traceback
    that a thread is printing (a thread listing at exit, seen on CPython 3.14 in CI)."""
    while index < len(lines) and _TRACE_LINE.match(lines[index]):
        index += 1
    return index


def _glued_cut(line: str) -> Optional[int]:
    """Where, in `line`, the first exception header that another writer glued onto it
    begins (a header after other text, or text after a thread's header), or `None`."""
    if "Exception " not in line:
        return None
    cuts = []
    for match in _THREAD_EXCEPTION_GLUED.finditer(line):
        cuts.append(match.start())
        if line[match.end() :].strip():
            cuts.append(match.end())
    unraisable = _UNRAISABLE_GLUED.search(line, 1)
    if unraisable is not None:
        cuts.append(unraisable.start())
    return min((cut for cut in cuts if cut > 0), default=None)


def _unglue(text: str) -> tuple[list[str], frozenset[int]]:
    """`text`'s lines, each exception header that shares a line with other text put on a
    line of its own; and the indexes of the lines so cut off the end of another.

    When two threads write to stderr at once (at exit: a daemon thread's uncaught exception
    and a finalizer's "Exception ignored" block), one's header can end up in the middle of
    the other's line: ``Exception in thread writer:Exception ignored in: <...>``, or
    ``output without a newlineException in thread worker:``.  A header is cut off only
    where it can be one: a thread's header must end its line or be followed by another
    header; an "Exception ignored" header must be the rest of the line.
    """
    lines: list[str] = []
    glued: set[int] = set()
    for line in text.splitlines():
        cut = _glued_cut(line)
        while cut is not None:
            lines.append(line[:cut])
            glued.add(len(lines))
            line = line[cut:]
            cut = _glued_cut(line)
        lines.append(line)
    return lines, frozenset(glued)


def parse_unraisable(text: str) -> list[ExceptionReport]:
    """Every "Exception ignored ..." block in `text`, in order.

    3.9 to 3.12's `Error in atexit._run_exitfuncs:` blocks count too.  A header that
    another writer's text shares a line with (``Exception in thread w:Exception ignored
    in: <...>``) counts when it is the rest of its line and a traceback or a ``Type:
    message`` line follows it.

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        One [`ExceptionReport`][exitsafe.testing.parsers.ExceptionReport] per block.
    """
    lines, glued = _unglue(text)
    out = []
    index = 0
    while index < len(lines):
        line = lines[index]
        match = _UNRAISABLE.match(line)
        if match is not None:
            context, obj = _split_context(match["rest"])
            start = index
            report, index = _parse_exception(lines, index, index + 1, context, obj)
            if start in glued and not (report.traceback or report.message):
                index = start + 1  # text that merely ends like a header
                continue
            out.append(report)
        elif line.strip() == _ATEXIT_OLD:
            report, index = _parse_exception(lines, index, index + 1, "atexit._run_exitfuncs", None)
            out.append(report)
        else:
            index += 1
    return out


_TRACE_EVENTS = (
    "thread", "teardown-begin", "plan", "step-begin", "step", "teardown-end", "late-release",
    "audit-begin", "audit-release", "audit-repeat",
)
_TRACE_INSIDE = re.compile(
    r"exitsafe: (?:" + "|".join(re.escape(e) for e in _TRACE_EVENTS) + r") [a-z_]+="
)


#: A whole line of exitsafe's trace (any event: ``exitsafe: EVENT key=value ...``).
_TRACE_LINE = re.compile(r"exitsafe: [a-z][a-z_-]* [a-z_]+=")


def untangle(text: str) -> str:
    """`text` with every exitsafe trace line that was written into the middle of another
    line (a thread listing written while another thread was printing its traceback) put
    on a line of its own, and the line it cut joined again.

    Args:
        text: a process's stderr, decoded.

    Returns:
        The same text, with ``"Exception in thread exitsafe: thread ...\nname:"`` made
            ``"exitsafe: thread ...\nException in thread name:"``.
    """
    if "exitsafe: " not in text:
        return text
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        match = _TRACE_INSIDE.search(line, 1)
        if match is None:
            out.append(line)
            index += 1
            continue
        prefix, trace = line[: match.start()], line[match.start() :]
        out.append(trace)
        if index + 1 < len(lines):
            lines[index + 1] = prefix + lines[index + 1]
        else:
            out.append(prefix)
        index += 1
    return "\n".join(out)


def parse_thread_exceptions(text: str) -> list[ExceptionReport]:
    """Every ``Exception in thread NAME:`` block in `text` (what `threading.excepthook`
    prints for a thread's uncaught exception), in order.

    A header that shares its line with other text counts too (two threads writing to
    stderr at once): at the start of the line followed by another block's header
    (``Exception in thread writer:Exception ignored in: <...>``), or at the end of a line
    after other text (``...no newlineException in thread worker:``) when a traceback
    follows it; a line that merely mentions ``Exception in thread NAME:`` (a quoted log
    message) does not.  When another block's header comes between a thread's header and
    its traceback, that block is stepped over: the thread's traceback is the one after it.
    A header cut off at the very end of `text` (``Exception in thread recei``: the process
    ended while a daemon thread printed it) counts too, with no exception type and the
    message ``its report was cut off when the process ended``.

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        One [`ExceptionReport`][exitsafe.testing.parsers.ExceptionReport] per block, whose
            `context` is ``"thread NAME"`` and `object` the thread's name.
    """
    lines, glued = _unglue(text)
    reports = [report for report, _ in _thread_blocks(lines, glued)]
    cut = _THREAD_EXCEPTION_CUT.match(lines[-1]) if lines else None
    if cut is not None:  # the process ended while the thread printed its header
        name = cut["name"] or "?"
        reports.append(ExceptionReport(
            f"thread {name}", name, None, "its report was cut off when the process ended",
            "", lines[-1],
        ))
    return reports


def _is_block_header(line: str) -> bool:
    """Whether `line` begins an exception block: "Exception ignored", `Error in atexit`,
    or a thread's header."""
    return bool(
        _UNRAISABLE.match(line)
        or line.strip() == _ATEXIT_OLD
        or _THREAD_EXCEPTION.match(line)
    )


def _thread_blocks(
    lines: Sequence[str], glued: frozenset[int]
) -> list[tuple[ExceptionReport, int]]:
    """Each thread exception block of `lines` (unglued), with the index of the line where
    its traceback begins (the block's own, after any other block stepped over)."""
    out = []
    index = 0
    while index < len(lines):
        match = _THREAD_EXCEPTION.match(lines[index])
        if match is None:
            index += 1
            continue
        header, name = index, match["name"]
        start = _past_trace_lines(lines, header + 1)
        stepped = False
        while start < len(lines) and _is_block_header(lines[start]):
            # another writer's block printed between this header and its traceback
            _, start = _parse_exception(lines, start, start + 1, "", None)
            start = _past_trace_lines(lines, start)
            stepped = True
        report, end = _parse_exception(lines, header, start, f"thread {name}", name)
        if header in glued and not report.traceback:
            index = header + 1  # a line that merely ends like a header: not a block
            continue
        # a block stepped over is read on its own: go on after this header, not its block
        index = header + 1 if stepped else end
        out.append((report, start))
    return out


def parse_native_fatal(text: str) -> list[NativeFatal]:
    """Every line of `text` that a native library prints when it aborts or one of its
    checks fails (the patterns of `NATIVE_FATAL`), in order.

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        One [`NativeFatal`][exitsafe.testing.parsers.NativeFatal] per such line.
    """
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("exitsafe: "):
            continue
        for source, pattern in NATIVE_FATAL:
            if pattern.match(line):
                out.append(NativeFatal(line.rstrip(), source, number))
                break
    return out


def parse_uncaught(text: str) -> Optional[ExceptionReport]:
    """The last top-level uncaught exception traceback in `text`, if any.

    A traceback introduced by an "Exception ignored", an `Error in atexit` or an
    `Exception in thread` line does not count, nor one that
    [`parse_thread_exceptions`][exitsafe.testing.parsers.parse_thread_exceptions] gives to
    a thread (after another block printed between its header and its traceback).

    Args:
        text: a process's stderr (or any text holding it), decoded.

    Returns:
        The exception, or `None` when the program printed none.
    """
    lines, glued = _unglue(text)
    threads = {start for _, start in _thread_blocks(lines, glued)}
    found: Optional[ExceptionReport] = None
    for index, line in enumerate(lines):
        if line != _TRACEBACK or index in threads:
            continue
        previous = lines[index - 1] if index else ""
        if (
            _UNRAISABLE.match(previous)
            or previous.strip() == _ATEXIT_OLD
            or _THREAD_EXCEPTION.match(previous)
        ):
            continue
        found, _ = _parse_exception(lines, index, index, "uncaught", None)
    return found


from ._decode import decode_ntstatus, decode_signal, describe_exit  # noqa: E402

__all__ = [
    "NATIVE_FATAL",
    "ExceptionReport",
    "FatalError",
    "Frame",
    "NativeFatal",
    "ThreadStack",
    "Unraisable",
    "decode_ntstatus",
    "decode_signal",
    "describe_exit",
    "parse_fatal_errors",
    "parse_native_fatal",
    "parse_thread_exceptions",
    "parse_uncaught",
    "parse_unraisable",
    "untangle",
]

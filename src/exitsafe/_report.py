"""Reporting: the ``exitsafe`` logger and the teardown trace lines on stderr.

Trace lines (``EXITSAFE_TRACE=1``) start with ``exitsafe: `` followed by an event word
and ``key=value`` pairs; a value is a bare token or a JSON string.  ``exitsafe.testing``
parses them back.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def log() -> Any:
    """The ``exitsafe`` logger (``logging`` is imported only when something is logged)."""
    import logging

    return logging.getLogger("exitsafe")


def quote(text: str) -> str:
    """Quote a trace value as a JSON string."""
    out = ['"']
    for ch in text:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def emit(line: str) -> None:
    """Write one trace line to stderr, best effort."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):
        # stderr closed or broken at exit: the trace is best effort and must not
        # turn a clean exit into a crash.
        pass

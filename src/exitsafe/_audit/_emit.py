"""Writing the audit's trace lines on stderr, at once (``os.write`` on fd 2, so a crash
right after loses nothing): ``exitsafe: EVENT key=value ...``, values quoted unless
written bare."""

from __future__ import annotations

import os

_write = os.write  # kept: module globals may be gone late in finalization


class Bare(str):
    """A trace value written without quotes (a token without spaces)."""


def _quote(text: str) -> str:
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


def emit(event: str, **fields: object) -> None:
    parts = [f"exitsafe: {event}"]
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, Bare):
            parts.append(f"{key}={value}")
        elif isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, int):
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={_quote(str(value))}")
    try:
        _write(2, (" ".join(parts) + "\n").encode("utf-8", "replace"))
    except Exception:
        pass

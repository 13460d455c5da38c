"""Reporting: the ``exitsafe`` logger and the teardown trace lines on stderr.

Trace lines (``EXITSAFE_TRACE=1``) are formatted by `exitsafe._ledger.trace_line`,
whose grammar ``exitsafe.testing`` parses back.
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


def log_if_loaded() -> Any:
    """The ``exitsafe`` logger if ``logging`` is already imported, else ``None``.

    For a thread that may be frozen at any moment of the exit (a parked daemon thread),
    which must import nothing: an import frozen half-way holds the import locks that the
    main thread's finalization still takes.  A program that never imported ``logging``
    configured no handler that would show an ``INFO`` record.
    """
    logging = _fully_imported("logging")
    return None if logging is None else logging.getLogger("exitsafe")


def _fully_imported(name: str) -> Any:
    """The module ``name`` if its import has finished, else ``None`` (not imported, or
    being imported, maybe by another thread: its names may not exist yet).  Imports
    nothing; asks as importlib itself does, by the module's ``__spec__._initializing``."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def error_from_finalizer(message: str, *args: object) -> None:
    """Log an error from code a garbage collection runs (a handle's finalizer), which may
    be inside any import of the program: through ``logging`` when it is fully imported,
    else as one line on stderr, as ``logging``'s last resort would print it.  Imports
    nothing: importing ``logging`` there could find one of its own imports (``threading``)
    half-executed, and fail."""
    logging = _fully_imported("logging")
    if logging is not None:
        logging.getLogger("exitsafe").error(message, *args)
    else:
        emit(message % args)


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

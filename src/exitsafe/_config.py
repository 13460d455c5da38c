"""Process-wide settings read from the environment.

Each variable is read when it is needed (at teardown, at exit), so a program
may still set it in ``os.environ`` before it exits.  A bad value is reported
once per process through the ``exitsafe`` logger and the documented default is
used instead; it never raises.

``EXITSAFE_AT_EXIT``          ``release`` | ``leak`` | ``policy`` (default ``policy``).
``EXITSAFE_TRACE``            ``1``/``true``/``yes``/``on`` prints the teardown to stderr.
``EXITSAFE_LEDGER``           a path; the ledger is written there as JSON at exit
                              (``{pid}`` in the path is replaced by the process id,
                              ``{interp}`` by the interpreter's id; a subinterpreter
                              whose path has no ``{interp}`` writes ``<stem>.interp-<id>
                              <suffix>`` next to it: see `ledger_path`).
``EXITSAFE_STEP_TIMEOUT``     seconds (float > 0) each teardown step may take.
``EXITSAFE_TEARDOWN_TIMEOUT`` seconds (float > 0) the whole teardown may take.
``EXITSAFE_QUIESCE``          ``1``/``true``/``yes``/``on``, or a number of seconds: when
                              exitsafe is imported, ``exitsafe.quiesce()`` (every thread;
                              that bound, else 5 seconds).  Read once, at import.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_warned: set[tuple[str, str]] = set()

AT_EXIT_CHOICES = ("release", "leak", "policy")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def warn_once(var: str, value: str, message: str) -> None:
    """Log ``message`` about ``var=value`` once per process."""
    key = (var, value)
    if key in _warned:
        return
    _warned.add(key)
    import logging

    logging.getLogger("exitsafe").warning("%s=%r is not valid: %s", var, value, message)


def at_exit_override() -> Optional[str]:
    """``"release"`` or ``"leak"`` when ``EXITSAFE_AT_EXIT`` overrides policies, else ``None``."""
    raw = os.environ.get("EXITSAFE_AT_EXIT")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("release", "leak"):
        return value
    if value in ("policy", ""):
        return None
    warn_once(
        "EXITSAFE_AT_EXIT",
        raw,
        "expected one of release, leak, policy; using 'policy' (each handle's own exit policy)",
    )
    return None


def trace_enabled() -> bool:
    """Whether ``EXITSAFE_TRACE`` asks for the teardown trace on stderr."""
    raw = os.environ.get("EXITSAFE_TRACE")
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        warn_once("EXITSAFE_TRACE", raw, "expected 1 or 0; tracing stays off")
    return False


def seconds(var: str) -> Optional[float]:
    """A positive number of seconds from ``var``, or ``None`` when unset or invalid."""
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        warn_once(var, raw, "expected a positive number of seconds; no timeout is applied")
        return None
    return value


def ledger_path() -> Optional[str]:
    """Where to write the ledger at exit (``EXITSAFE_LEDGER``), with ``{pid}`` expanded.

    Every interpreter of the process that imports exitsafe writes its own ledger at its
    end, so each gets a file of its own: ``{interp}`` in the path is replaced by the
    interpreter's id (``0`` for the main interpreter); without it, the main interpreter
    writes the path as given and a subinterpreter inserts ``.interp-<id>`` before the
    suffix (``ledger.json`` -> ``ledger.interp-3.json``).  (Each wrote the path as given,
    the last one to end overwriting the others' outcomes.)
    """
    raw = os.environ.get("EXITSAFE_LEDGER")
    if not raw:
        return None
    path = raw.replace("{pid}", str(os.getpid()))
    interp = interpreter_id()
    if "{interp}" in path:
        return path.replace("{interp}", str(interp))
    if interp:
        stem, suffix = os.path.splitext(path)
        return f"{stem}.interp-{interp}{suffix}"
    return path


#: `interpreter_id`, once asked (exitsafe's modules are each interpreter's own).
_interpreter_id: list[int] = []


def interpreter_id() -> int:
    """The id of the interpreter running this code: ``0`` for the main interpreter (also
    where CPython offers no way to ask, having no subinterpreters to run Python code).

    Worked out once (see `remember_interpreter_id`): asking imports a module, and an
    import at exit takes the import system's locks, which a signal handler may have
    interrupted this thread holding.
    """
    if not _interpreter_id:
        _interpreter_id.append(_ask_interpreter_id())
    return _interpreter_id[0]


def remember_interpreter_id() -> None:
    """Work out `interpreter_id` now (at import), if the ledger's path will need it."""
    if os.environ.get("EXITSAFE_LEDGER"):
        interpreter_id()


def _ask_interpreter_id() -> int:
    import importlib

    for name in ("_interpreters", "_xxsubinterpreters"):  # (3.13+; 3.8-3.12)
        try:
            api = importlib.import_module(name)
            current = api.get_current()
        except Exception:  # missing, or refused in this interpreter: try the other
            continue
        if isinstance(current, tuple):  # 3.13+: (id, whence)
            current = current[0]
        return int(current)
    return 0


def quiesce_bound() -> Optional[float]:
    """The bound ``EXITSAFE_QUIESCE`` asks all threads to be quiesced with, or ``None``
    (unset, false, or not valid: reported)."""
    raw = os.environ.get("EXITSAFE_QUIESCE")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _FALSE:
        return None
    if value in _TRUE:
        return 5.0
    try:
        bound = float(value)
    except ValueError:
        bound = -1.0
    if not 0 < bound < float("inf"):
        warn_once(
            "EXITSAFE_QUIESCE", raw,
            "expected 1/true/yes/on or a positive number of seconds; threads are not quiesced",
        )
        return None
    return bound

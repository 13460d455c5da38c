"""Argument checks shared by the registration functions: each raises the error a user
expects (``TypeError`` for a wrong type, ``ValueError`` for a wrong value), naming the
argument.  No state; importing it is free."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["check_name", "check_policy", "check_timeout"]


def check_policy(policy: object, what: str) -> None:
    """Raise ``TypeError`` unless ``policy`` is ``"release"``, ``"leak"`` or a callable."""
    if policy in ("release", "leak") or callable(policy):
        return
    if isinstance(policy, str):
        raise ValueError(f"{what} must be 'release', 'leak' or a callable, got {policy!r}")
    raise TypeError(f"{what} must be 'release', 'leak' or a callable, got {policy!r}")


def check_timeout(timeout: object, what: str) -> Optional[float]:
    """``timeout`` as a float, or ``None``; ``TypeError`` / ``ValueError`` naming ``what``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, got {type(timeout).__name__}")
    try:
        value = float(timeout)
    except OverflowError:
        value = float("inf")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {timeout!r}")
    from . import _steps  # imported on first use: importing exitsafe stays cheap

    _steps.prepare()  # a worker thread must exist before shutdown forbids starting one
    return value


def check_name(name: object, what: str = "name") -> None:
    """Raise ``TypeError`` unless ``name`` is a str or ``None``."""
    if name is not None and type(name) is not str:
        raise TypeError(f"{what} must be a str or None, got {type(name).__name__}")


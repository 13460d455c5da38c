"""Process-level state: every registry's state, what is kept for the life of the process,
and how far the process's exit has come.

The lowest layer of exitsafe's process handling: it imports nothing of exitsafe but the
lock.  The exit teardown, the fork handlers and the ledger file are `exitsafe._exit`,
which reads and moves the state kept here.
"""

from __future__ import annotations

from _weakref import ref as _weakref

from . import _sync

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


#: Weak references to registries' states, oldest first (some may be dead).
_registries: list[Any] = []
#: `register` drops the dead references once `_registries` grows to this length, then
#: sets it to twice the live ones plus 16: O(1) amortized per registry.
_prune_at: list[int] = [16]
#: Registries with hooks, kept alive until their teardown (a hook is owned by its
#: registry: dropping the registry object must not drop the hook).
_kept: dict[int, Any] = {}
#: The exit teardown's progress: "open" -> "exiting" -> "exited".
_exit_phase: list[str] = ["open"]
#: Whether `teardown_all` began: the process is ending (at exit, on a signal, by
#: exitsafe.exit, in a multiprocessing worker), not one registry closing.
_ending: list[bool] = [False]
#: Objects kept referenced for the life of the process: the raw objects of leaked
#: handles and pinned libraries that must never be unloaded by exitsafe's doing.
_kept_alive: list[object] = []


def register(state: Any) -> bool:
    """Remember a registry's ``state`` (weakly) for the exit teardown.

    Returns ``False`` when the exit teardown has already finished: the registry then
    starts closed.  O(1) amortized: the dead references are dropped in bulk, once they
    are as many as the live ones (plus 16).
    """

    def add() -> bool:
        if len(_registries) >= _prune_at[0]:
            _registries[:] = [r for r in _registries if r() is not None]
            _prune_at[0] = 2 * len(_registries) + 16
        _registries.append(_weakref(state))
        return _exit_phase[0] != "exited"

    if _sync.reentered():  # (a finalizer inside a section on this thread: it holds the lock)
        return add()
    return _sync.locked("Registry()", add)


def keep_until_teardown(state: Any) -> None:
    """Keep a registry's ``state`` alive until its teardown (it has hooks to run)."""
    _kept[id(state)] = state


def release_kept(state: Any) -> None:
    """``state``'s teardown ran: it need not be kept any more."""
    _kept.pop(id(state), None)


def states() -> list[Any]:
    """Every registry's state still alive, oldest first (the exit teardown goes newest
    first)."""
    found = [r() for r in list(_registries)]
    return [r for r in found if r is not None]


def keep_forever(obj: object) -> None:
    """Keep a reference to ``obj`` for the rest of the process (never released by us)."""
    _kept_alive.append(obj)


def process_ending() -> bool:
    """Whether the teardown of every registry began (`teardown_all`): the process ends.

    Read without the lock (one list item).  ``False`` again in a forked child.
    """
    return _ending[0]


def exit_phase() -> str:
    """``"open"``, ``"exiting"`` (the exit teardown runs) or ``"exited"``."""
    return _exit_phase[0]


def set_exit_phase(phase: str) -> None:
    _exit_phase[0] = phase


def set_ending(ending: bool) -> None:
    """The teardown of every registry begins (``True``), or a forked child starts over."""
    _ending[0] = ending


#: Why nothing may be released at exit: threads still running that could not be
#: quiesced (exitsafe._quiesce), described; ``None``: nothing stops a release.
_running_threads: list[Optional[str]] = [None]


def set_threads_running(detail: Optional[str]) -> None:
    """Threads still run that may use any handle (``detail`` names them): the exit
    teardown releases nothing from now on; ``None`` lifts it (a forked child)."""
    _running_threads[0] = detail


def threads_running() -> Optional[str]:
    """Why nothing may be released (see `set_threads_running`), or ``None``."""
    return _running_threads[0]


def kept_alive() -> list[object]:
    """A copy of what is kept for the life of the process."""
    return list(_kept_alive)


#: How the process is left (``exitsafe._exit.leave``, set when exitsafe is imported: the
#: modules below that one, which must be able to leave, find it here).
_leave: list[Callable[[int], object]] = []


def set_leave(leave: Callable[[int], object]) -> None:
    _leave[:] = [leave]


def leave(status: int) -> None:
    """Leave the process as [`exitsafe.exit`][exitsafe.exit] does (never returns)."""
    _leave[0](status)

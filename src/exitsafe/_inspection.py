"""Inspection, a part of [`Registry`][exitsafe.Registry]: the ledger, the counts and the live
handles, read consistently from any thread (under `exitsafe._sync.LOCK`, or
without it from a finalizer that interrupted a section of the same thread)."""

from __future__ import annotations

from . import _sync
from ._handle import HandleInfo
from ._ledger import Ledger, LedgerEntry, counts_of
from ._node import RELEASING
from ._node import Node as _Node

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["Inspection"]

_reentered = _sync.reentered


class Inspection:
    """The read-only half of [`Registry`][exitsafe.Registry] (a mixin)."""

    if TYPE_CHECKING:
        name: str
        _phase: int
        _parked: int
        _ledger: Ledger
        _live: Any  # a LiveTable (see exitsafe._live)

        def _nodes(self) -> list[_Node]: ...

    def ledger(self) -> list[LedgerEntry]:
        """The recorded outcomes, oldest first.

        Returns:
            One [`LedgerEntry`][exitsafe.LedgerEntry] per ended handle or hook (at most
            `ledger_limit` of the newest).
        """
        entries: list[LedgerEntry] = self._read(self._ledger.entries, self.name)
        return entries

    def ledger_counts(self) -> dict[str, int]:
        """How many handles ended in each outcome.

        Returns:
            `{outcome: count}`, exact, never truncated by `ledger_limit`.
        """
        counts: dict[str, int] = self._read(self._ledger.counts)
        return counts

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the lock; without it when called re-entrantly (a copy made
        while this thread's own section is suspended is as consistent as any)."""
        if _reentered():
            return fn(*args)
        try:
            _sync.enter()
            return fn(*args)
        finally:
            try:
                _sync.release()
            except RuntimeError:  # (not held: interrupted before taking it)
                pass
            else:
                _sync.run_deferred()

    @property
    def late_requests(self) -> int:
        """How many release requests arrived after close and were ignored.

        A request is an explicit ``release()`` (or ``close()`` of a wrapper); the
        garbage collection of a handle that already ended is not one.
        """
        return self._ledger.late_requests

    def live_handles(self) -> list[HandleInfo]:
        """A snapshot of every handle and hook not yet ended, oldest first.

        Returns:
            One [`HandleInfo`][exitsafe.HandleInfo] per handle.
        """
        import threading

        main = threading.main_thread().ident
        generation = _sync.generation
        nodes = self._read(self._nodes)
        return [HandleInfo(n, generation, main) for n in nodes if n._state <= RELEASING]

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        phase = ("open", "tearing down", "closed")[self._phase]
        return f"<exitsafe.Registry {self.name!r} {phase} live={len(self._live)}>"

    def _as_json(self) -> dict[str, Any]:
        """The ledger file's part for this registry: its counts and entries are made from
        one copy of the records, taken in one locked moment (read apart, threads still
        registering during the exit made them disagree), so the counts always sum to the
        entries plus ``dropped_entries``."""
        ledger = self._ledger
        records, dropped_counts = self._read(ledger.snapshot)
        entries = ledger.entries_of(self.name, records)
        counts = counts_of(records, dropped_counts)
        return {
            "name": self.name,
            "counts": counts,
            "late_requests": self.late_requests,
            "dropped_entries": sum(counts.values()) - len(entries),
            "parked_threads": self._parked,
            "entries": [e.as_dict() for e in entries],
        }


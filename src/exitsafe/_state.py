"""A registry's state: its graph of records, its phase, its ledger, and the parts it is
composed of.  The public [`Registry`][exitsafe.Registry] is a facade over one of these.

`RegistryState` is internal: its attributes and methods are the interface exitsafe's own
layers use (records refer to it as their ``_registry``; ``exitsafe._process`` keeps the
states of every registry).  It owns:

* the **hot fields** every release reads: ``phase`` (``OPEN`` -> ``TEARING`` ->
  ``CLOSED``, see `exitsafe._phase`), ``seq`` (the last creation number), ``live`` (the
  records not yet ended, see `exitsafe._live`), ``ledger`` with its ``records`` list and
  ``cap``, and ``strict``.  In the compiled core they are C fields of
  ``exitsafe._speedups.RegistryCore``, this class's base there.  Only the methods of this
  class write them.
* its **parts**, each owning its own fields: ``hooks`` (early hooks and the early phase,
  `exitsafe._hooks.Hooks`), ``gate`` (the borrow gate, `exitsafe._gate.BorrowGate`) and
  ``closing`` (the teardown in progress, `exitsafe._closing.Closing`).

Every method that changes the graph runs as a section (`exitsafe._sync`): the caller holds
`exitsafe._sync.LOCK` when the docstring says so, or the method takes it.
"""

from __future__ import annotations

import _thread
import sys
from _weakref import ref as _weakref

from . import _collection, _graph, _record, _sync
from ._closing import Closing
from ._core import speedups
from ._errors import DependencyCycleError, HandleClosedError, RegistryClosedError
from ._gate import BorrowGate
from ._hooks import Hooks
from ._ledger import (
    WIDTH,
    Ledger,
    LedgerEntry,
    Outcome,
    counts_of,
    ends_with,
    packed,
    quote,
)
from ._live import LiveTable, take_lost
from ._phase import CLOSED, OPEN, TEARING
from ._process import keep_forever
from ._record import HOOK, LIVE, RELEASING, TAINTING, Record, display_name
from ._releases import undo_track
from ._report import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["RegistryState"]

_get_ident = _thread.get_ident
_reentered = _sync.reentered
_deferred = _sync.deferred
_acquire = _sync.acquire
_release = _sync.release
_number = _record.number
_RELEASED = Outcome.RELEASED
#: The pure-Python live table is a dict of creation number -> weak reference (see
#: exitsafe._live): the hot path adds its entries with the dict's own method, which runs
#: no Python frame; the compiled table is called as usual.
_DICT_TABLE = speedups is None

#: The detail of a handle that died without its finalizer running (see
#: `exitsafe._live.take_lost`); its kind and name died with it.
LOST = (
    "collected, but an interrupt landed as its finalizer started (pure-Python core, "
    "CPython 3.11+): never released; its kind and name were lost with it"
)


if TYPE_CHECKING or speedups is None:

    class _StateBase:
        """The pure-Python core: the hot fields are ordinary attributes."""

        __slots__ = ("cap", "live", "phase", "records", "seq", "strict")

else:
    # The compiled core keeps the hot fields (phase, seq, cap, live, records, strict) in C.
    _StateBase = speedups.RegistryCore


class RegistryState(_StateBase):
    """The state of one registry (see the module documentation)."""

    __slots__ = (
        "__weakref__",
        "closing",
        "dependents",
        "exit_policy",
        "facade",
        "gate",
        "hooks",
        "ledger",
        "name",
        "step_timeout",
        "teardown_timeout",
        "trace",
    )

    if TYPE_CHECKING:
        phase: int
        seq: int
        cap: int
        live: Any
        records: list[Any]
        strict: bool
        emit_late: Callable[[str, str, str], None]

    def __init__(
        self,
        facade: Any,
        name: str,
        strict: bool,
        exit_policy: Any,
        step_timeout: Optional[float],
        teardown_timeout: Optional[float],
        ledger_limit: Optional[int],
    ) -> None:
        #: The public Registry this is the state of (`Handle.registry` returns it).
        self.facade = facade
        self.name = name
        self.strict = strict
        self.exit_policy = exit_policy
        self.step_timeout = step_timeout
        self.teardown_timeout = teardown_timeout
        self.ledger = Ledger(ledger_limit)
        self.records = self.ledger.records  # appended to by the release hot path
        self.cap = min(self.ledger.cap, sys.maxsize)  # ... which trims beyond this many
        self.phase = OPEN
        self.seq = 0
        #: Every record not yet ended: handles held weakly, hooks owned (see _live).
        self.live = LiveTable()
        self.trace = False  # whether the teardown traces (late requests are traced too)
        self.hooks = Hooks()
        self.gate = BorrowGate()
        self.closing = Closing()
        #: The graph's index of dependents (`exitsafe._graph.Dependents`), made when an
        #: edge against the creation order first needs it (`dependents_index`).
        self.dependents: Optional[_graph.Dependents] = None

    # ------------------------------------------------------------------ registration

    def add_simple(self, node: Record) -> bool:
        """Register ``node``, a handle with no dependency, in one short section; whether
        the registry was open (else the caller records it ``leaked_after_close``).

        The caller checked it is not inside a section, and keeps ``node`` until this
        returns: an exception anywhere leaves the lock free and ``node`` registered
        (numbered) or not at all, which the caller tells by its ``_seq``."""
        added = False
        try:
            _acquire(False) or _sync.wait()
            if not self.phase:
                seq = self.seq = self.seq + 1
                _number(node, seq)
                if _DICT_TABLE:
                    self.live[seq] = _weakref(node)  # (LiveTable.add, written out)
                else:
                    self.live.add(node, False)
                added = True
            _release()  # (the section's shape: see exitsafe._sync.locked)
        except BaseException:
            if _sync.reentered():  # (the section's shape: see exitsafe._sync.locked)
                _sync.release()
            raise
        return added

    def register(self, node: Record, after: tuple[Record, ...]) -> bool:
        """Insert ``node`` (with parents, or a hook) into the graph; whether it was (else
        it is recorded ``leaked_after_close``: the registry is no longer open).  Raises
        the error refusing it, and then the caller still owns its object."""
        if self.phase == CLOSED:  # no lock after close: see registered_after_close
            self.registered_after_close(node)
            return False
        try:
            if after or node._role == HOOK:
                error = _sync.locked_quietly(self._add, node, after)
            else:
                error = self._add_dependent(node)
        except BaseException:  # interrupted (KeyboardInterrupt): registered meanwhile or not
            undo_track(node)
            raise
        if error is None:
            return True
        if isinstance(error, RegistryClosedError):
            self.registered_after_close(node)
            return False
        _record.disown(node)
        raise error

    def add(self, node: Record, after: tuple[Record, ...]) -> Optional[Exception]:
        """Insert ``node`` (with its parents, or a hook with its ``after`` edges) into the
        graph, in a section of its own; ``None``, or the error refusing it (nothing was
        changed).  A closed registry returns `RegistryClosedError` (not raised: the
        caller records the handle ``leaked_after_close`` unless strict)."""
        return _sync.locked_quietly(self._add, node, after)

    def _add(self, node: Record, after: tuple[Record, ...]) -> Optional[Exception]:
        if self.phase != OPEN:
            return RegistryClosedError(f"registry {self.name!r} is closed")
        error = self._check_new_edges(node, after)
        if error is not None:
            return error
        seq = self.seq = self.seq + 1
        _record.number_with_parents(node, seq)
        if after:
            # (a renumbering must rank the hook too, which joins the live table last)
            def every_node() -> list[Record]:
                nodes: list[Record] = self.live.nodes()
                nodes.append(node)
                return nodes

            for child in after:
                _graph.add_edge(child, node, every_node)
                _record.add_parent(child, node)
        if node._role == HOOK:
            self.live.add(node, True)  # owned by the registry until teardown
            self.hooks.added()
        else:
            self.live.add(node, False)
        return None

    def _add_dependent(self, node: Record) -> Optional[Exception]:
        """`add` for a handle with parents and no ``after`` edges (no edge can close a
        cycle: the handle is new), in one section of its own, written out for the hot
        path of ``track(depends_on=...)``; ``None``, or the error refusing it."""
        error: Optional[Exception] = None
        try:
            _acquire(False) or _sync.wait()
            if self.phase != OPEN:
                error = RegistryClosedError(f"registry {self.name!r} is closed")
            else:
                for parent in node._parents:
                    # (is_usable, written out.  Not "if unusable: ...; break": CPython
                    # 3.12-3.14 leave that loop's backward jump, where a signal is acted
                    # on, out of the try, and an interrupt there would leave the lock held:
                    # tests/adversarial/test_try_coverage.py)
                    if parent._state == LIVE and parent._refs:
                        continue
                    error = HandleClosedError("depends_on: " + _record.closed_message(parent))
                    break
                else:
                    seq = self.seq = self.seq + 1
                    _record.number_with_parents(node, seq)
                    if _DICT_TABLE:
                        self.live[seq] = _weakref(node)  # (LiveTable.add, written out)
                    else:
                        self.live.add(node, False)
            _release()  # (the section's shape: see exitsafe._sync.locked)
        except BaseException:
            if _sync.reentered():  # (the section's shape: see exitsafe._sync.locked)
                _sync.release()
            raise
        return error

    def _check_new_edges(self, node: Record, after: tuple[Record, ...]) -> Optional[Exception]:
        """Why ``node`` cannot join the graph with its parents and ``after`` edges, or None."""
        for parent in node._parents:
            if not _record.is_usable(parent):
                what = "before" if node._role == HOOK else "depends_on"
                return HandleClosedError(f"{what}: " + _record.closed_message(parent))
        for cnode in after:
            if cnode._state != LIVE:
                return HandleClosedError("after: " + _record.closed_message(cnode))
            for parent in node._parents:
                # The new edges are cnode -> hook -> parent: a cycle if parent already
                # depends (transitively) on cnode.
                path = _graph.cycle_path(parent, cnode)
                if path is not None:
                    names = [display_name(node), *(display_name(n) for n in path)]
                    names.append(display_name(node))
                    return DependencyCycleError(
                        "dependency cycle: " + " -> ".join(names) + " (each depends on the next)",
                        names,
                    )
        return None

    def add_dependencies(self, node: Record, parents: tuple[Record, ...]) -> None:
        """``node`` depends on ``parents`` from now on: all edges or none (a section)."""
        _sync.locked("add_dependency()", self._add_dependencies, node, parents)

    def _add_dependencies(self, node: Record, parents: tuple[Record, ...]) -> None:
        if not _record.is_usable(node):
            raise HandleClosedError(_record.closed_message(node))
        if self.phase != OPEN:
            raise RegistryClosedError(f"registry {self.name!r} is closed")
        new = []
        for parent in parents:
            if not _record.is_usable(parent):
                raise HandleClosedError("add_dependency: " + _record.closed_message(parent))
            if parent in node._parents:
                continue
            path = _graph.cycle_path(parent, node)
            if path is not None:
                names = [display_name(node), *(display_name(n) for n in path)]
                raise DependencyCycleError(
                    "dependency cycle: " + " -> ".join(names) + " (each depends on the next)",
                    names,
                )
            new.append(parent)
        for parent in new:
            _graph.add_edge(node, parent, self.live.nodes)
            _record.add_parent(node, parent)

    def dependents_index(self) -> _graph.Dependents:
        """The graph's index of dependents, made on first need (the caller holds the lock
        and brings it up to date: `exitsafe._graph.dependents_of`)."""
        index = self.dependents
        if index is None:
            index = self.dependents = _graph.Dependents()
        return index

    def registered_after_close(self, node: Record) -> None:
        """Record ``node``, registered once the teardown began, ``leaked_after_close``
        (strict: raise [`RegistryClosedError`][exitsafe.RegistryClosedError] instead, and
        the caller keeps its object).

        Bounded: this may run from a finalizer late in shutdown, when a thread frozen
        inside exitsafe may hold the lock for ever; then the record is made without it
        (an append to the ledger is atomic; the creation number may repeat)."""
        if self.strict:
            _record.disown(node)
            raise RegistryClosedError(
                f"registry {self.name!r} is closed (its teardown began); "
                f"cannot register {node._kind} {display_name(node)!r}"
            )
        inside = _reentered()  # (then this thread holds the lock already)
        try:
            if not inside:
                _sync.enter_if_possible()
            if not node._seq:
                seq = self.seq = self.seq + 1
                _record.number(node, seq)
            parents = _record.end_after_close(node)
            self.ledger.add(
                node._seq, node._kind, node._name, Outcome.LEAKED_AFTER_CLOSE,
                "registered after teardown began", True,
            )
        finally:
            if not inside:
                try:
                    _sync.release()
                except RuntimeError:  # (late in shutdown enter_if_possible may give up)
                    pass
        if node._role != HOOK and node._raw is not None:
            keep_forever(node._raw)  # never released; never freed by us either
        _record.drop_payload(node)
        del parents  # outside the lock
        try:
            log().info(
                "%s %r registered after teardown began: leaked", node._kind, display_name(node)
            )
        except Exception:  # late in interpreter shutdown logging may be gone: the ledger has it
            pass
        if _deferred:
            _sync.run_deferred()

    # ------------------------------------------------------------------ ends

    def finish(
        self,
        node: Record,
        outcome: str,
        detail: Optional[str],
        at_exit: bool,
        trash: list[object],
        decided: bool = False,
        ready: Optional[list[Record]] = None,
    ) -> None:
        """Record ``node``'s outcome and end it; the caller holds the lock.

        References the record lets go of go to ``trash``, which the caller clears after
        its section (dropping a user object may run its ``__del__``).  Each parent left
        due by this end, while the registry is open, is appended to ``ready`` and claimed
        by this thread, in that order (a claim is always in the caller's list first).  A
        record that already ended keeps its outcome (the first recorder wins: a teardown
        that gave up waiting for a release running elsewhere, or the release that
        finished first), unless ``decided``: a teardown recording what it settled itself.
        """
        if node._state > RELEASING and not decided:
            return
        # Everything the end changes is read first, and what it lets go of is in `trash`
        # before it lets go: if an exception (an interrupt) comes in the middle, the
        # handler completes the end from these, so the record is made once and every
        # parent loses this dependent once.
        raw, parents = node._raw, node._parents
        trash.append((raw, node._fn, parents))
        counts = [p._children for p in parents]
        hooks = self.hooks.count
        record = (node._seq, node._kind, node._name, outcome, detail, at_exit)
        records = self.records
        try:
            records += packed(record)  # the end's commit
            self.live.discard(node)
            _record.end(node, outcome, at_exit)
            if node._role == HOOK:
                self.hooks.ended()
            elif parents:
                self._lose_dependent(parents, counts, ready)
        except BaseException:
            if not ends_with(records, record):
                records += packed(record)
            self.live.discard(node)
            _record.end(node, outcome, at_exit)
            if node._role == HOOK:
                if self.hooks.count == hooks:
                    self.hooks.ended()
            elif parents:
                self._lose_dependent(parents, counts, ready)
            raise
        if raw is not None and outcome in TAINTING and node._role != HOOK:
            keep_forever(raw)  # the native object may live on: keep what it uses
        if len(records) > self.cap:
            self.ledger.trim()

    def _lose_dependent(
        self, parents: tuple[Record, ...], counts: list[int], ready: Optional[list[Record]]
    ) -> None:
        """Each of ``parents`` lost one dependent (see `exitsafe._record.lose_dependents`);
        those left due while the registry is open go to ``ready``, then are claimed by
        this thread."""
        _record.lose_dependents(
            parents, counts, ready if self.phase == OPEN else None, _get_ident()
        )

    def late_request(self, node: Record) -> None:
        """Count (and trace) a release request that arrived after close.

        Takes no lock: late in interpreter shutdown a thread frozen inside exitsafe may
        hold it for ever (waiting would hang; on 3.15 taking it raises
        ``PythonFinalizationError``)."""
        self.ledger.add_late_request()
        if self.trace:
            self.trace_late(node)

    def trace_late(self, node: Record) -> None:
        """Print the trace line of a late release request (attributes only: see
        `late_request`)."""
        name = node._name
        if name is None:
            name = f"{node._kind}#{node._seq}"
        self.emit_late(self.name, node._kind, name)

    # ------------------------------------------------------------------ phases

    def begin_teardown(self) -> bool:
        """Switch to the tearing-down phase (the caller holds the lock); ``False`` when a
        teardown already began."""
        if self.phase != OPEN:
            return False
        self.phase = TEARING
        if _DICT_TABLE and not _collection.collecting():  # (see take_lost)
            for seq in take_lost(self.live):  # (the pure-Python core's lost finalizers)
                self.ledger.add(seq, "handle", None, Outcome.LEAKED_INTERRUPTED, LOST, True)
        return True

    def close(self) -> None:
        """Every record claimed by the teardown has its outcome: closed for good."""
        self.phase = CLOSED

    def close_at_once(self) -> None:
        """A registry created after the process's exit teardown finished starts closed."""
        self.phase = CLOSED

    def reopen(self) -> None:
        """In a forked child whose parent's teardown ran on another thread: open again."""
        self.phase = OPEN

    # ------------------------------------------------------------------ reading

    def nodes(self) -> list[Record]:
        """Every handle and hook not yet ended, oldest first (the caller holds the lock)."""
        nodes: list[Record] = self.live.nodes()
        return nodes

    def dependent_names(self, node: Record) -> list[str]:
        """The names of the live handles depending on ``node`` (the caller holds the lock)."""
        return [
            display_name(n)
            for n in self.live.nodes()
            if node in n._parents and n._state <= RELEASING and n._role != HOOK
        ]

    def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the lock; without it when called re-entrantly (a copy made
        while this thread's own section is suspended is as consistent as any)."""
        if _reentered():
            return fn(*args)
        return _sync.locked("reading a registry", fn, *args)

    def entries(self) -> list[LedgerEntry]:
        entries: list[LedgerEntry] = self.read(self.ledger.entries, self.name)
        return entries

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = self.read(self.ledger.counts)
        return counts

    def as_json(self) -> dict[str, Any]:
        """The ledger file's part for this registry (see `ledger_file_part`), its entries
        as dicts."""
        fields, records = self.ledger_file_part()
        fields["entries"] = [e.as_dict() for e in self.ledger.entries_of(self.name, records)]
        return fields

    def ledger_file_part(self) -> tuple[dict[str, Any], list[Any]]:
        """This registry in the ledger file: its fields (all but ``"entries"``) and the
        records of its entries (`exitsafe._ledger.write_json` writes them).  Its counts
        and entries are made from one copy of the records, taken in one locked moment
        (read apart, threads still registering during the exit made them disagree), so
        the counts always sum to the entries plus ``dropped_entries``."""
        ledger = self.ledger
        records, dropped_counts = self.read(ledger.snapshot)
        counts = counts_of(records, dropped_counts)
        shown = ledger.newest(records)
        fields = {
            "name": self.name,
            "counts": counts,
            "late_requests": ledger.late_requests,
            "dropped_entries": sum(counts.values()) - len(shown) // WIDTH,
            "parked_threads": self.gate.parked,
        }
        return fields, shown


def _emit_late_release(
    registry: str, kind: str, name: str, _sys: Any = sys, quote: Any = quote
) -> None:
    """Print the trace line of a late release request, best effort.

    It may run from a finalizer late in interpreter shutdown, when module globals can
    already be None: what it needs comes in through its default arguments."""
    try:
        stream = _sys.stderr
        if stream is not None:
            stream.write(
                f"exitsafe: late-release registry={quote(registry)} kind={quote(kind)}"
                f" name={quote(name)}\n"
            )
            stream.flush()
    except Exception:  # a closed or broken stderr at exit: the trace must never add noise
        pass


#: Reached through the class: `RegistryState.late_request` may run when module globals are
#: already None.
RegistryState.emit_late = staticmethod(_emit_late_release)

"""The ledger: what happened to every handle, as data; and the trace grammar.

Every handle ends in exactly one outcome.  A registry appends one compact record per
outcome to its `Ledger`; [`LedgerEntry`][exitsafe.lowlevel.LedgerEntry] objects are built only when
somebody asks for them, so the release hot path stays cheap.

The teardown trace (``EXITSAFE_TRACE=1``) is written with `trace_line` and read back by
[`exitsafe.testing`][exitsafe.testing] with `parse_trace_line`: one grammar, defined here.
"""

from __future__ import annotations

import sys

from ._core import speedups

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any, Optional, TextIO

    Record = tuple[int, str, Optional[str], str, Optional[str], bool]


#: How many items of a ledger's record list (`Ledger.records`) one record takes.  The
#: compiled core appends one record object per outcome (``exitsafe._speedups``: never
#: tracked by the cyclic garbage collector).  The pure-Python core appends a record's six
#: fields flat (``records += (seq, kind, name, outcome, detail, at_exit)``): a tuple kept
#: per record would be one object the cyclic garbage collector tracks for every release
#: (a young collection every 700 releases, visiting each record kept since: 2.6% of a
#: pure-core track + release in steady state), while the fields are ints, strings,
#: ``None`` and bools, which it never tracks.  Read the records with `rows`.
WIDTH = 1 if speedups is not None else 6

#: Whether records are stored flat (the pure-Python core: ``WIDTH`` items each).
FLAT = WIDTH != 1


def rows(records: list[Any]) -> Iterable[Record]:
    """The records of a record list (a ledger's, a copy of it, or a slice of it starting
    at a record), one 6-item sequence each, oldest first."""
    if not FLAT:
        return records
    items = iter(records)
    return zip(items, items, items, items, items, items)


def ends_with(records: list[Any], record: Record) -> bool:
    """Whether ``record`` (the tuple `packed` was given) was the last added to
    ``records``: for an end interrupted around its commit, which completes it only if it
    was not made.  A flat record is recognized by its creation number, the same int
    object, which no other record in the registry's list holds."""
    if FLAT:
        return len(records) >= WIDTH and records[-WIDTH] is record[0]
    return bool(records) and records[-1] is record


def packed(record: Record) -> Any:
    """What a record list is extended with (``records += packed(record)``) to add
    ``record``: its fields (`FLAT`), else a 1-tuple of it."""
    return record if FLAT else (record,)


class Outcome:
    """The outcomes a handle can end in: plain strings, so they compare and serialize simply.

    [`LedgerEntry.outcome`][exitsafe.lowlevel.LedgerEntry] is one of them, and so is the `outcome=`
    of a step in the teardown trace.

    Attributes:
        RELEASED: `"released"`: released by its owners before teardown.
        RELEASED_AT_EXIT: `"released_at_exit"`: released natively by the teardown.
        LEAKED_POLICY: `"leaked_policy"`: its exit policy (or `EXITSAFE_AT_EXIT=leak`) said
            leak.
        LEAKED_IN_USE: `"leaked_in_use"`: it was borrowed, or being released on another
            thread (or on the teardown's own thread, which a teardown never waits for), when
            the teardown reached it; or, adopted, another thread's code still referred to
            it after the bound.
        LEAKED_TIMEOUT: `"leaked_timeout"`: its release step (or its exit policy) ran past
            the step or total timeout.
        LEAKED_DEPENDENT: `"leaked_dependent"`: something depending on it was leaked or
            failed, so releasing it could pull native state from under that dependent.
        LEAKED_AFTER_CLOSE: `"leaked_after_close"`: tracked after the registry's teardown
            began.
        LEAKED_INHERITED: `"leaked_inherited"`: inherited by a forked child, which never
            releases its parent's handles.
        LEAKED_INTERRUPTED: `"leaked_interrupted"`: the teardown was interrupted (an
            exception escaped it, or [`exitsafe.exit`][exitsafe.exit] was called by one of
            its steps) before it reached this handle, or while this handle's own step ran:
            it was neither released nor decided.  Also, on the pure-Python core only, a
            handle whose finalizer an interrupt cut short as it started (recorded by the
            next teardown as `handle#<n>`: its kind and name died with it).
        LEAKED_AFFINITY: `"leaked_affinity"`: thread-affine: its release must run on a thread
            that was still running, elsewhere, when the teardown reached it.
        RELEASE_FAILED: `"release_failed"`: the release function raised; it is never called
            again.
        DETACHED: `"detached"`: [`Handle.detach`][exitsafe.Handle.detach] gave the object
            back to the program.
        HOOK_RAN: `"hook_ran"`: a teardown hook ran to completion.
        HOOK_FAILED: `"hook_failed"`: a teardown hook raised (logged).
        HOOK_TIMEOUT: `"hook_timeout"`: a teardown hook ran past its timeout and was
            abandoned.
        HOOK_CANCELLED: `"hook_cancelled"`: a teardown hook was removed with
            [`Handle.release`][exitsafe.Handle.release] before teardown.
        ALL: every outcome above, as a frozenset.
        RAN: the outcomes in which the native release (or the hook) actually ran to
            completion: `released`, `released_at_exit`, `hook_ran`.

    Example:
        ```python
        leaked = [e for e in exitsafe.ledger() if e.outcome not in exitsafe.Outcome.RAN]
        ```
    """

    RELEASED = "released"
    RELEASED_AT_EXIT = "released_at_exit"
    LEAKED_POLICY = "leaked_policy"
    LEAKED_IN_USE = "leaked_in_use"
    LEAKED_TIMEOUT = "leaked_timeout"
    LEAKED_DEPENDENT = "leaked_dependent"
    LEAKED_AFTER_CLOSE = "leaked_after_close"
    LEAKED_INHERITED = "leaked_inherited"
    LEAKED_INTERRUPTED = "leaked_interrupted"
    LEAKED_AFFINITY = "leaked_affinity"
    RELEASE_FAILED = "release_failed"
    DETACHED = "detached"
    HOOK_RAN = "hook_ran"
    HOOK_FAILED = "hook_failed"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_CANCELLED = "hook_cancelled"

    ALL = frozenset(
        {
            RELEASED,
            RELEASED_AT_EXIT,
            LEAKED_POLICY,
            LEAKED_IN_USE,
            LEAKED_TIMEOUT,
            LEAKED_DEPENDENT,
            LEAKED_AFTER_CLOSE,
            LEAKED_INHERITED,
            LEAKED_INTERRUPTED,
            LEAKED_AFFINITY,
            RELEASE_FAILED,
            DETACHED,
            HOOK_RAN,
            HOOK_FAILED,
            HOOK_TIMEOUT,
            HOOK_CANCELLED,
        }
    )
    #: Outcomes in which the native release (or the hook) actually ran to completion.
    RAN = frozenset({RELEASED, RELEASED_AT_EXIT, HOOK_RAN})


class LedgerEntry:
    """One handle's final outcome, as [`Registry.ledger`][exitsafe.Registry.ledger] and
    [`exitsafe.ledger`][exitsafe.ledger] return it.

    Entries are built by exitsafe; two entries are equal when all their fields are.

    Args:
        registry: the registry's name.
        seq: the handle's creation number.
        kind: the handle's kind.
        name: the handle's display name.
        outcome: an [`Outcome`][exitsafe.Outcome] string.
        detail: why, or `None`.
        at_exit: whether a teardown decided the outcome.

    Attributes:
        registry: the name of the registry the handle belonged to.
        seq: the handle's creation number, unique within the registry.
        kind: the kind given at registration (`"device"`, `"library"`, `"hook"`...).
        name: the display name (the name given, or `"<kind>#<n>"`).
        outcome: an [`Outcome`][exitsafe.Outcome] string.
        detail: why: the error, the policy, the dependent that leaked; or `None`.
        at_exit: `True` when the outcome was decided by a teardown.
    """

    __slots__ = ("at_exit", "detail", "kind", "name", "outcome", "registry", "seq")

    def __init__(
        self,
        registry: str,
        seq: int,
        kind: str,
        name: str,
        outcome: str,
        detail: Optional[str],
        at_exit: bool,
    ) -> None:
        self.registry = registry
        self.seq = seq
        self.kind = kind
        self.name = name
        self.outcome = outcome
        self.detail = detail
        self.at_exit = at_exit

    def as_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict.

        Returns:
            `{"at_exit": ..., "detail": ..., "kind": ..., "name": ..., "outcome": ...,
                "registry": ..., "seq": ...}`.
        """
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LedgerEntry):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.registry, self.seq, self.outcome))

    def __repr__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"<exitsafe.lowlevel.LedgerEntry {self.registry}:{self.name} {self.outcome}{detail}>"


#: The fewest records a trim drops: with a small ``ledger_limit`` (``0``: counts only) the
#: ledger still trims once per this many outcomes, not on every release.
MIN_TRIM = 1024


def trim_chunk(limit: int) -> int:
    """How many records a ledger with this ``limit`` drops per trim (see `Ledger`)."""
    return max(MIN_TRIM, limit // 4)


class Ledger:
    """One registry's outcomes: the newest ``limit`` records and exact counts of all.

    ``records`` holds `WIDTH` items per record (see `rows`); ``cap`` and the sizes below
    count items, ``limit`` and the counts count records.  `add` is called with
    `exitsafe._sync.LOCK` held; the readers copy under it.  ``limit=None`` keeps every
    record; ``0`` keeps none (counts only).  Counts are derived when asked for: the
    records kept, plus the counts of the records the limit dropped, so that `add` (on
    every release) only appends.

    The records may exceed ``limit`` by up to `trim_chunk` records (the ``cap``): a trim
    then drops the oldest at once, counting their outcomes in C (the compiled core's
    ``count_outcomes``: a few instructions per record), so that trimming costs O(1) per
    record and happens once per `trim_chunk` outcomes in steady state.  Readers never see
    the excess: `entries` returns the newest ``limit`` records.
    """

    __slots__ = ("_dropped", "_dropped_counts", "_late", "cap", "limit", "records")

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        #: Records kept until there are more than this many, then trimmed to ``limit``
        #: (one trim per `trim_chunk` records).  The release hot paths compare with it
        #: too (the registry's ``cap``), then call `trim`.
        self.cap = (
            sys.maxsize if limit is None else (limit + trim_chunk(limit) - 1) * WIDTH
        )
        #: The records, oldest first, `WIDTH` items each.  The registry's release hot path
        #: extends it directly (under the lock), then calls :meth:`trim` when it holds more
        #: than ``cap`` items.
        self.records: list[Any] = []
        self._dropped_counts: dict[str, int] = {}
        self._dropped = 0
        # One entry per release request that arrived after close: appended without any
        # lock (an append is atomic), because such a request may come from a finalizer late
        # in interpreter shutdown, when a thread frozen inside exitsafe may hold its lock.
        self._late: list[None] = []

    def add_late_request(self) -> None:
        """Count a release request that arrived after close (takes no lock)."""
        self._late.append(None)

    @property
    def late_requests(self) -> int:
        """Release requests that arrived after close and were ignored."""
        return len(self._late)

    def add(
        self, seq: int, kind: str, name: Optional[str], outcome: str, detail: Optional[str],
        at_exit: bool,
    ) -> None:
        """Record one outcome (the caller holds the lock)."""
        records = self.records
        records += packed((seq, kind, name, outcome, detail, at_exit))
        if len(records) > self.cap:
            self.trim()

    def trim(self) -> None:
        """Keep the newest ``limit`` records, counting the dropped ones (under the lock).

        O(1) per dropped record, in C: the outcomes of the dropped slice are counted in one
        pass, and the slice is deleted in one step.  An exception between two of its steps
        (an interrupt under a tracer) leaves the records and the counts in agreement: the
        counts are made on a copy, and the handler completes the trim once it began.
        """
        records = self.records
        limit = self.limit
        assert limit is not None
        size = len(records)
        drop = size - limit * WIDTH  # (items)
        if drop <= 0:
            return
        counts = dict(self._dropped_counts)
        add_counts(counts, records, drop)
        dropped = self._dropped + drop // WIDTH
        try:
            self._dropped_counts = counts
            self._dropped = dropped
            del records[:drop]
        except BaseException:
            self._dropped_counts = counts
            self._dropped = dropped
            if len(records) == size:
                del records[:drop]
            raise

    def entries(self, registry: str) -> list[LedgerEntry]:
        """The kept records, oldest first (at most ``limit``), as entries."""
        return self.entries_of(registry, list(self.records))

    def newest(self, records: list[Record]) -> list[Record]:
        """The newest ``limit`` of ``records`` (a copy of the records): what the ledger
        shows."""
        limit = self.limit
        if limit is not None and len(records) > limit * WIDTH:
            return records[len(records) - limit * WIDTH :]
        return records

    def entries_of(self, registry: str, records: list[Record]) -> list[LedgerEntry]:
        """``records`` (a copy of the records) as entries, the newest ``limit``."""
        return [
            LedgerEntry(
                registry, seq, kind, name if name is not None else f"{kind}#{seq}", outcome,
                detail, at_exit,
            )
            for seq, kind, name, outcome, detail, at_exit in rows(self.newest(records))
        ]

    def counts(self) -> dict[str, int]:
        """How many handles ended in each outcome (exact, never truncated)."""
        return counts_of(list(self.records), self._dropped_counts)

    def snapshot(self) -> tuple[list[Record], dict[str, int]]:
        """A copy of the records and of the dropped records' counts, taken at one moment
        (the caller holds the lock): the counts and the entries derived from it agree."""
        return list(self.records), dict(self._dropped_counts)

    @property
    def dropped(self) -> int:
        """How many records the ledger no longer shows: those the limit dropped and those
        beyond the limit not yet trimmed (their counts are still exact)."""
        limit = self.limit
        excess = 0 if limit is None else max(0, len(self.records) // WIDTH - limit)
        return self._dropped + excess


def counts_of(records: list[Any], dropped_counts: dict[str, int]) -> dict[str, int]:
    """Outcome counts of ``records`` plus those of the records the limit dropped."""
    counts = dict(dropped_counts)
    add_counts(counts, records, len(records))
    return counts


def add_counts(counts: dict[str, int], records: list[Any], stop: int) -> None:
    """Add the outcomes of the records in ``records[:stop]`` (``stop`` counts items) to
    ``counts``, in C: the compiled core's ``count_outcomes`` (a few instructions per
    record), or, in pure Python (whose records are flat: see `WIDTH`), one ``list.count``
    per distinct outcome (a handful) over the outcomes sliced out at once, rather than a
    dict update per record."""
    if not FLAT:
        assert speedups is not None
        speedups.count_outcomes(records, stop, counts)
        return
    outcomes = records[3:stop:WIDTH]
    for outcome in dict.fromkeys(outcomes):
        counts[outcome] = counts.get(outcome, 0) + outcomes.count(outcome)


# ---------------------------------------------------------------------- ledger file

#: The fields of an entry in the ledger file, in the order written (`LedgerEntry.as_dict`).
ENTRY_FIELDS = LedgerEntry.__slots__

#: Entries joined and written at once by `write_json`.
FILE_CHUNK = 8192


def entry_lines(registry: str, records: list[Any]) -> Iterator[str]:
    """The JSON text of the entries of ``records`` (a record list), one line (one object)
    each.

    Equal, once parsed, to ``LedgerEntry.as_dict()`` of each entry (as ``json.dumps``
    writes it); written by hand with the C string encoder, because ``json.dump`` with an
    indent takes the pure-Python encoder (a 10^6-entry ledger took 15 s).  A record with
    an unexpected field type is encoded by ``json.dumps``.
    """
    import json
    from json.encoder import encode_basestring_ascii as text

    dumps = json.dumps
    quoted_registry = text(registry)
    known: dict[object, str] = {None: "null"}  # kinds and outcomes, encoded once each
    for seq, kind, name, outcome, detail, at_exit in rows(records):
        kind_text = known.get(kind)
        if kind_text is None and type(kind) is str:
            kind_text = known[kind] = text(kind)
        outcome_text = known.get(outcome)
        if outcome_text is None and type(outcome) is str:
            outcome_text = known[outcome] = text(outcome)
        if (
            kind_text is None
            or outcome_text is None
            or type(seq) is not int
            or type(at_exit) is not bool
            or not (name is None or type(name) is str)
            or not (detail is None or type(detail) is str)
        ):
            entry = LedgerEntry(
                registry, seq, kind, name if name is not None else f"{kind}#{seq}", outcome,
                detail, at_exit,
            )
            yield dumps(entry.as_dict())
            continue
        # (a name left None is "<kind>#<seq>": the kind's JSON text, its quote moved)
        yield (
            f'{{"at_exit": {"true" if at_exit else "false"}, '
            f'"detail": {"null" if detail is None else text(detail)}, '
            f'"kind": {kind_text}, '
            f'"name": {text(name) if name is not None else f"{kind_text[:-1]}#{seq}{chr(34)}"}, '
            f'"outcome": {outcome_text}, "registry": {quoted_registry}, "seq": {seq}}}'
        )


def write_json(
    out: TextIO, head: dict[str, Any], registries: Iterable[tuple[dict[str, Any], list[Any]]]
) -> None:
    """Write the ledger file: ``head`` with a ``"registries"`` list, one object per
    registry (its fields, then its ``"entries"``), one entry per line.

    The result parses to ``{**head, "registries": [{**fields, "entries": [entry dict,
    ...]}, ...]}``, what ``json.dump`` of the same data gives; ``fields`` must hold
    ``"name"`` and not ``"entries"``, and ``records`` are the entries' record list.
    """
    import json
    from itertools import islice

    dumps = json.dumps
    opening = dumps({**head, "registries": []})
    assert opening.endswith("[]}")
    out.write(opening[:-2] + "\n")
    first = True
    for fields, records in registries:
        text = dumps({**fields, "entries": []})
        assert text.endswith("[]}")
        out.write(("" if first else ",\n") + text[:-2])
        first = False
        lines = entry_lines(fields["name"], records)
        chunk = list(islice(lines, FILE_CHUNK))
        separator = "\n"
        while chunk:
            out.write(separator + ",\n".join(chunk))
            separator = ",\n"
            chunk = list(islice(lines, FILE_CHUNK))
        out.write("\n]}" if records else "]}")
    out.write("\n]}\n")


# ---------------------------------------------------------------------- trace grammar

#: Every trace line starts with this.
TRACE_PREFIX = "exitsafe: "

#: The trace events and their fields, in the order they are printed.  A value is a
#: bare token (numbers, outcomes, actions) or a JSON string (names, reasons, errors).
TRACE_EVENTS: dict[str, tuple[str, ...]] = {
    "teardown-begin": ("registry", "reason", "live", "hooks"),
    "plan": ("registry", "steps"),
    "step-begin": ("registry", "index", "of", "kind", "name"),
    "step": ("registry", "index", "of", "action", "kind", "name", "outcome", "ms", "error"),
    "teardown-end": ("registry", "released", "leaked", "failed", "ms"),
    "late-release": ("registry", "kind", "name"),
    "quiesce": ("threads", "parked", "running", "ms"),
    "park": ("threads", "parked", "running", "ms"),
}

#: Fields printed as JSON strings; the others are bare tokens.
TRACE_QUOTED = frozenset({"registry", "reason", "kind", "name", "error"})


def quote(text: str) -> str:
    """Quote a trace value as a JSON string (without importing json)."""
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


def trace_line(event: str, **fields: object) -> str:
    """One trace line: the event, then its fields in grammar order (``None`` omitted)."""
    parts = [TRACE_PREFIX + event]
    for key in TRACE_EVENTS[event]:
        value = fields.get(key)
        if value is None:
            continue
        text = quote(str(value)) if key in TRACE_QUOTED else str(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def parse_trace_line(line: str) -> Optional[tuple[str, dict[str, str]]]:
    """``(event, fields)`` for a line of the grammar, or ``None`` for any other line.

    Values are decoded to ``str`` (JSON strings unquoted).  Unknown events and keys
    are kept, so a newer exitsafe's trace still parses.  Never raises.
    """
    if not line.startswith(TRACE_PREFIX):
        return None
    rest = line[len(TRACE_PREFIX) :]
    event, _, tail = rest.partition(" ")
    if not event or not (event[0].isalpha() and all(c.isalnum() or c in "-_" for c in event)):
        return None
    fields: dict[str, str] = {}
    i, n = 0, len(tail)
    while i < n:
        while i < n and tail[i] == " ":
            i += 1
        if i >= n:
            break
        eq = tail.find("=", i)
        key = tail[i:eq] if eq > i else ""
        if not key or not key.replace("_", "a").isalnum():
            return None
        j = eq + 1
        if j < n and tail[j] == '"':
            value, j = _unquote(tail, j)
            if value is None:
                return None
        else:
            end = tail.find(" ", j)
            end = n if end < 0 else end
            value = tail[j:end]
            j = end
        fields[key] = value
        i = j
    return event, fields


def _unquote(text: str, start: int) -> tuple[Optional[str], int]:
    """Decode the JSON string starting at ``text[start]``; ``(None, _)`` if malformed."""
    import json

    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            try:
                return json.loads(text[start : i + 1]), i + 1
            except ValueError:
                return None, i + 1
        i += 1
    return None, n


def summarize_outcomes(outcomes: Iterable[str]) -> tuple[int, int, int]:
    """``(released, leaked, failed)`` counts of a teardown's outcomes."""
    released = leaked = failed = 0
    for outcome in outcomes:
        if outcome == Outcome.RELEASED_AT_EXIT:
            released += 1
        elif outcome.startswith("leaked_"):
            leaked += 1
        if outcome in (Outcome.RELEASE_FAILED, Outcome.HOOK_FAILED):
            failed += 1
    return released, leaked, failed

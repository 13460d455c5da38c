"""The ledger's trimming, the ledger file and the list of registries, under both cores.

Trimming: the counts stay exact and `ledger()` shows the newest ``ledger_limit`` entries
whatever the limit (``0`` included) and whatever the outcomes; the records never exceed
the cap, and a ledger keeping nothing trims once per `MIN_TRIM` outcomes, not on every
release.  The ledger file (``EXITSAFE_LEDGER``, one entry per line): parsed, it equals
what ``json.dump`` of every registry's fields and entries gave, for any name, kind and
detail.  Registries: listed oldest first, weakly, and the list of them stays bounded.
Counting: the compiled ``count_outcomes`` and the pure-Python count agree with the records.
"""

from __future__ import annotations

import gc
import io
import json
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exitsafe import Registry, _exit, _ledger, _process, lowlevel


def _noop(raw: object) -> None:
    pass


def _record_list(*records: tuple) -> list:
    """A record list holding ``records``, in this core's layout (`_ledger.WIDTH`)."""
    return [item for record in records for item in _ledger.packed(record)]


def _fails(raw: object) -> None:
    raise ValueError(f"cannot release {raw!r}")


def _outcomes(registry: Registry, n: int) -> dict[str, int]:
    """End ``n`` handles of ``registry`` in several outcomes; the expected counts."""
    expected: dict[str, int] = {}
    for i in range(n):
        which = i % 7
        if which == 3:
            handle = registry.track(i, _fails, name=f"f{i}")
            with pytest.raises(ValueError):
                handle.release()
            outcome = "release_failed"
        elif which == 5:
            registry.track(i, _noop, kind="buffer").detach()
            outcome = "detached"
        elif which == 6:
            registry.track(i, _noop)  # dropped: the garbage collection releases it
            outcome = "released"
        else:
            registry.track(i, _noop).release()
            outcome = "released"
        expected[outcome] = expected.get(outcome, 0) + 1
    return expected


@pytest.mark.parametrize("limit", [0, 1, 10, 1000, 3000, None])
@pytest.mark.parametrize("n", [0, 1, 999, 5000])
def test_counts_stay_exact_and_the_newest_entries_are_kept(limit, n):
    registry = Registry("trim", ledger_limit=limit)
    state = registry._state
    expected = _outcomes(registry, n)
    assert registry.ledger_counts() == expected
    entries = registry.ledger()
    shown = n if limit is None else min(n, limit)
    assert [e.seq for e in entries] == list(range(n - shown + 1, n + 1))
    assert len(state.records) <= state.cap
    assert state.ledger.dropped == n - shown
    info = state.as_json()
    assert info["dropped_entries"] == n - shown
    assert info["counts"] == expected
    assert len(info["entries"]) == shown


@pytest.mark.parametrize("limit", [None, 0])
def test_the_records_kept_are_nothing_the_cyclic_garbage_collector_visits(limit):
    """A release leaves its ledger record and nothing the cyclic garbage collector tracks
    (the pure-Python core stores the record's fields flat, the compiled one a record of
    its own): a long-running program's releases make no young collection run, and no
    collection visits the records kept."""
    registry = Registry("untracked", ledger_limit=limit)
    gc.disable()  # (a collection would untrack a tuple of plain values: see the old layout)
    try:
        for i in range(5000):
            registry.track(i, _noop).release()
        kept = list(registry._state.records)
        tracked = [item for item in kept if gc.is_tracked(item)]
    finally:
        gc.enable()
    assert kept and not tracked, tracked[:3]
    assert registry.ledger_counts() == {"released": 5000}


def test_a_ledger_keeping_nothing_trims_once_per_chunk(monkeypatch):
    trims = []
    real = _ledger.Ledger.trim

    def counting(self):
        trims.append(len(self.records))
        real(self)

    monkeypatch.setattr(_ledger.Ledger, "trim", counting)
    registry = Registry("counts-only", ledger_limit=0)
    n = 10 * _ledger.MIN_TRIM + 5
    for i in range(n):
        registry.track(i, _noop).release()
    assert len(trims) == n // _ledger.MIN_TRIM
    assert all(size == _ledger.MIN_TRIM * _ledger.WIDTH for size in trims)
    assert registry.ledger() == []
    assert registry.ledger_counts() == {"released": n}


@pytest.mark.parametrize("limit", [0, 1, 7, 100, 4096, 100_000, 2**62])
def test_the_cap_and_the_chunk(limit):
    ledger = _ledger.Ledger(limit)
    assert ledger.cap == (limit + _ledger.trim_chunk(limit) - 1) * _ledger.WIDTH
    assert _ledger.trim_chunk(limit) >= _ledger.MIN_TRIM
    assert _ledger.trim_chunk(limit) <= max(_ledger.MIN_TRIM, limit)


class _Interrupt(Exception):
    pass


class _TrippingLedger(_ledger.Ledger):
    """A ledger whose first store of the dropped counts raises right after it is made
    (where an interrupt under a tracer may land)."""

    __slots__ = ("tripped",)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name == "_dropped_counts" and getattr(self, "tripped", None) is False:
            object.__setattr__(self, "tripped", True)
            raise _Interrupt


def test_an_interrupted_trim_keeps_the_counts_and_the_records_in_agreement():
    """An exception between the steps of a trim: its handler completes it, so no outcome
    is counted twice or lost."""
    ledger = _TrippingLedger(2)
    total = ledger.cap // _ledger.WIDTH + 1
    for seq in range(1, total + 1):
        ledger.records += _ledger.packed((seq, "handle", None, "released", None, False))
    ledger.tripped = False
    with pytest.raises(_Interrupt):
        ledger.trim()
    assert ledger.tripped
    assert [r[0] for r in _ledger.rows(ledger.records)] == [total - 1, total]
    assert ledger.counts() == {"released": total}
    assert ledger.dropped == total - 2


# ---------------------------------------------------------------------- the ledger file

TEXT = st.text(
    st.characters(blacklist_categories=["Cs"]), max_size=12
)  # (no lone surrogates: not in a str a program passes)


def _old_file(registries: list[Registry]) -> dict:
    """What the ledger file held before it was written line by line: json.dump(indent=1)."""
    data = {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "registries": [r._state.as_json() for r in registries],
    }
    return json.loads(json.dumps(data, indent=1))


def _file_of(registries: list[Registry]) -> str:
    out = io.StringIO()
    _ledger.write_json(
        out,
        {"pid": os.getpid(), "python": sys.version.split()[0]},
        (r._state.ledger_file_part() for r in registries),
    )
    return out.getvalue()


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.one_of(st.none(), TEXT), max_size=5),
    kind=TEXT.filter(bool),
    registry_name=TEXT,
    empty=st.booleans(),
)
def test_the_file_parses_to_what_json_dump_wrote(names, kind, registry_name, empty):
    registries = [Registry(registry_name, ledger_limit=3)]
    if empty:
        registries.append(Registry("empty"))
    registry = registries[0]
    for i, name in enumerate(names):
        handle = registry.track(i, _fails if i % 2 else _noop, name=name, kind=kind)
        try:
            handle.release()
        except ValueError:
            pass
    left = registry.track("left", _noop, name=f"left{kind}")  # live: not in the file
    text = _file_of(registries)
    assert json.loads(text) == _old_file(registries)
    lines = [line.rstrip(",") for line in text.splitlines() if line.startswith('{"at_exit"')]
    assert [json.loads(line) for line in lines] == [e.as_dict() for e in registry.ledger()]
    del left
    for r in registries:
        r.teardown()


def test_a_record_of_unexpected_types_is_written_by_json():
    records = _record_list(
        (1, "handle", None, "released", None, False),
        (2, "kind", "name\n\"quoted\" \u2603 \x00", "released", "why \u00e9", True),
        (3, ("odd", "kind"), None, "released", None, False),  # not a str: json.dumps
    )
    lines = list(_ledger.entry_lines("reg\u00e9", records))  # type: ignore[arg-type]
    assert len(lines) == 3
    parsed = [json.loads(line) for line in lines]
    assert parsed[1] == {
        "at_exit": True, "detail": "why \u00e9", "kind": "kind",
        "name": "name\n\"quoted\" \u2603 \x00", "outcome": "released", "registry": "reg\u00e9",
        "seq": 2,
    }
    assert parsed[2]["kind"] == ["odd", "kind"] and parsed[2]["name"] == "('odd', 'kind')#3"
    assert parsed[0]["name"] == "handle#1"
    assert list(parsed[0]) == list(_ledger.ENTRY_FIELDS)


def test_write_ledger_writes_the_same_data(tmp_path, monkeypatch):
    monkeypatch.setattr(_ledger, "FILE_CHUNK", 7)  # (several chunks)
    target = tmp_path / "ledger.json"
    registry = Registry("file", ledger_limit=None)
    _outcomes(registry, 50)
    alive = lowlevel.registries()  # (kept alive meanwhile: a collection may free others')
    _exit.write_ledger(str(target))
    data = json.loads(target.read_text(encoding="utf-8"))
    assert data == _old_file(alive)
    (mine,) = [r for r in data["registries"] if r["name"] == "file"]
    assert len(mine["entries"]) == 50
    registry.teardown()


# ---------------------------------------------------------------------- registries


def test_registries_are_listed_oldest_first_and_weakly(monkeypatch):
    # (a list of their own: the registries other tests left alive do not count here)
    monkeypatch.setattr(_process, "_registries", [])
    monkeypatch.setattr(_process, "_prune_at", [16])
    made = [Registry(f"r{i}") for i in range(100)]
    kept = made[::3]
    del made
    gc.collect()
    assert lowlevel.registries() == kept
    for i in range(1000):
        Registry(f"dropped{i}")
        assert len(_process._registries) <= _process._prune_at[0]
        if i % 100 == 99:
            gc.collect()  # (a registry and its state are a cycle: freed by a collection)
    gc.collect()
    assert lowlevel.registries() == kept
    Registry("last")  # (prunes the references to the last hundred, now dead, if due)
    gc.collect()
    assert _process._prune_at[0] <= 2 * (len(kept) + 101) + 16
    assert len(_process._registries) <= 2 * (len(kept) + 101) + 16


# ---------------------------------------------------------------------- counting


def test_counting_the_outcomes_of_records_of_any_kind():
    from exitsafe._core import speedups

    class Sequence:  # a record that is neither a tuple nor a compiled record
        def __getitem__(self, i):
            return ("x", "y", "z", "odd")[i]

        def __iter__(self):
            return iter(("x", "y", "z", "odd", None, False))

    registry = Registry("count", ledger_limit=None)
    for i in range(3):
        registry.track(i, _noop).release()
    mine = registry._state.records
    records = [*mine, *_record_list((9, "k", None, "detached", None, False), Sequence())]
    records += list(mine)
    expected = {"released": 6, "detached": 1, "odd": 1}
    assert _ledger.counts_of(records, {}) == expected
    first_four = 4 * _ledger.WIDTH  # (items)
    assert _ledger.counts_of(records[:first_four], {"released": 1}) == {
        "released": 4, "detached": 1
    }
    if speedups is None:
        return
    counts: dict[str, int] = {}
    speedups.count_outcomes(records, len(records) + 5, counts)
    assert counts == expected
    counts = {"released": 1}
    speedups.count_outcomes(records, 4, counts)
    assert counts == {"released": 4, "detached": 1}
    with pytest.raises(TypeError):
        speedups.count_outcomes(records, 1, [])  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        speedups.count_outcomes([()], 1, {})

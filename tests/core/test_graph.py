"""The dependency graph's ranks and cycle check (`exitsafe._graph`), under both cores.

Properties, with hypothesis: whatever the edges added (``track(depends_on=...)``,
``add_dependency`` in any order, teardown hooks' ``before``/``after``) and whatever ends
meanwhile, every live edge goes from a higher rank to a lower one, every rank stays below
the next creation number, and an edge is refused as a cycle exactly when its parent
already depends on its child (checked against a search of the ``_parents`` tuples
themselves).  Run with a tiny search budget and a tiny top gap too, so that the
two-sided search, the index of dependents and the renumbering all take part in small
graphs.  Then: chains built against the creation order move a bounded number of ranks
per edge (no edge is O(length)), and tear down in dependency order.
"""

from __future__ import annotations

import gc
import random
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exitsafe import HandleClosedError, Registry, _graph
from exitsafe.lowlevel import DependencyCycleError


def _noop(raw: object) -> None:
    pass


@contextmanager
def _tuned(budget: int, top_share: int) -> Iterator[None]:
    saved = _graph.FIRST_BUDGET, _graph.TOP_SHARE
    _graph.FIRST_BUDGET, _graph.TOP_SHARE = budget, top_share
    try:
        yield
    finally:
        _graph.FIRST_BUDGET, _graph.TOP_SHARE = saved


def _reaches(start: Any, goal: Any) -> bool:
    """Whether ``start`` depends (transitively) on ``goal``: a search of the edges alone."""
    if start is goal:
        return True
    seen = {id(start)}
    stack = [start]
    while stack:
        for up in stack.pop()._parents:
            if up is goal:
                return True
            if id(up) not in seen:
                seen.add(id(up))
                stack.append(up)
    return False


def _check_ranks(registry: Registry, top_seq: int) -> None:
    for node in registry._state.live.nodes():
        assert node._rank < top_seq + 1, (node, node._rank, top_seq)
        for parent in node._parents:
            if parent._parents or parent._state <= 1:  # (a live parent: still ranked)
                assert node._rank > parent._rank, (node, node._rank, parent, parent._rank)


INDEX = st.integers(0, 40)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("track"), st.lists(INDEX, max_size=2)),
        st.tuples(st.just("edge"), INDEX, st.lists(INDEX, min_size=1, max_size=2)),
        st.tuples(st.just("edge"), INDEX, st.lists(INDEX, min_size=1, max_size=1)),
        st.tuples(st.just("release"), INDEX),
        st.tuples(st.just("drop"), INDEX),
        st.tuples(st.just("hook"), st.lists(INDEX, max_size=2), st.lists(INDEX, max_size=2)),
    ),
    max_size=60,
)


def _run_ops(ops: list[tuple[Any, ...]]) -> None:
    registry = Registry("graph-property", ledger_limit=None)
    handles: list[Optional[Any]] = [registry.track(i, _noop) for i in range(6)]
    top = max(h._seq for h in handles if h is not None)

    def pick(i: int) -> Optional[Any]:
        return handles[i % len(handles)] if handles else None

    for op in ops:
        kind = op[0]
        if kind == "track":
            parents = list(dict.fromkeys(p for p in (pick(i) for i in op[1]) if p is not None))
            try:
                handle = registry.track(len(handles), _noop, depends_on=parents)
            except HandleClosedError:
                continue
            handles.append(handle)
            top = max(top, handle._seq)
        elif kind == "edge":
            child = pick(op[1])
            parents = [p for p in (pick(i) for i in op[2]) if p is not None]
            if child is None or not parents:
                continue
            closing = next((p for p in parents if _reaches(p, child)), None)
            try:
                child.add_dependency(*dict.fromkeys(parents))
            except HandleClosedError:
                pass
            except DependencyCycleError as exc:
                assert closing is not None, f"refused a cycle that is not there: {exc}"
                names = exc.cycle
                assert names[0] == names[-1] == child.name
            else:
                assert closing is None, "accepted an edge closing a cycle"
                for parent in parents:
                    assert parent in child._parents
        elif kind == "release":
            handle = pick(op[1])
            if handle is not None:
                handle.release()
        elif kind == "drop":
            if handles:
                handles[op[1] % len(handles)] = None
                gc.collect()
        else:
            before = [p for p in (pick(i) for i in op[1]) if p is not None]
            after = [c for c in (pick(i) for i in op[2]) if c is not None]
            closing = any(_reaches(p, c) for p in before for c in after)
            try:
                hook = registry.on_teardown(lambda: None, before=before, after=after)
            except HandleClosedError:
                pass
            except DependencyCycleError:
                assert closing
            else:
                assert not closing or any(c._state > 1 or not c._refs for c in after)
                handles.append(hook)
                top = max(top, hook._seq)
        _check_ranks(registry, top)
    registry.teardown()
    assert len(registry) == 0


@pytest.mark.parametrize(
    ("budget", "top_share"), [(_graph.FIRST_BUDGET, _graph.TOP_SHARE), (1, 2)]
)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(ops=OPS)
def test_ranks_stay_topological_and_cycles_are_refused_exactly(
    budget: int, top_share: int, ops: list[tuple[Any, ...]]
) -> None:
    with _tuned(budget, top_share):
        _run_ops(ops)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.permutations(range(24)), budget=st.sampled_from([1, 2, 8]))
def test_any_build_order_of_a_chain_is_acyclic_and_tears_down_in_order(
    order: list[int], budget: int
) -> None:
    released: list[int] = []
    registry = Registry("graph-chain", ledger_limit=None)
    handles = [registry.track(i, released.append) for i in range(25)]
    with _tuned(budget, 2):
        for i in order:  # edge i: handle i depends on handle i + 1
            handles[i].add_dependency(handles[i + 1])
            _check_ranks(registry, 25)
        for i in range(24):  # every edge back would close a cycle
            with pytest.raises(DependencyCycleError):
                handles[i + 1 + (i % 3 if i + 1 + i % 3 < 25 else 0)].add_dependency(handles[i])
    registry.teardown()
    assert released == list(range(25))


def _ranks(registry: Registry) -> dict[int, float]:
    return {node._seq: node._rank for node in registry._state.live.nodes()}


@pytest.mark.parametrize("order", ["forward", "reverse", "random", "pairs"])
def test_one_edge_onto_a_long_chain_moves_a_bounded_number_of_ranks(order: str) -> None:
    """Each edge of a chain built in any of these orders re-ranks a few nodes, not the
    chain (the cost of an edge is that of the smaller side of the search)."""
    n = 2_000
    registry = Registry("graph-bounded", ledger_limit=None)
    handles = [registry.track(i, _noop) for i in range(n)]
    edges = list(range(n - 1))
    if order == "reverse":
        edges.reverse()
    elif order == "random":
        random.Random(7).shuffle(edges)
    elif order == "pairs":  # pairs first, then joined from the far end
        edges = edges[0::2] + edges[1::2][::-1]
    moved = []
    for i in edges:
        before = _ranks(registry)
        handles[i].add_dependency(handles[i + 1])
        after = _ranks(registry)
        moved.append(sum(1 for k, v in after.items() if before[k] != v))
    _check_ranks(registry, n)
    if order == "random":  # segments of expected length O(log n)
        assert sum(moved) / len(moved) < 20, sum(moved) / len(moved)
    else:
        assert max(moved) <= 2 * _graph.FIRST_BUDGET, max(moved)
    # one more edge, from the chain's top onto a new node, and from a new node onto it
    late = registry.track("late", _noop)
    before = _ranks(registry)
    handles[-1].add_dependency(late)
    handles[0].add_dependency(registry.track("x", _noop))
    assert sum(1 for k, v in _ranks(registry).items() if k in before and before[k] != v) <= 2
    registry.teardown()
    assert registry.ledger_counts() == {"released_at_exit": n + 2}


def test_dependents_index_catches_up_and_compacts() -> None:
    registry = Registry("graph-index", ledger_limit=None)
    root = registry.track("root", _noop)
    kids = [registry.track(i, _noop, depends_on=root) for i in range(10)]
    index = _graph.dependents_of(registry._state)
    assert sorted(k._seq for k in index.dependents(root)) == sorted(k._seq for k in kids)
    late = [registry.track(i, _noop, depends_on=kids[0]) for i in range(3)]
    older = registry.track("older-child", _noop)
    older.add_dependency(root)  # an edge added to a node the index knows: noted at once
    assert older in set(index.dependents(root))
    index = _graph.dependents_of(registry._state)  # caught up with the nodes created since
    assert {k._seq for k in index.dependents(kids[0])} == {k._seq for k in late}
    for handle in late + kids[1:]:
        handle.release()
    assert {k._seq for k in index.dependents(root)} == {kids[0]._seq, older._seq}
    index.compact()
    assert sorted(len(v) for v in index.of.values()) == [2]
    del handle, late
    registry.teardown()


def test_live_table_since() -> None:
    registry = Registry("since", ledger_limit=None)
    handles = [registry.track(i, _noop) for i in range(10)]
    handles[3].release()
    handles[9].release()
    seqs = [h._seq for h in handles]
    assert [n._seq for n in registry._state.live.since(seqs[4])] == seqs[5:9]
    assert [n._seq for n in registry._state.live.since(0)] == seqs[:3] + seqs[4:9]
    assert registry._state.live.since(seqs[-1]) == []
    registry.teardown()


def test_exhausted_gaps_renumber_the_graph() -> None:
    """Halving the gap above a chain built against the order exhausts floating point
    after some fifty edges: the graph is renumbered, and stays topological."""
    calls = []
    renumber = _graph.renumber

    def counting(nodes: Any) -> None:
        calls.append(len(nodes))
        renumber(nodes)

    released: list[int] = []
    registry = Registry("graph-renumber", ledger_limit=None)
    handles = [registry.track(i, released.append) for i in range(300)]
    _graph.renumber = counting
    try:
        with _tuned(_graph.FIRST_BUDGET, 2):
            for i in reversed(range(299)):
                handles[i].add_dependency(handles[i + 1])
                _check_ranks(registry, 300)
    finally:
        _graph.renumber = renumber
    assert calls and all(n == 300 for n in calls), calls
    assert len(calls) < 30, len(calls)
    registry.teardown()
    assert released == list(range(300))


def test_renumbering_while_a_hook_takes_its_after_edges_ranks_the_hook_too() -> None:
    """A hook joins the live table after its ``after`` edges are ranked: a renumbering
    while they are (the gap exhausted) must still rank it, or the edges already made to it
    would point up in rank."""
    registry = Registry("graph-hook-renumber", ledger_limit=None)
    p = registry.track("p", _noop)
    c1 = registry.track("c1", _noop)
    c2 = registry.track("c2", _noop)
    move = _graph._move
    renumbered: list[int] = []
    renumber = _graph.renumber

    def failing_once(child: Any, parent: Any, found: Any) -> bool:
        if child is c2 and not renumbered:
            return False  # as if floating point could not split the gap: a renumbering
        return move(child, parent, found)

    def counting(nodes: Any) -> None:
        renumbered.append(len(nodes))
        renumber(nodes)

    _graph._move, _graph.renumber = failing_once, counting
    try:
        hook = registry.on_teardown(lambda: None, before=[p], after=[c1, c2])
    finally:
        _graph._move, _graph.renumber = move, renumber
    assert renumbered == [4]
    _check_ranks(registry, hook._seq)
    assert hook._rank > p._rank and c1._rank > hook._rank and c2._rank > hook._rank
    registry.teardown()


def test_the_index_of_dependents_keeps_no_handle_alive() -> None:
    registry = Registry("graph-weak", ledger_limit=None)
    released: list[str] = []
    child = registry.track("child", released.append)
    grandchild = registry.track("grandchild", released.append, depends_on=child)
    parent = registry.track("parent", released.append)
    for i in range(4 * _graph.FIRST_BUDGET):  # (an ancestry longer than child's dependents)
        parent = registry.track(f"parent-{i}", _noop, depends_on=parent)
    child.add_dependency(parent)  # against the order: the forward side reads the index
    index = registry._state.dependents
    assert index is not None
    assert list(index.dependents(parent)) == [child]
    del child, grandchild
    gc.collect()
    assert released == ["grandchild", "child"]
    assert list(_graph.dependents_of(registry._state).dependents(parent)) == []
    registry.teardown()
    assert released == ["grandchild", "child", "parent"]

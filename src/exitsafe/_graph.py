"""The dependency graph: adding edges with an exact cycle check, and the teardown plan.

Nodes are `exitsafe._record.Record` records; an edge goes from a node to each of its
``parents`` (the nodes it depends on, which must outlive it).  Nothing here recurses,
so a chain of any length is fine, and nothing here takes a lock: callers hold
`exitsafe._sync.LOCK`.  Ranks are written through `exitsafe._record.set_rank`.

Ranks keep edge insertion cheap.  Every node has a ``rank`` lower than the rank of
every node depending on it (a topological numbering).  A new node gets its creation
number as its rank, above all others, so ``track(depends_on=...)`` never searches;
every rank stays below the next creation number.  An edge ``child -> parent`` with
``rank(child) > rank(parent)`` is consistent and cannot close a cycle either (every
path out of ``parent`` only goes down in rank).  Only an edge against the order needs
a search, bounded to the ranks between the two nodes, from both ends at once (Pearce
and Kelly's two searches, with a budget that doubles in turn, so that the cost is that
of the smaller side):

* backward from ``parent`` along "depends on" edges, through ranks at or above
  ``rank(child)``: the *ancestor region*, which may be moved below ``child``;
* forward from ``child`` along "is depended on by" edges, through ranks at or below
  ``rank(parent)``: the *dependent region*, which may be moved above ``parent``.

The side that completes first is moved into the gap next to the other node (keeping
its internal order), and decides the cycle check: the edge closes a cycle exactly when
the search reaches the other node.  A child nothing depends on is its own dependent
region (no search).  Building a chain of 10^4 edges in any order takes milliseconds.

Records keep only their parents and a count of their dependents, so the forward search
reads a `Dependents` index: built on its first use (a program whose edges follow the
creation order never builds it), then kept up to date with the handles created since
(`LiveTable.since`) and the edges added since; it holds weak references, so it keeps
no handle alive, and drops the ended ones as it grows.
"""

from __future__ import annotations

from _weakref import ref as _weakref

from ._core import speedups
from ._record import Record as Node
from ._record import set_rank

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from typing import Any, Callable, Optional, Union

#: Edges each side of the search examines in its first turn (then twice as many each).
FIRST_BUDGET = 8
#: A region moved above ``parent`` with nothing above it but the next creation number is
#: packed in this fraction of the gap, next to ``parent``: a chain built against the
#: order stacks its nodes there, one per edge, for ~10^6 edges before a renumbering.
TOP_SHARE = 1 << 16


class _Search:
    """One side of the two-sided search (see the module documentation).

    From ``start`` along ``step(node)`` (the parents, or the dependents), through the
    nodes ranked within the bound (at or above ``limit`` going down, at or below it going
    up), looking for ``goal``.  `run` goes on for a given number of edges; ``done`` when
    the region is complete, ``found`` (the node that reached ``goal``) when it got there.
    ``edge`` is the nearest rank outside the region next to it: the highest parent below
    it, or the lowest dependent above it (``None``: none).
    """

    __slots__ = ("came_from", "down", "edge", "found", "goal", "limit", "stack", "step")

    def __init__(
        self, start: Node, goal: Node, down: bool, step: Callable[[Node], Iterable[Node]]
    ) -> None:
        self.came_from: dict[Node, Optional[Node]] = {start: None}
        self.stack: list[tuple[Node, Iterator[Node]]] = [(start, iter(step(start)))]
        self.goal = goal
        self.down = down
        self.limit = goal._rank
        self.step = step
        self.edge: Optional[float] = None
        self.found: Optional[Node] = None

    @property
    def done(self) -> bool:
        return not self.stack

    def run(self, budget: int) -> None:
        came_from, stack, goal, limit, step = (
            self.came_from, self.stack, self.goal, self.limit, self.step
        )
        down = self.down
        while stack and budget > 0:
            node, following = stack[-1]
            for other in following:
                budget -= 1
                rank = other._rank
                if (rank < limit) if down else (rank > limit):
                    edge = self.edge
                    if edge is None or ((rank > edge) if down else (rank < edge)):
                        self.edge = rank
                elif other is goal:
                    self.found = node
                    return
                elif other not in came_from:
                    came_from[other] = node
                    stack.append((other, iter(step(other))))
                    break
                if budget <= 0:
                    return
            else:
                stack.pop()

    def region(self) -> list[Node]:
        return list(self.came_from)


def _parents(node: Node) -> tuple[Node, ...]:
    return node._parents


def _search(child: Node, parent: Node) -> Union[list[Node], _Search, None]:
    """For the edge ``child -> parent``, ranked against the order: the chain
    ``parent -> ... -> child`` that it would close (a list), or the completed side to
    move (a `_Search`), or ``None`` when ``child`` has no dependent (it moves alone)."""
    state = child._registry
    if not child._children and not state.hooks.count:
        return None  # nothing depends on child (a hook's edges are not counted: no hooks)
    down = _Search(parent, child, True, _parents)
    down.run(FIRST_BUDGET)
    if down.found is not None:
        return _chain(down, child, reverse=True)
    if down.done:
        return down
    index = dependents_of(state)
    up = _Search(child, parent, False, index.dependents)
    budget = FIRST_BUDGET
    while True:
        up.run(budget)
        if up.found is not None:
            return _chain(up, parent, reverse=False)
        if up.done:
            return up
        down.run(budget)
        if down.found is not None:
            return _chain(down, child, reverse=True)
        if down.done:
            return down
        budget *= 2


def _chain(side: _Search, end: Node, reverse: bool) -> list[Node]:
    """The path that ``side`` found, from its start to ``end``, reversed if asked."""
    path = [end]
    step: Optional[Node] = side.found
    while step is not None:
        path.append(step)
        step = side.came_from[step]
    if reverse:
        path.reverse()
    return path


def cycle_path(parent: Node, child: Node) -> Optional[list[Node]]:
    """The chain ``parent -> ... -> child`` along "depends on" edges, or ``None``.

    When it exists, adding the edge ``child -> parent`` would close a cycle.  Only
    nodes ranked between the two can be on such a chain; ended nodes (no parents any
    more) end a chain too.  Searched from both ends (see the module documentation).
    When there is none, the ranks are made ready for the edge (the side searched is
    moved: the ranks stay topological whether or not the edge is then added), so that
    `add_edge` has nothing left to do.
    """
    if parent is child:
        return [parent]
    if parent._rank < child._rank:
        return None
    found = _search(child, parent)
    if isinstance(found, list):
        return found
    _move(child, parent, found)  # (if the ranks between are exhausted, add_edge renumbers)
    return None


def add_edge(child: Node, parent: Node, all_nodes: Callable[[], Sequence[Node]]) -> None:
    """Record ``child -> parent`` in the ranks (the caller checked `cycle_path`
    and appends ``parent`` to ``child._parents``).

    ``all_nodes`` returns every live node; it is needed only in the rare case where
    the ranks between two nodes are exhausted and the whole graph is renumbered.
    """
    for attempt in range(2):
        if child._rank > parent._rank:
            break
        found = _search(child, parent)
        if isinstance(found, list):  # pragma: no cover - the caller checked
            raise AssertionError("exitsafe: add_edge would close a cycle; this is a bug")
        if _move(child, parent, found):
            break
        if attempt:  # pragma: no cover - renumbered ranks are one apart
            raise AssertionError("exitsafe: no rank between two nodes after renumbering")
        renumber(all_nodes())
    index: Optional[Dependents] = child._registry.dependents
    if index is not None:  # (built meanwhile, it lacks the edge too: child._parents does)
        index.note(child, parent)


def _move(child: Node, parent: Node, found: Optional[_Search]) -> bool:
    """Re-rank the side `_search` found so that ``child`` ranks above ``parent``;
    ``False`` (nothing changed) when floating point cannot split the gap."""
    if found is None:
        return _place([child], parent._rank, _top(parent), packed=True)
    if found.down:
        return _place(found.region(), found.edge, child._rank, packed=False)
    top = _top(parent)
    edge = found.edge
    return _place(
        found.region(), parent._rank, top if edge is None else min(edge, top),
        packed=edge is None or edge > top,
    )


def _top(node: Node) -> float:
    """A bound above ``node`` that the next creation number cannot be below: the next
    integer (every rank is below the next creation number, an integer)."""
    return node._rank // 1 + 1


def _place(region: list[Node], low: Optional[float], high: float, packed: bool) -> bool:
    """Re-rank ``region`` into the gap between ``low`` and ``high`` (exclusive), keeping
    its internal order: one apart below ``high`` when nothing bounds it below (``low``
    is ``None``), spread evenly, or, ``packed``, in the lowest `TOP_SHARE`-th of the gap.
    Returns ``False`` (nothing changed) when floating point cannot split the gap."""
    region.sort(key=_rank)
    count = len(region)
    if low is None:
        ranks = [high - count + i for i in range(count)]
    else:
        step = (high - low) / (max(count + 1, TOP_SHARE) if packed else count + 1)
        ranks = [low + step * (i + 1) for i in range(count)]
    previous = low
    for rank in ranks:
        if (previous is not None and not rank > previous) or not rank < high:
            return False
        previous = rank
    for node, rank in zip(region, ranks):
        set_rank(node, rank)
    return True


def _rank(node: Node) -> float:
    return node._rank


class Dependents:
    """One registry's reverse edges, for the forward half of the search.

    ``of`` maps a node's creation number to weak references to the nodes that depend
    on it; an entry may be stale (the dependent ended, or is listed twice), which
    `dependents` skips and `compact` drops.  The nodes created after creation number
    ``seen`` are not in it yet: `dependents_of` adds them (their parents) before a
    search.  The edges added to older nodes are added by `add_edge` as they come.
    """

    __slots__ = ("added", "compact_at", "of", "seen")

    def __init__(self) -> None:
        self.of: dict[int, list[Any]] = {}
        self.seen = 0
        self.added = 0  # entries added since the last compaction
        self.compact_at = 4096

    def note(self, child: Node, parent: Node) -> None:
        """``child`` depends on ``parent`` from now on."""
        refs = self.of.get(parent._seq)
        if refs is None:
            refs = self.of[parent._seq] = []
        refs.append(_weakref(child))
        self.added += 1

    def catch_up(self, live: Any) -> None:
        """Add the edges of the nodes created since the last call (``live``: a LiveTable)."""
        seen = self.seen
        for node in live.since(seen):
            for parent in node._parents:
                self.note(node, parent)
            if node._seq > seen:
                seen = node._seq
        self.seen = seen
        if self.added >= self.compact_at:
            self.compact()

    def compact(self) -> None:
        """Drop the stale entries: O(entries), once per as many added."""
        kept = 0
        of = self.of
        for seq in list(of):
            live: dict[Any, None] = {}
            for ref in of[seq]:
                node = ref()
                if node is not None and ref not in live:
                    for parent in node._parents:
                        if parent._seq == seq:
                            live[ref] = None
                            break
            if live:
                of[seq] = list(live)
                kept += len(live)
            else:
                del of[seq]
        self.added = 0
        self.compact_at = max(4096, kept)

    def dependents(self, node: Node) -> Iterator[Node]:
        """The nodes depending on ``node`` directly (each once or more)."""
        for ref in self.of.get(node._seq, ()):
            other = ref()
            if other is not None and node in other._parents:
                yield other


def dependents_of(state: Any) -> Dependents:
    """The index of dependents of a registry's ``state`` (its ``dependents``), built on
    first use, brought up to date."""
    index: Dependents = state.dependents_index()
    index.catch_up(state.live)
    return index


def renumber(nodes: Sequence[Node]) -> None:
    """Give ``nodes`` fresh integer ranks 1..n in a topological order (parents first)."""
    order = teardown_order(nodes)
    count = len(order)
    for index, node in enumerate(order):
        set_rank(node, float(count - index))


def teardown_order(nodes: Sequence[Node]) -> list[Node]:
    """Order ``nodes`` (distinct, given oldest first) so that every node precedes its parents.

    Kahn's algorithm over the reversed edges, O(nodes + edges).  Among the nodes that
    are ready, hooks go before handles and handles before libraries; within one role
    the newest node goes first, the way an ``ExitStack`` unwinds.  Parents outside
    ``nodes`` (already gone) are ignored.

    Each node's ``parents`` is read exactly once: a release finishing on another thread
    may clear it meanwhile, and the counts of both passes must come from the same edges.
    The compiled core runs the same algorithm for its handles (``speedups.teardown_order``).
    """
    if speedups is not None:
        planned = speedups.teardown_order(nodes)
        if planned is not None:
            return planned  # type: ignore[no-any-return]
    return python_teardown_order(nodes)


def python_teardown_order(nodes: Sequence[Node]) -> list[Node]:
    """`teardown_order` in Python (the compiled core's is checked against it)."""
    remaining: dict[Node, int] = dict.fromkeys(nodes, 0)
    edges: dict[Node, tuple[Node, ...]] = {}
    for node in nodes:
        parents = edges[node] = node._parents
        for parent in parents:
            if parent in remaining:
                remaining[parent] += 1
    stacks: tuple[list[Node], list[Node], list[Node]] = ([], [], [])
    for node in nodes:
        if not remaining[node]:
            stacks[node._role].append(node)
    hooks, handles, libraries = stacks
    order: list[Node] = []
    append = order.append
    while True:
        if hooks:
            node = hooks.pop()
        elif handles:
            node = handles.pop()
        elif libraries:
            node = libraries.pop()
        else:
            break
        append(node)
        for parent in edges[node]:
            count = remaining.get(parent)
            if count is not None:
                count -= 1
                remaining[parent] = count
                if not count:
                    stacks[parent._role].append(parent)
    if len(order) != len(remaining):  # pragma: no cover - registration rejects cycles
        raise AssertionError("exitsafe: the handle graph has a cycle; this is a bug")
    return order


def unique(nodes: Iterable[Node]) -> tuple[Node, ...]:
    """``nodes`` without repeats, first occurrence kept."""
    return tuple(dict.fromkeys(nodes))

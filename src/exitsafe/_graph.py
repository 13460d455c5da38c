"""The dependency graph: adding edges with an exact cycle check, and the teardown plan.

Nodes are `exitsafe._record.Record` records; an edge goes from a node to each of its
``parents`` (the nodes it depends on, which must outlive it).  Nothing here recurses,
so a chain of any length is fine, and nothing here takes a lock: callers hold
`exitsafe._sync.LOCK`.  Ranks are written through `exitsafe._record.set_rank`.

Ranks keep edge insertion cheap.  Every node has a ``rank`` lower than the rank of
every node depending on it (a topological numbering).  A new node gets a rank above
all others, so ``track(depends_on=...)`` never searches.  An edge ``child -> parent``
with ``rank(child) > rank(parent)`` is consistent and cannot close a cycle either
(every path out of ``parent`` only goes down in rank).  Only an edge against the
order needs a search, bounded to the ranks between the two nodes, after which the
nodes found are moved below ``child`` (one side of Pearce and Kelly's algorithm).
"""

from __future__ import annotations

from ._core import speedups
from ._record import Record as Node
from ._record import set_rank

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Callable, Optional


def cycle_path(parent: Node, child: Node) -> Optional[list[Node]]:
    """The chain ``parent -> ... -> child`` along "depends on" edges, or ``None``.

    When it exists, adding the edge ``child -> parent`` would close a cycle.  Only
    nodes ranked at or above ``child`` can be on such a chain, so the search stops
    at lower ranks; ended nodes (no parents any more) end a chain too.
    """
    if parent is child:
        return [parent]
    floor = child._rank
    if parent._rank < floor:
        return None
    came_from: dict[Node, Optional[Node]] = {parent: None}
    stack = [parent]
    while stack:
        node = stack.pop()
        for up in node._parents:
            if up in came_from or up._rank < floor:
                continue
            came_from[up] = node
            if up is child:
                path = [up]
                step: Optional[Node] = node
                while step is not None:
                    path.append(step)
                    step = came_from[step]
                path.reverse()
                return path
            stack.append(up)
    return None


def add_edge(child: Node, parent: Node, all_nodes: Callable[[], Sequence[Node]]) -> None:
    """Record ``child -> parent`` in the ranks (the caller checked `cycle_path`
    and appends ``parent`` to ``child._parents``).

    ``all_nodes`` returns every live node; it is needed only in the rare case where
    the ranks between two nodes are exhausted and the whole graph is renumbered.
    """
    if child._rank > parent._rank:
        return
    region = _ancestors_from(parent, child._rank)
    if not _move_below(region, child._rank):
        renumber(all_nodes())
        region = _ancestors_from(parent, child._rank)
        _move_below(region, child._rank)


def _ancestors_from(start: Node, floor: float) -> list[Node]:
    """``start`` and its ancestors ranked at or above ``floor``."""
    seen = {start}
    stack = [start]
    while stack:
        node = stack.pop()
        for up in node._parents:
            if up not in seen and up._rank >= floor:
                seen.add(up)
                stack.append(up)
    return list(seen)


def _move_below(region: list[Node], ceiling: float) -> bool:
    """Re-rank ``region`` into the gap below ``ceiling``, keeping its internal order.

    The gap starts above the highest-ranked parent of a region node outside the
    region.  Returns ``False`` (nothing changed) when floating point cannot split it.
    """
    inside = set(region)
    floor = None
    for node in region:
        for up in node._parents:
            if up not in inside and (floor is None or up._rank > floor):
                floor = up._rank
    region.sort(key=_rank)
    count = len(region)
    if floor is None:
        ranks = [ceiling - count + i for i in range(count)]
    else:
        step = (ceiling - floor) / (count + 1)
        ranks = [floor + step * (i + 1) for i in range(count)]
    previous = floor
    for rank in ranks:
        if (previous is not None and not rank > previous) or not rank < ceiling:
            return False
        previous = rank
    for node, rank in zip(region, ranks):
        set_rank(node, rank)
    return True


def _rank(node: Node) -> float:
    return node._rank


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

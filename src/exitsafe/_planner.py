"""Teardown planning and dependency-graph checks, iterative and linear.

Nodes are :class:`exitsafe.Handle` objects; an edge goes from a
node to each of its ``_parents`` (the handles it depends on, which must
outlive it).  Nothing here recurses, so a chain of any length is fine.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Optional

    from .lifetime import Handle as HandleInfo

#: Step priorities: among the steps whose dependents are all done, hooks run
#: first, then ordinary handles, then libraries (whose code others may call).
ROLE_HOOK, ROLE_HANDLE, ROLE_LIBRARY = 0, 1, 2


def teardown_order(nodes: Sequence[HandleInfo]) -> list[HandleInfo]:
    """Order ``nodes`` (given oldest first) so that every node precedes its parents.

    Kahn's algorithm over the reversed edges, O(nodes + edges).  Among the
    nodes that are ready, hooks go before handles and handles before
    libraries; within one priority the newest node goes first, the way an
    ``ExitStack`` unwinds.  Parents outside ``nodes`` (already gone) are
    ignored.

    Each node's ``_parents`` is read exactly once: a release finishing on
    another thread may clear it meanwhile, and the counts of both passes must
    come from the same edges.
    """
    remaining: dict[HandleInfo, int] = dict.fromkeys(nodes, 0)
    edges: dict[HandleInfo, tuple[HandleInfo, ...]] = {}
    for node in nodes:
        parents = edges[node] = node._parents
        for parent in parents:
            if parent in remaining:
                remaining[parent] += 1
    stacks: tuple[list[HandleInfo], list[HandleInfo], list[HandleInfo]] = ([], [], [])
    for node in nodes:
        if not remaining[node]:
            stacks[node._role].append(node)
    hooks, handles, libraries = stacks
    order: list[HandleInfo] = []
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


def dependency_path(start: HandleInfo, goal: HandleInfo) -> Optional[list[HandleInfo]]:
    """The chain ``start -> ... -> goal`` following "depends on" edges, or ``None``.

    Iterative depth-first search over ``start``'s ancestors that are still
    live; used to reject a new edge that would close a cycle.
    """
    if start is goal:
        return [start]
    came_from: dict[HandleInfo, Optional[HandleInfo]] = {start: None}
    stack = [start]
    while stack:
        node = stack.pop()
        for parent in node._parents:
            if parent in came_from or parent._state >= 2:
                continue
            came_from[parent] = node
            if parent is goal:
                path = [parent]
                step: Optional[HandleInfo] = node
                while step is not None:
                    path.append(step)
                    step = came_from[step]
                path.reverse()
                return path
            stack.append(parent)
    return None


def unique(nodes: Iterable[HandleInfo]) -> tuple[HandleInfo, ...]:
    """``nodes`` without repeats, first occurrence kept."""
    return tuple(dict.fromkeys(nodes))

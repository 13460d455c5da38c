"""From the objects a program passes to the handles exitsafe keeps for them.

Every ``depends_on`` / ``before`` / ``after`` / ``uses`` argument accepts handles, and,
through `resolve`, any object exitsafe knows: one with an ``__exitsafe_handle__``
attribute (a [`NativeObject`][exitsafe.NativeObject]), or one a lookup registered with
`register_lookup` finds (adopted objects, the FFI adapters' pinned libraries and tracked
pointers).  `parents` then checks that the handles can be edges of the registry's graph.
Nothing here imports the modules that register lookups: they register themselves when
imported.
"""

from __future__ import annotations

from . import _graph, _sync
from ._errors import ForeignHandleError
from ._record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable, Optional

    from ._handle import Handle

__all__ = ["find", "parents", "register_lookup", "resolve"]

#: obj, registry -> the handle exitsafe keeps for obj there, or None.
_lookups: list[Callable[[object, Any], Optional[Record]]] = []


def register_lookup(fn: Callable[[object, Any], Optional[Record]]) -> None:
    """Let a module teach [`handle_of`][exitsafe.lowlevel.handle_of] about its own objects."""

    def add() -> None:
        if fn not in _lookups:
            _lookups.append(fn)

    _sync.locked("register_lookup()", add)


def find(obj: object, registry: Any) -> Optional[Record]:
    """The live handle standing for ``obj`` in ``registry`` (a Registry), or ``None``."""
    if isinstance(obj, Record):
        return obj
    found: Optional[Record] = None
    try:
        attr = getattr(obj, "__exitsafe_handle__", None)
    except Exception:  # a hostile __getattr__ must not break a lookup; fall through
        attr = None
    if isinstance(attr, Record):
        found = attr
    if found is None:
        for lookup in tuple(_lookups):
            found = lookup(obj, registry)
            if found is not None:
                break
    if found is None or found._registry.facade is not registry or found._state > 1:
        return None
    return found


def resolve(items: object, registry: Any, what: str) -> tuple[Handle, ...]:
    """Turn ``depends_on``-style arguments (handles or objects exitsafe knows) into handles."""
    if items is None or (type(items) in (tuple, list) and not items):
        return ()
    if isinstance(items, (Record, str, bytes)) or not hasattr(items, "__iter__"):
        seq: Iterable[object] = (items,)
    else:
        seq = items
    out = []
    for item in seq:
        if isinstance(item, Record):
            out.append(item)
            continue
        found = find(item, registry)
        if found is None:
            raise TypeError(
                f"{what}: no live exitsafe handle for {item!r} in registry "
                f"{registry.name!r}; pass a Handle, or track / pin / adopt the object first"
            )
        out.append(found)
    return tuple(out)  # type: ignore[arg-type]


def parents(handles: object, state: Any, what: str) -> tuple[Record, ...]:
    """``handles`` (a handle, or an iterable of them) as distinct records of ``state``'s
    registry, or the `TypeError` / [`ForeignHandleError`][exitsafe.lowlevel.ForeignHandleError]
    naming ``what``."""
    if isinstance(handles, Record):
        items: tuple[object, ...] = (handles,)
    else:
        try:
            items = tuple(handles)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"{what} must be a Handle or an iterable of Handles, "
                f"got {type(handles).__name__}"
            ) from None
    for item in items:
        if not isinstance(item, Record):
            hint = (  # a NativeObject wrapper, or any object holding its handle
                "; pass its .handle" if isinstance(getattr(item, "handle", None), Record)
                else ""
            )
            raise TypeError(
                f"{what} must contain exitsafe Handles (from track/pin/on_teardown), "
                f"got {type(item).__name__}{hint}"
            )
        owner = item._registry
        if owner is not state:
            raise ForeignHandleError(
                f"{what}: {item.name!r} belongs to registry {owner.name!r}, "  # type: ignore[attr-defined]
                f"not {state.name!r}; dependencies cannot cross registries"
            )
    if len(items) == 1:
        return items  # type: ignore[return-value]  # (one: nothing repeats)
    return _graph.unique(items)  # type: ignore[arg-type]

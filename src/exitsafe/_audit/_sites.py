"""Where the objects that have a native finalizer were made: the creation-site hooks.

Installed at start-up (`install_site_hooks`): each ``ffi.gc`` result of cffi's ``FFI`` (ABI
mode), each ``weakref.finalize``, and each instance of a class with a Python ``__del__`` and
a Python ``__init__`` defined outside the standard library (found as the class statement
runs: ``builtins.__build_class__`` is wrapped) gets the number of the place it was made at;
`gc_site` and `object_site` read a place back as code objects and lines.
"""

from __future__ import annotations

import sys

from ._state import state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Optional

#: Function names skipped when walking out of a constructor to its caller.
_CONSTRUCTORS = ("__init__", "__new__", "__call__", "__post_init__")


def _hook_ffi_gc(ffi_class: Any) -> None:
    """Record where each ``ffi.gc`` result of cffi's ``FFI`` (ABI mode) is made.

    The hot path allocates nothing the garbage collector tracks (it would make every
    collection of an allocation-heavy program slower): each distinct place (the caller and
    its caller, as code and instruction) gets a number once, and the table maps the result's
    id to that number.  The table is pruned of dead pointers only when it has doubled."""
    original = ffi_class.__dict__.get("gc")
    if original is None or getattr(original, "_exitsafe_audit", False):
        return
    sites = state.gc_sites
    places = state.gc_places
    shared = state
    getframe = sys._getframe
    two = state.frames >= 2

    def gc(self: Any, cdata: Any, destructor: Any, size: int = 0) -> Any:
        result = original(self, cdata, destructor, size)
        frame = getframe(1)
        outer = frame.f_back if two else None
        code = frame.f_code
        if outer is None:
            key: tuple[int, ...] = (id(code), frame.f_lasti)
        else:
            key = (id(code), frame.f_lasti, id(outer.f_code), outer.f_lasti)
        number = places.get(key)
        if number is None:
            number = _new_place(key, frame, outer)
        sites[id(result)] = number
        if len(sites) >= shared.prune_at:
            _prune_gc_sites()
        return result

    gc.__doc__ = original.__doc__
    gc.__wrapped__ = original  # type: ignore[attr-defined]
    gc._exitsafe_audit = True  # type: ignore[attr-defined]
    ffi_class.gc = gc
    state.hooked.append("ffi.gc")


def _new_place(key: tuple[int, ...], frame: Any, outer: Any) -> int:
    """Number a new place of ``ffi.gc`` calls; its code objects are kept (their ids are
    in the key)."""
    number = len(state.gc_place_sites)
    site = [frame.f_code, frame.f_lasti]
    if outer is not None:
        site += [outer.f_code, outer.f_lasti]
    state.gc_place_sites.append(tuple(site))
    state.gc_places[key] = number
    return number


def _prune_gc_sites() -> None:
    """Forget the ids of ``ffi.gc`` results no longer alive (the table would grow without
    bound in a program that makes and drops millions of them): one scan of the objects the
    garbage collector tracks, each time the table has doubled."""
    import gc

    sites = state.gc_sites
    live = {id(o) for o in gc.get_objects() if type(o).__name__ == "__CDataGCP"}
    for key in [k for k in sites if k not in live]:
        del sites[key]
    state.prune_at = max(1 << 20, 2 * len(sites))


def gc_site(cdata: object) -> Optional[tuple[Any, ...]]:
    """The recorded site of an ``ffi.gc`` result, as (code, line, code, line)."""
    number = state.gc_sites.get(id(cdata))
    if number is None:
        return None
    return site_lines(state.gc_place_sites[number])


def object_site(obj: object) -> Optional[tuple[Any, ...]]:
    """The recorded site of an instance or a finalizer, as (code, line, code, line ...)."""
    number = state.sites.get(id(obj))
    return None if number is None else site_lines(state.place_sites[number])


def site_lines(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    site: list[Any] = []
    for index in range(0, len(entry) - 1, 2):
        site += [entry[index], _line_of(entry[index], entry[index + 1])]
    return tuple(site)


def _line_of(code: Any, lasti: int) -> Optional[int]:
    """The line of instruction ``lasti`` of ``code``."""
    try:
        if hasattr(code, "co_lines"):
            for start, end, line in code.co_lines():
                if start <= lasti < end:
                    return int(line) if line is not None else None
            return None
        import dis

        found = None
        for offset, line in dis.findlinestarts(code):
            if offset > lasti:
                break
            found = line
        return found
    except Exception:
        return None


def _hook_finalize(finalize: Any) -> None:
    """Record where each ``weakref.finalize`` is made."""
    original = finalize.__dict__.get("__init__")
    if original is None or getattr(original, "_exitsafe_audit", False):
        return
    sites = state.sites
    frames = state.frames

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            sites[id(self)] = _place(sys._getframe(1), frames)
        except Exception:
            pass

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._exitsafe_audit = True  # type: ignore[attr-defined]
    finalize.__init__ = __init__
    state.hooked.append("weakref.finalize")


def _place(frame: Optional[FrameType], count: int) -> int:
    """The number of the place ``frame`` and its ``count - 1`` callers are at (numbered
    once each: the table maps an object's id to a small number, not to frames)."""
    key: list[int] = []
    current = frame
    while current is not None and len(key) < 2 * count:
        key.append(id(current.f_code))
        key.append(current.f_lasti)
        current = current.f_back
    number = state.places.get(tuple(key))
    if number is None:
        number = len(state.place_sites)
        site: list[Any] = []
        current = frame
        while current is not None and len(site) < 2 * count:
            site.append(current.f_code)
            site.append(current.f_lasti)
            current = current.f_back
        state.place_sites.append(tuple(site))
        state.places[tuple(key)] = number
    return number


def _record_instance(obj: object) -> None:
    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None and frame.f_code.co_name in _CONSTRUCTORS:
        frame = frame.f_back
    state.sites[id(obj)] = _place(frame, state.frames)


def _hook_del_class(cls: type) -> None:
    """Record where each instance of ``cls`` (a class with a Python ``__del__``) is made,
    by wrapping its Python ``__init__`` (never a C one: that could change what the class
    accepts)."""
    import types

    init = getattr(cls, "__init__", None)
    if not isinstance(init, types.FunctionType) or getattr(init, "_exitsafe_audit", False):
        return
    original = init
    record = _record_instance

    def __init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            record(self)
        except Exception:
            pass
        return original(self, *args, **kwargs)

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(__init__, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._exitsafe_audit = True  # type: ignore[attr-defined]
    try:
        type.__setattr__(cls, "__init__", __init__)
    except (TypeError, AttributeError):
        pass


def _stdlib() -> frozenset[str]:
    return frozenset(getattr(sys, "stdlib_module_names", ()))


def _on_class(cls: type, stdlib: frozenset[str]) -> None:
    import types

    module = str(getattr(cls, "__module__", "") or "")
    name = cls.__name__
    if module == "cffi.api" and name == "FFI":
        _hook_ffi_gc(cls)
    elif module == "weakref" and name == "finalize":
        _hook_finalize(cls)
    if not isinstance(cls.__dict__.get("__del__", None) or getattr(cls, "__del__", None),
                      types.FunctionType):
        return
    if module.split(".")[0] in stdlib and module.split(".")[0] not in state.known:
        return
    _hook_del_class(cls)


def install_site_hooks() -> None:
    import builtins

    stdlib = _stdlib()
    weakref = sys.modules.get("weakref")
    if weakref is not None:
        _hook_finalize(weakref.finalize)
    api = sys.modules.get("cffi.api")
    if api is not None:
        _hook_ffi_gc(api.FFI)
    original = builtins.__build_class__
    if getattr(original, "_exitsafe_audit", False):
        return
    on_class = _on_class

    def __build_class__(func: Any, name: str, *bases: Any, **kwargs: Any) -> Any:
        cls = original(func, name, *bases, **kwargs)
        try:
            if isinstance(cls, type):
                on_class(cls, stdlib)
        except Exception:
            pass
        return cls

    __build_class__._exitsafe_audit = True  # type: ignore[attr-defined]
    __build_class__.__doc__ = original.__doc__
    builtins.__build_class__ = __build_class__  # type: ignore[assignment]
    state.hooked.append("classes")

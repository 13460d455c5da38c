"""The audit's window: from the end of exitsafe's exit teardown (or of the exit hooks) on,
every native release that runs is recorded, with where its object was made and the
declaration that would put it in the ordered teardown instead.

Imported only when the window opens, at exit: nothing of it is loaded at start-up.
"""

from __future__ import annotations

import sys

from ._describe import (
    callable_name,
    cffi_function_names,
    code_name,
    ctype_name,
    format_site,
    module_of,
    pointer_attrs,
    suggest_del,
    suggestion,
    traced_site,
)
from ._emit import emit
from ._sink import Group, Sink
from ._sites import gc_site, object_site, site_lines
from ._state import state
from ._survive import detach, keep_forever

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


def start_recording(after: str) -> None:
    """Open the window: record every native release from now on (``after``: what ended
    just before, ``"teardown"`` or ``"atexit"``)."""
    detach((Recorder, Sink, Group))
    recorder = Recorder(after)
    keep_forever(recorder.sink)
    recorder.start()


class Recorder:
    """Records each native release that runs once the window is open.

    Late in finalization the interpreter clears module dictionaries (this package's
    included) and `sys.setprofile` no longer sees calls, so the recorder works by
    wrapping: the ``__del__`` of each class that has a live instance holding a native
    pointer (or of a known binding), ``weakref.finalize.__call__``, and a weak reference
    with a callback on each ``ffi.gc`` pointer still alive.  Its functions run with a
    private copy of their modules' globals and of the builtins (`detach`), which
    finalization never clears.
    """

    def __init__(self, after: str) -> None:
        import _thread
        import gc
        import tracemalloc

        self.after = after
        self.gc = gc
        self.get_ident = _thread.get_ident
        self.traced = tracemalloc.is_tracing()
        try:
            import _tracemalloc

            self.traceback_of: Callable[[object], Any] = _tracemalloc._get_object_traceback
        except ImportError:  # pragma: no cover - CPython always has it
            self.traceback_of = lambda obj: None
        self.known = state.known
        self.state = state
        self.wrapped: dict[type, Any] = {}
        self.objects: dict[int, Group] = {}  # id(instance or finalize) -> its group
        self.groups: dict[tuple[Any, ...], Group] = {}
        self.destructors: dict[int, tuple[Optional[str], str]] = {}  # -> (via, suggest)
        self.lib_names: Optional[dict[int, str]] = None
        self.names: dict[int, str] = {}
        threading = sys.modules.get("threading")
        if threading is not None:
            for thread in threading.enumerate():
                if thread.ident is not None:
                    self.names[thread.ident] = thread.name
        import weakref

        self.weakref = weakref.ref
        self.finalize = weakref.finalize
        try:
            import _cffi_backend  # type: ignore[import-untyped]

            self.typeof: Callable[[object], Any] = _cffi_backend.typeof
        except ImportError:
            self.typeof = type
        self.sink = Sink(self.names, self._unknown_site())

    def _unknown_site(self) -> str:
        if self.traced:
            return "unknown (not recorded, and tracemalloc has no record of this object)"
        if self.state.since == "startup":
            return (
                "unknown (made where the audit does not look: an API-mode ffi.gc, a C type,"
                " or a class whose __init__ is not Python)"
            )
        return (
            "unknown (made before exitsafe was imported: run it with exitsafe run --audit to"
            " record sites from start-up)"
        )

    def start(self) -> None:
        candidates = 0
        try:
            candidates = self._scan()
        except Exception:
            pass
        emit(
            "audit-begin",
            after=self.after,
            candidates=candidates,
            sites=",".join(self.state.hooked) or "none",
            tracemalloc=1 if self.traced else 0,
            since=self.state.since,
        )

    def _site(self, obj: object, table: dict[int, Any]) -> tuple[Optional[str], Optional[str]]:
        recorded = gc_site(obj) if table is self.state.gc_sites else object_site(obj)
        if recorded:
            return format_site(recorded)
        if self.traced:
            return traced_site(self.traceback_of, obj)
        return None, None

    def _library_names(self) -> dict[int, str]:
        if self.lib_names is None:
            self.lib_names = cffi_function_names()
        return self.lib_names

    def _group(self, key: tuple[Any, ...], make: Callable[[], dict[str, Any]]) -> Group:
        group = self.groups.get(key)
        if group is None:
            group = Group(len(self.groups) + 1, make())
            self.groups[key] = group
        return group

    # -- what is pending ------------------------------------------------------------

    def _scan(self) -> int:
        count = 0
        heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE
        classes: dict[type, int] = {}  # 0: ignore, 1: ffi.gc cdata, 2: check, 3: known
        known = self.known
        cdatas: list[Any] = []
        libraries: list[Any] = []
        for obj in self.gc.get_objects():
            cls = type(obj)
            what = classes.get(cls)
            if what is None:
                if cls.__name__ == "__CDataGCP" and cls.__module__ == "_cffi_backend":
                    what = 1
                elif cls.__name__ == "FFILibrary" and "cffi" in str(cls.__module__):
                    what = 4
                elif not (cls.__flags__ & heap) or getattr(cls, "__del__", None) is None:
                    what = 0
                elif str(getattr(cls, "__module__", "")).split(".")[0] in known:
                    what = 3
                else:
                    what = 2
                classes[cls] = what
            if what == 0:
                continue
            if what == 1:
                cdatas.append(obj)
                continue
            if what == 4:
                libraries.append(obj)
                continue
            holds = pointer_attrs(obj)
            if what == 2 and not holds:
                continue
            if cls not in self.wrapped:
                self._wrap_del(cls)
            self.objects[id(obj)] = self._del_group(obj, holds)
            count += 1
        self.lib_names = cffi_function_names(libraries)
        self._watch_gc_cdatas(cdatas)
        count += len(cdatas)
        del cdatas
        registry = getattr(self.finalize, "_registry", None)
        if registry:
            for fin, info in list(registry.items()):
                if info is not None:
                    self.objects[id(fin)] = self._finalize_group(fin, info)
                    count += 1
            self._wrap_finalize()
        return count

    def _del_group(self, obj: object, holds: list[tuple[str, str]]) -> Group:
        cls = type(obj)
        place = self.state.sites.get(id(obj))
        if place is None:  # the site of a cffi pointer it holds, made in its constructor
            for name, kind in holds:
                if kind == "cffi pointer":
                    number = self.state.gc_sites.get(id(vars(obj).get(name)))
                    if number is not None:
                        place = -1 - number
                        break
        key = ("__del__", cls, place, tuple(name for name, _ in holds))
        group = self.groups.get(key)
        if group is not None:
            return group
        if place is not None and place >= 0:
            site, origin = format_site(site_lines(self.state.place_sites[place]))
        elif place is not None:
            site, origin = format_site(site_lines(self.state.gc_place_sites[-1 - place]))
        elif self.traced:
            site, origin = traced_site(self.traceback_of, obj)
        else:
            site, origin = None, None
        module = module_of(obj)

        def make() -> dict[str, Any]:
            original = self.wrapped.get(cls)
            code = getattr(original, "__code__", None)
            suggest, alternative = suggest_del(obj, holds, self.known)
            return {
                "what": "__del__",
                "type": f"{module}.{cls.__qualname__}" if module else cls.__qualname__,
                "site": site,
                "stack": origin,
                "holds": ", ".join(f"{n} ({k})" for n, k in holds)
                or f"object of {module.split('.')[0]}",
                "via": None if code is None else f"{code.co_filename}:{code.co_firstlineno}",
                "suggest": suggest,
                "alternative": alternative,
            }

        return self._group(key, make)

    def _finalize_group(self, fin: Any, info: Any) -> Group:
        func = info.func
        target = info.weakref()
        site, origin = self._site(fin, self.state.sites)
        args = tuple(info.args or ())
        label = type(target).__qualname__ if target is not None else "a dead object"

        def make() -> dict[str, Any]:
            code = code_name(func, self._library_names)
            kwargs = "-kwargs" if info.kwargs else ""
            if code is not None and len(args) == 1 and not kwargs:
                suggest = suggestion("track", fn=code)
            elif code is not None:
                suggest = suggestion("teardown-fn" + kwargs, fn=code)
            else:  # no name reaches it: the callback the program gave
                suggest = suggestion("teardown-callback" + kwargs)
            return {
                "what": "weakref.finalize",
                "type": "finalizer of " + label,
                "site": site,
                "stack": origin,
                "holds": None,
                "via": callable_name(func),
                "suggest": suggest,
                "alternative": None,
            }

        return self._group(("finalize", label, id(func), self.state.sites.get(id(fin))), make)

    def _wrap_del(self, cls: type) -> None:
        owner = next((c for c in cls.__mro__ if "__del__" in vars(c)), None)
        if owner is None or owner in self.wrapped or owner is object:
            self.wrapped.setdefault(cls, None)
            return
        original = vars(owner)["__del__"]
        if getattr(original, "_exitsafe_audit", False):
            return  # already wrapped (by an earlier window of this process)
        recorder = self

        def __del__(obj: object) -> None:
            group = None
            try:
                group = recorder._on_del(obj)
            except BaseException:
                pass
            if group is None:
                original(obj)
                return
            try:
                original(obj)
            finally:
                recorder.sink.done(group)

        __del__.__qualname__ = getattr(original, "__qualname__", "__del__")
        __del__._exitsafe_audit = True  # type: ignore[attr-defined]
        try:
            owner.__del__ = __del__  # type: ignore[attr-defined]
        except (TypeError, AttributeError):
            return
        self.wrapped[owner] = original
        self.wrapped.setdefault(cls, original)

    def _wrap_finalize(self) -> None:
        finalize = self.finalize
        original = finalize.__call__
        recorder = self

        def __call__(fin: Any, _=None) -> Any:  # type: ignore[no-untyped-def]
            group = None
            try:
                group = recorder._on_finalize(fin)
            except BaseException:
                pass
            if group is None:
                return original(fin)
            try:
                return original(fin)
            finally:
                recorder.sink.done(group)

        finalize.__call__ = __call__  # type: ignore[method-assign,assignment]

    def _watch_gc_cdatas(self, cdatas: list[Any]) -> None:
        """Put a weak reference with a callback on each ``ffi.gc`` pointer, grouped by
        type and creation site (one destructor per group: looked up for its first pointer).
        Written as loops of built-ins: there may be millions of pointers."""
        import itertools

        table = self.state.gc_sites
        groups = self.groups
        sink = self.sink
        keys = list(zip(map(id, map(self.typeof, cdatas)), map(table.get, map(id, cdatas))))
        first = dict(zip(reversed(keys), reversed(range(len(keys)))))
        for key, index in first.items():
            if key not in groups:
                referents = self.gc.get_referents(cdatas[index])
                self._gc_group(key, cdatas[index], referents[0] if referents else None)
        try:
            watches = list(map(self.weakref, cdatas, itertools.repeat(sink.gc_released)))
        except TypeError:
            return
        watch_ids = list(map(id, watches))
        sink.refs.update(zip(watch_ids, watches))
        sink.groups_of.update(zip(watch_ids, map(groups.__getitem__, keys)))

    def _gc_group(self, key: tuple[Any, ...], cdata: Any, destructor: Any) -> Group:
        named = self.destructors.get(id(destructor))
        if named is None:
            via = None if destructor is None else callable_name(destructor)
            code = None if destructor is None else code_name(destructor, self._library_names)
            if code is None and via and " (" in via:  # a C function: its symbol in lib
                code = f"lib.{via.split(' (')[0]}"
            if code is None:  # no name reaches it: the destructor the program gave
                suggest = suggestion("cffi-track-release")
            else:
                suggest = suggestion("cffi-track", fn=code)
            named = self.destructors[id(destructor)] = (via, suggest)
        via, suggest = named
        site, origin = self._site(cdata, self.state.gc_sites)
        cname = ctype_name(cdata)
        return self._group(key, lambda: {
            "what": "ffi.gc",
            "type": f"cdata '{cname}'",
            "site": site,
            "stack": origin,
            "holds": None,
            "via": via,
            # ptr: the pointer before ffi.gc; the pin makes the library outlive it
            "suggest": suggest,
            "alternative": None,
        })

    # -- what runs -----------------------------------------------------------------

    def _on_del(self, obj: object) -> Optional[Group]:
        group = self.objects.pop(id(obj), None)
        if group is None:
            # not alive when the window opened: made later, look now
            holds = pointer_attrs(obj)
            if not holds and module_of(obj).split(".")[0] not in self.known:
                return None
            group = self._del_group(obj, holds)
        self.sink.begin(group)
        return group

    def _on_finalize(self, fin: Any) -> Optional[Group]:
        info = self.finalize._registry.get(fin)  # type: ignore[attr-defined]
        if info is None:
            return None  # already called or detached: it will not run its callback
        group = self.objects.pop(id(fin), None)
        if group is None:
            group = self._finalize_group(fin, info)
        self.sink.begin(group)
        return group

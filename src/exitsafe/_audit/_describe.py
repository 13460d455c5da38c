"""What a late release is, in words and in code: the native pointers an object holds,
where it was made (``file:line``), the name of its finalizer, and the exitsafe
declaration suggested for it."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

#: Every suggestion the audit prints, by shape: a `str.format` template, filled by
#: `suggestion`.  Each is code that runs as written where ``obj`` names the object (a
#: ``__del__``); ``ptr`` the pointer before ``ffi.gc`` and ``release`` its destructor,
#: ``ffi`` and ``lib`` the cffi objects (an ``ffi.gc``); ``raw`` the only argument of a
#: ``weakref.finalize``, ``args`` and ``kwargs`` its arguments, ``callback`` its callback.
#: ``{fn}`` is the callback (or destructor) as `code_name` writes it, ``{close}`` a method
#: of the object, ``{attr}`` and ``{parent}`` attributes of it.  Statements are separated
#: by ``"; "``.  A ``handle`` assigned must be kept while the object lives: dropping it
#: releases the object (an adoption, a hook, a neutralization are kept by exitsafe).
#: tests/testing/test_hints.py has an audited program print each shape and runs what it
#: printed, teardown included; a shape written anywhere else in the audit fails there.
SUGGESTIONS: dict[str, str] = {
    # __del__ (suggest_del)
    "adopt-close": 'exitsafe.adopt(obj, close="{close}")',
    "adopt-close-parent": (
        'parent = exitsafe.adopt(obj.{parent}, close=None);'
        ' exitsafe.adopt(obj, close="{close}", depends_on=[parent])'
    ),
    "adopt-del": "exitsafe.adopt(obj, close=type(obj).__del__)",
    "adopt-del-parent": (
        "parent = exitsafe.adopt(obj.{parent}, close=None);"
        " exitsafe.adopt(obj, close=type(obj).__del__, depends_on=[parent])"
    ),
    "neutralize": 'exitsafe.lowlevel.neutralize_at_exit(obj, attr="{attr}")',
    # weakref.finalize (Recorder._finalize_group)
    "track": "handle = exitsafe.track(raw, {fn})",
    "teardown-fn": "exitsafe.on_teardown(lambda: {fn}(*args))",
    "teardown-fn-kwargs": "exitsafe.on_teardown(lambda: {fn}(*args, **kwargs))",
    "teardown-callback": "exitsafe.on_teardown(lambda: callback(*args))",
    "teardown-callback-kwargs": "exitsafe.on_teardown(lambda: callback(*args, **kwargs))",
    # ffi.gc (Recorder._gc_group)
    "cffi-track": "exitsafe.cffi.pin(ffi, lib); handle = exitsafe.cffi.track(ffi, ptr, {fn})",
    "cffi-track-release": (
        "exitsafe.cffi.pin(ffi, lib); handle = exitsafe.cffi.track(ffi, ptr, release)"
    ),
}


def suggestion(shape: str, **fields: str) -> str:
    """The code of the suggestion ``shape`` (a key of `SUGGESTIONS`), its placeholders
    filled with ``fields``."""
    return SUGGESTIONS[shape].format(**fields)


#: Method names that look like a release function (for the suggested ``adopt(close=...)``).
CLOSE_METHODS = ("close", "release", "destroy", "free", "dispose", "shutdown", "terminate")
#: Attribute names whose non-zero ``int`` value is taken for a native handle.
HANDLE_NAMES = frozenset({"_handle", "handle", "_ptr", "ptr", "_pointer", "pointer", "_raw"})
#: Path fragments of frames that say nothing about who created an object.
_INTERNAL = ("/cffi/", "/ctypes/", "/tracemalloc.py", "/exitsafe/", "/_boot/")


def is_pointer(value: object) -> Optional[str]:
    """``"cffi pointer"`` / ``"ctypes pointer"`` / ``"ctypes library"`` or ``None``."""
    cls = type(value)
    module = getattr(cls, "__module__", "")
    if module == "_cffi_backend":
        name = cls.__name__
        if "CData" in name:
            return "cffi pointer"
        if name in ("Lib", "FFI"):
            return "cffi library"
        return None
    if module == "ctypes" or module.startswith("ctypes."):
        names = {c.__name__ for c in cls.__mro__}
        if names & {"CDLL", "PyDLL", "LibraryLoader"}:
            return "ctypes library"
        if names & {"_Pointer", "c_void_p", "c_char_p", "c_wchar_p", "CFuncPtr", "_CFuncPtr"}:
            return "ctypes pointer" if bool(value) else None
        if names & {"Structure", "Union", "Array", "_SimpleCData"}:
            return "ctypes data"
    # a ctypes subclass defined by the binding itself (class HANDLE(c_void_p), Structure ...)
    for base in cls.__mro__[1:]:
        if getattr(base, "__module__", "") == "_ctypes" or base.__name__ in (
            "_Pointer", "Structure", "Union", "_SimpleCData"
        ):
            return "ctypes data"
    return None


def pointer_attrs(obj: object) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    try:
        attrs = vars(obj)
    except TypeError:
        attrs = {}
        for name in getattr(type(obj), "__slots__", ()) or ():
            try:
                attrs[name] = getattr(obj, name)
            except AttributeError:
                continue
    for name, value in list(attrs.items()):
        kind = is_pointer(value)
        if kind is None and name in HANDLE_NAMES and type(value) is int and value:
            kind = "int handle"
        if kind is not None:
            found.append((name, kind))
    return found


def module_of(obj: object) -> str:
    return str(getattr(type(obj), "__module__", "") or "")


def _internal(filename: str) -> bool:
    name = filename.replace("\\", "/")
    return any(part in name for part in _INTERNAL)


def format_site(site: tuple[Any, ...]) -> tuple[Optional[str], Optional[str]]:
    """(the first frame outside cffi, ctypes and exitsafe as ``file:line``, the frames as
    ``file:line <- file:line ...``) of a recorded site."""
    shown = [
        f"{site[i].co_filename}:{site[i + 1]}"
        for i in range(0, len(site) - 1, 2)
        if not _internal(site[i].co_filename)
    ] or [f"{site[i].co_filename}:{site[i + 1]}" for i in range(0, len(site) - 1, 2)]
    if not shown:
        return None, None
    return shown[0], (" <- ".join(shown) if len(shown) > 1 else None)


def traced_site(
    traceback_of: Callable[[object], Any], obj: object
) -> tuple[Optional[str], Optional[str]]:
    """(where ``obj`` was allocated, the frames that led there) from tracemalloc, when
    something else started it; ``(None, None)`` when unknown."""
    try:
        frames = traceback_of(obj)  # ((filename, lineno), ...) most recent first
    except Exception:
        frames = None
    if not frames:
        return None, None
    kept = [f for f in frames if not _internal(f[0])]
    shown = [f"{name}:{lineno}" for name, lineno in (kept or frames)[:5]]
    return shown[0], (" <- ".join(shown) if len(shown) > 1 else None)


def _parent_attr(obj: object, known: frozenset[str]) -> Optional[str]:
    """An attribute of ``obj`` holding another native-owning object: its likely parent."""
    try:
        attrs = vars(obj)
    except TypeError:
        return None
    for name, value in attrs.items():
        if value is obj or isinstance(value, (int, str, bytes, float, type(None))):
            continue
        cls = type(value)
        if is_pointer(value) is not None:
            continue
        if getattr(cls, "__del__", None) is not None or module_of(value).split(".")[0] in known:
            if pointer_attrs(value):
                return name
    return None


def suggest_del(
    obj: object, holds: list[tuple[str, str]], known: frozenset[str]
) -> tuple[str, Optional[str]]:
    """(the exitsafe code that declares ``obj``, another declaration for an object the
    program does not own, or ``None``): `SUGGESTIONS` filled in, valid code where ``obj``
    names the object.

    A close method (`CLOSE_METHODS`): ``adopt(obj, close=...)``, with the
    ``neutralize_at_exit`` of its pointer attribute as the other declaration; else a
    pointer attribute: ``neutralize_at_exit`` (its ``__del__`` then does nothing: no order
    to keep); else ``adopt(obj, close=type(obj).__del__)``.  An attribute holding another
    native-owning object is adopted first (``close=None``) and the adoption depends on it."""
    cls = type(obj)
    parent = _parent_attr(obj, known)
    close = next((m for m in CLOSE_METHODS if callable(getattr(cls, m, None))), None)
    pointer = next((name for name, kind in holds if kind not in ("cffi library",
                                                                  "ctypes library")), None)
    neutralize = None
    if pointer is not None:  # its __del__ becomes a no-op: no order to keep
        neutralize = suggestion("neutralize", attr=pointer)
    tail = "-parent" if parent else ""
    if close is not None:
        adopt = suggestion("adopt-close" + tail, close=close, parent=parent or "")
        return adopt, neutralize
    if neutralize is not None:
        return neutralize, None
    return suggestion("adopt-del" + tail, parent=parent or ""), None


def _c_function_name(fn: object) -> Optional[str]:
    """``"free (libc.so.6)"`` for a cffi function pointer, from ``dladdr``; else ``None``."""
    try:
        import ctypes
        import os.path

        import _cffi_backend  # type: ignore[import-untyped]

        address = int(_cffi_backend.FFI().cast("intptr_t", fn))

        class DlInfo(ctypes.Structure):
            _fields_ = [
                ("dli_fname", ctypes.c_char_p),
                ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p),
            ]

        info = DlInfo()
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        if not dladdr(address, ctypes.byref(info)) or not info.dli_sname:
            return None
        library = os.path.basename((info.dli_fname or b"").decode(errors="replace"))
        return f"{info.dli_sname.decode(errors='replace')} ({library})"
    except Exception:
        return None


def cffi_function_names(libraries: Optional[list[Any]] = None) -> dict[int, str]:
    """id(function pointer) -> the name a cffi library object (``ffi.dlopen``, ABI mode)
    gives it (``"free"``), for ``libraries`` (default: every such library in the process):
    the functions it looked up so far are in its ``__dict__``."""
    names: dict[int, str] = {}
    try:
        if libraries is None:
            import gc

            libraries = [o for o in gc.get_objects() if type(o).__name__ == "FFILibrary"
                         and "cffi" in type(o).__module__]
        for obj in libraries:
            for name, value in vars(obj).items():
                names.setdefault(id(value), str(name))
    except Exception:
        pass
    return names


def callable_name(fn: object) -> str:
    if getattr(type(fn), "__module__", "") == "_cffi_backend":
        name = _c_function_name(fn)
        if name is not None:
            return name
        text = repr(fn)
        return "C function " + text.split(" 0x")[0].replace("<cdata ", "").rstrip(">")
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None)
    if name is None:
        return repr(fn)[:80]
    return f"{module}.{name}" if module and module not in ("builtins", "__main__") else str(name)


def code_name(fn: object, library_names: Callable[[], dict[int, str]]) -> Optional[str]:
    """A name ``fn`` can be written as in suggested code, or ``None``: ``lib.free`` for a
    function of a cffi library (``library_names`` gives their names,
    `cffi_function_names`); ``free_frame`` for a Python function defined at the top level
    of its module, which that module's code reaches by that name.  ``None`` for anything
    else (a lambda, a nested function, a method, ``functools.partial``, a built-in such as
    ``os.close`` or a ctypes function such as ``libc.free``): its bare name would not be
    defined where the suggestion goes."""
    if getattr(type(fn), "__module__", "") == "_cffi_backend":
        declared = library_names().get(id(fn))
        return None if declared is None else f"lib.{declared}"
    name = getattr(fn, "__name__", None)
    namespace = getattr(fn, "__globals__", None)
    if isinstance(name, str) and name.isidentifier() and isinstance(namespace, dict):
        if namespace.get(name) is fn:
            return name
    return None


def ctype_name(cdata: Any) -> str:
    try:
        import _cffi_backend

        return str(_cffi_backend.typeof(cdata).cname)
    except Exception:
        text = repr(cdata)
        return text.split(" 0x")[0].replace("<cdata ", "").strip("'>")

"""Audit mode: every native release that runs after exitsafe's exit teardown.

Turned on by ``EXITSAFE_AUDIT=1`` (``exitsafe run --audit`` sets it, and starts
``tracemalloc`` at interpreter start-up so that every object's creation site is known).
It is a validation layer for exit order: a ``__del__`` that calls into a native library,
an ``ffi.gc`` destructor or a ``weakref.finalize`` callback that runs while the
interpreter finalizes its modules ran in an order nobody chose.  It happened to work in
this run; on another platform or the next CPython it may crash.  Each one is reported,
with where its object was created and the exitsafe declaration that would put it in the
ordered teardown instead.

The interface is narrow on purpose:

* `install` runs when this module is imported with ``EXITSAFE_AUDIT`` set (exitsafe
  imports it then; ``exitsafe run``'s start-up hook imports it in every Python process):
  it starts ``tracemalloc`` if nothing started it earlier, and registers a fallback
  `atexit` callback for programs that never import exitsafe.
* `after_exit_teardown` is called by exitsafe's exit hook once the exit teardown has
  finished: from then on releases are recorded (the *window*).  It also lists the threads
  still alive (``EXITSAFE_TRACE=1`` or audit on), so that a thread unwound later inside
  native code can be named.

Everything is written at once, as trace lines on stderr (``os.write`` on fd 2, so a crash
right after loses nothing)::

    exitsafe: thread ident=0x00007f... name="pool-1" daemon=true frame="app.py:12 in work"
    exitsafe: audit-begin after="teardown" candidates=3 tracemalloc=8
    exitsafe: audit-release seq=1 what="__del__" type="mylib.Device" site="app.py:20"
        holds="_ptr (cffi pointer)" suggest="..."   (one line in the real output)

This module imports only the standard library and nothing of exitsafe, so that the
start-up hook can load it from its file into an interpreter where exitsafe is not
installed.  Importing it with ``EXITSAFE_AUDIT`` unset installs nothing.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable, Optional

#: Top-level modules of bindings whose objects release native resources when collected.
#: ``EXITSAFE_AUDIT_MODULES`` (comma-separated) adds to it.
KNOWN_BINDINGS = frozenset(
    {
        "wgpu", "onnxruntime", "pyopencl", "pycuda", "cupy", "soundfile", "sounddevice",
        "pyaudio", "pygit2", "glfw", "sdl2", "vulkan", "moderngl", "av", "pyvips", "cairo",
        "cairocffi", "pymupdf", "fitz", "pyarrow", "zmq", "grpc", "sqlite3", "lmdb", "h5py",
        "netCDF4", "rasterio", "pyrealsense2", "usb", "hid", "serial", "pyglet",
    }
)
#: Method names that look like a release function (for the suggested ``adopt(close=...)``).
CLOSE_METHODS = ("close", "release", "destroy", "free", "dispose", "shutdown", "terminate")
#: Attribute names whose non-zero ``int`` value is taken for a native handle.
HANDLE_NAMES = frozenset({"_handle", "handle", "_ptr", "ptr", "_pointer", "pointer", "_raw"})
#: tracemalloc frames kept per allocation when the audit starts tracemalloc itself.
DEFAULT_FRAMES = 8

_TRUE = ("1", "true", "yes", "on")
#: Path fragments of allocation frames that say nothing about who created an object.
_INTERNAL = ("/cffi/", "/ctypes/", "/tracemalloc.py", "/exitsafe/")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


class _State:
    installed = False
    window = False  # releases are being recorded
    threads_listed = False
    fallback = False
    seq = 0
    known: frozenset[str] = KNOWN_BINDINGS
    since = "none"


_state = _State()
_write = os.write  # kept: module globals may be gone late in finalization


def enabled() -> bool:
    """Whether ``EXITSAFE_AUDIT`` asks for the audit."""
    return _flag("EXITSAFE_AUDIT")


class _Bare(str):
    """A trace value written without quotes (a token without spaces)."""


def _quote(text: str) -> str:
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


def _emit(event: str, **fields: object) -> None:
    parts = [f"exitsafe: {event}"]
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, _Bare):
            parts.append(f"{key}={value}")
        elif isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, int):
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={_quote(str(value))}")
    try:
        _write(2, (" ".join(parts) + "\n").encode("utf-8", "replace"))
    except Exception:
        pass


def install() -> None:
    """Start the audit in this process (idempotent): ``tracemalloc`` if nobody started it
    (``EXITSAFE_AUDIT_FRAMES`` frames, default 8), and the fallback exit hook."""
    if _state.installed:
        return
    _state.installed = True
    extra = os.environ.get("EXITSAFE_AUDIT_MODULES", "")
    if extra:
        _state.known = KNOWN_BINDINGS | {m.strip() for m in extra.split(",") if m.strip()}
    import tracemalloc

    if tracemalloc.is_tracing():
        _state.since = "startup" if os.environ.get("PYTHONTRACEMALLOC") else "earlier"
    else:
        try:
            frames = int(os.environ.get("EXITSAFE_AUDIT_FRAMES", "") or DEFAULT_FRAMES)
        except ValueError:
            frames = DEFAULT_FRAMES
        tracemalloc.start(max(1, frames))
        _state.since = "audit-install"
    if not _state.fallback:
        _state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def boot() -> None:
    """Called by ``exitsafe run``'s start-up hook before the program runs: the audit when
    ``EXITSAFE_AUDIT`` is set, and the fallback exit hook that lists threads (and opens
    the audit window) in a program that never imports exitsafe."""
    if enabled():
        install()
    elif not _state.fallback:
        _state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def _fallback_at_exit() -> None:
    # Registered when the audit was installed.  When exitsafe's exit hook is pending (it
    # was registered before this one, so it runs after it) it opens the window itself.
    if "exitsafe._process" in sys.modules and not _state.window:
        return
    try:
        _open_window("atexit")
    except Exception:
        pass


def after_exit_teardown() -> None:
    """Called by exitsafe's exit hook when the exit teardown has finished: list the
    threads still alive (with ``EXITSAFE_TRACE`` or the audit on), then, with the audit
    on, record every native release from now on.  Never raises."""
    try:
        _open_window("teardown")
    except Exception:
        pass


def list_threads() -> None:
    """Write one ``thread`` trace line per thread still alive besides this one (once)."""
    if _state.threads_listed:
        return
    _state.threads_listed = True
    threading = sys.modules.get("threading")
    if threading is None:
        return
    try:
        frames = sys._current_frames()
        me = threading.get_ident()
        for thread in threading.enumerate():
            ident = thread.ident
            if ident is None or ident == me or not thread.is_alive():
                continue
            frame = frames.get(ident)
            _emit(
                "thread",
                ident=_Bare(f"0x{ident:016x}"),
                name=thread.name,
                daemon=bool(thread.daemon),
                frame=None if frame is None else _frame_text(frame),
                target=_target_text(thread),
            )
    except Exception:
        pass


def _frame_text(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def _target_text(thread: Any) -> Optional[str]:
    target = getattr(thread, "_target", None)
    if target is None:
        return None
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return None if name is None else str(name)


# --------------------------------------------------------------------------- the window


def _open_window(after: str) -> None:
    if _state.window:
        return
    if enabled() or _flag("EXITSAFE_TRACE"):
        list_threads()
    if not (_state.installed and enabled()):
        return
    _state.window = True
    _detach(_Recorder)
    recorder = _Recorder(after)
    _keep_forever(recorder.sink)
    recorder.start()


def _is_pointer(value: object) -> Optional[str]:
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


def _pointer_attrs(obj: object) -> list[tuple[str, str]]:
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
        kind = _is_pointer(value)
        if kind is None and name in HANDLE_NAMES and type(value) is int and value:
            kind = "int handle"
        if kind is not None:
            found.append((name, kind))
    return found


def _module_of(obj: object) -> str:
    return str(getattr(type(obj), "__module__", "") or "")


def _site(
    traceback_of: Callable[[object], Any], obj: object
) -> tuple[Optional[str], Optional[str]]:
    """(where ``obj`` was allocated, the frames that led there) from tracemalloc, as
    ``"file:line"`` and ``"file:line <- file:line ..."``; ``(None, None)`` when unknown.

    CPython 3.11 cannot find objects with a managed ``__dict__`` (plain class instances)
    in tracemalloc's table; for those the allocation of the first native pointer the
    object holds is used instead (made in its constructor, so the frames below it lead
    to the place the object was created).
    """
    candidates: list[object] = [obj]
    try:
        candidates.extend(v for v in vars(obj).values() if _is_pointer(v) is not None)
    except TypeError:
        pass
    for candidate in candidates:
        try:
            frames = traceback_of(candidate)  # ((filename, lineno), ...) most recent first
        except Exception:
            frames = None
        if frames:
            # the allocation inside cffi or ctypes themselves says nothing: skip it
            kept = [f for f in frames if not _internal(f[0])]
            shown = [f"{name}:{lineno}" for name, lineno in (kept or frames)[:5]]
            return shown[0], (" <- ".join(shown) if len(shown) > 1 else None)
    return None, None


def _internal(filename: str) -> bool:
    name = filename.replace("\\", "/")
    return any(part in name for part in _INTERNAL)


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
        if _is_pointer(value) is not None:
            continue
        if getattr(cls, "__del__", None) is not None or _module_of(value).split(".")[0] in known:
            if _pointer_attrs(value):
                return name
    return None


def _suggest_del(obj: object, holds: list[tuple[str, str]], known: frozenset[str]) -> str:
    cls = type(obj)
    parent = _parent_attr(obj, known)
    depends = f", depends_on=[obj.{parent}]" if parent else ""
    close = next((m for m in CLOSE_METHODS if callable(getattr(cls, m, None))), None)
    pointer = next((name for name, kind in holds if kind != "cffi library"), None)
    if close is not None:
        text = f'exitsafe.adopt(obj, close="{close}"{depends})'
        if pointer is not None:
            text += (
                f' (or, for an object you do not own, exitsafe.lowlevel.neutralize_at_exit(obj,'
                f' attr="{pointer}"))'
            )
        return text
    if pointer is not None:
        return f'exitsafe.lowlevel.neutralize_at_exit(obj, attr="{pointer}")' + (
            f" and make obj.{parent} outlive it" if parent else ""
        )
    return "exitsafe.adopt(obj, close=...) with the method its __del__ calls"


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


def _callable_name(fn: object) -> str:
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


class _Recorder:
    """Records each native release that runs once the window is open.

    Late in finalization the interpreter clears module dictionaries (this module's
    included) and `sys.setprofile` no longer sees calls, so the recorder works by
    wrapping: the ``__del__`` of each class that has a live instance holding a native
    pointer (or of a known binding), ``weakref.finalize.__call__``, and a weak reference
    with a callback on each ``ffi.gc`` pointer still alive.  Its functions run with a
    private copy of this module's globals and of the builtins (`_detach`), which
    finalization never clears.
    """

    def __init__(self, after: str) -> None:
        import _thread
        import gc
        import tracemalloc

        self.after = after
        self.gc = gc
        self.get_ident = _thread.get_ident
        try:
            import _tracemalloc

            self.traceback_of: Callable[[object], Any] = _tracemalloc._get_object_traceback
        except ImportError:  # pragma: no cover - CPython always has it
            self.traceback_of = lambda obj: None
        self.frames = tracemalloc.get_traceback_limit() if tracemalloc.is_tracing() else 0
        self.known = _state.known
        self.state = _state
        self.wrapped: dict[type, Any] = {}
        self.seen: set[int] = set()
        self.sites: dict[int, tuple[Optional[str], Optional[str]]] = {}
        self.names: dict[int, str] = {}
        threading = sys.modules.get("threading")
        if threading is not None:
            for thread in threading.enumerate():
                if thread.ident is not None:
                    self.names[thread.ident] = thread.name
        import weakref

        self.weakref = weakref.ref
        self.finalize = weakref.finalize
        self.sink = _Sink(self.names, self.frames)

    def start(self) -> None:
        candidates = 0
        try:
            candidates = self._scan()
        except Exception:
            pass
        _emit(
            "audit-begin",
            after=self.after,
            candidates=candidates,
            tracemalloc=self.frames,
            since=self.state.since,
        )

    # -- what is pending ------------------------------------------------------------

    def _scan(self) -> int:
        count = 0
        heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE
        for obj in self.gc.get_objects():
            cls = type(obj)
            if cls.__name__ == "__CDataGCP" and cls.__module__ == "_cffi_backend":
                self._watch_gc_cdata(obj)
                count += 1
                continue
            if not (cls.__flags__ & heap) or getattr(cls, "__del__", None) is None:
                continue
            if cls in self.wrapped:
                count += 1
                continue
            if _module_of(obj).split(".")[0] in self.known or _pointer_attrs(obj):
                self._wrap_del(cls)
                # tracemalloc may be stopped before the object's finalizer runs
                self.sites[id(obj)] = _site(self.traceback_of, obj)
                count += 1
        registry = getattr(self.finalize, "_registry", None)
        if registry:
            for fin, info in list(registry.items()):
                if info is not None:
                    self.sites[id(fin)] = _site(self.traceback_of, fin)
                    count += 1
            self._wrap_finalize()
        return count

    def _wrap_del(self, cls: type) -> None:
        owner = next((c for c in cls.__mro__ if "__del__" in vars(c)), None)
        if owner is None or owner in self.wrapped or owner is object:
            return
        original = vars(owner)["__del__"]
        if getattr(original, "_exitsafe_audit", False):
            return  # already wrapped (by an earlier window of this process)
        recorder = self

        def __del__(obj: object) -> None:
            try:
                recorder._on_del(obj)
            except BaseException:
                pass
            original(obj)

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
            try:
                recorder._on_finalize(fin)
            except BaseException:
                pass
            return original(fin)

        finalize.__call__ = __call__  # type: ignore[method-assign,assignment]

    def _watch_gc_cdata(self, cdata: Any) -> None:
        referents = self.gc.get_referents(cdata)
        destructor = next((r for r in referents if callable(r)), None)
        try:
            text = repr(cdata)
        except Exception:
            text = "<cdata>"
        site, origin = _site(self.traceback_of, cdata)
        label = text.split(" 0x")[0].replace("<cdata ", "cdata ").rstrip(">")
        via = None if destructor is None else _callable_name(destructor)
        sink = self.sink
        release = f"lib.{via.split(' (')[0]}" if via and " (" in via else (via or "release")

        def released(_ref: object) -> None:
            try:
                sink.record(
                    "ffi.gc",
                    label,
                    site,
                    origin,
                    holds=None,
                    via=via,
                    suggest=(
                        f"exitsafe.cffi.track(ffi, ptr, {release},"
                        " depends_on=[exitsafe.cffi.pin(lib)]) instead of ffi.gc"
                    ),
                )
            except BaseException:
                pass

        try:
            sink.refs.append(self.weakref(cdata, released))
        except TypeError:
            pass

    # -- what runs -----------------------------------------------------------------

    def _on_del(self, obj: object) -> None:
        key = id(obj)
        if key in self.seen:
            return
        holds = _pointer_attrs(obj)
        module = _module_of(obj)
        if not holds and module.split(".")[0] not in self.known:
            return
        self.seen.add(key)
        site, origin = self.sites.get(key) or _site(self.traceback_of, obj)
        cls = type(obj)
        original = self.wrapped.get(cls)
        code = getattr(original, "__code__", None)
        self.sink.record(
            "__del__",
            f"{module}.{cls.__qualname__}" if module else cls.__qualname__,
            site,
            origin,
            holds=", ".join(f"{n} ({k})" for n, k in holds) or f"object of {module.split('.')[0]}",
            via=None if code is None else f"{code.co_filename}:{code.co_firstlineno}",
            suggest=_suggest_del(obj, holds, self.known),
        )

    def _on_finalize(self, fin: Any) -> None:
        info = self.finalize._registry.get(fin)  # type: ignore[attr-defined]
        if info is None:
            return  # already called or detached: it will not run its callback
        func = info.func
        target = info.weakref()
        site, origin = self.sites.get(id(fin)) or _site(self.traceback_of, fin)
        self.sink.record(
            "weakref.finalize",
            "finalizer of "
            + (type(target).__qualname__ if target is not None else "a dead object"),
            site,
            origin,
            holds=None,
            via=_callable_name(func),
            suggest=(
                f"exitsafe.track(raw, {_callable_name(func)}, depends_on=[...]) instead of"
                " weakref.finalize (or exitsafe.on_teardown(fn) for a cleanup hook)"
            ),
        )



class _Sink:
    """What records a release: the only part of the audit kept alive to the very end
    (`_keep_forever`), so it holds nothing of the program: no module dictionary,
    no function of the program, only strings, weak references and builtins."""

    def __init__(self, names: dict[int, str], frames: int) -> None:
        import _thread

        self.unknown = (
            "unknown (tracemalloc has no record of this object; CPython 3.11 cannot locate"
            " plain instances nor ctypes objects)"
            if frames and _state.since in ("startup", "earlier")
            else "unknown (tracemalloc was not tracing when it was created: run with"
            " PYTHONTRACEMALLOC=8 or exitsafe run --audit)"
        )

        self.state = _state
        self.names = names
        self.get_ident = _thread.get_ident
        self.refs: list[Any] = []  # weak references whose callbacks record a release

    def record(
        self,
        what: str,
        type_name: str,
        site: Optional[str],
        origin: Optional[str],
        *,
        holds: Optional[str],
        via: Optional[str],
        suggest: str,
    ) -> None:
        self.state.seq += 1
        _emit(
            "audit-release",
            seq=self.state.seq,
            what=what,
            type=type_name,
            site=site or self.unknown,
            stack=origin,
            holds=holds,
            via=via,
            thread=self.names.get(self.get_ident(), "a thread started late"),
            suggest=suggest,
        )


def _keep_forever(obj: object) -> None:
    """Leak one reference to ``obj`` on purpose: finalization clears module dictionaries
    and restores the builtins, and the recorder's weak references must outlive every
    object they watch."""
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except Exception:
        import codecs

        # A codec search function lives in the interpreter state until its very end.
        codecs.register(lambda name, _kept=obj: None)  # type: ignore[misc]


def _detach(recorder_class: type) -> None:
    """Give this module's functions and ``recorder_class``'s methods a private copy of
    the module globals and of the builtins: finalization clears module dictionaries,
    and the recorder must keep working after that."""
    import builtins
    import types

    private = dict(globals())
    private["__builtins__"] = dict(vars(builtins))

    def rebind(fn: Any) -> Any:
        new = types.FunctionType(
            fn.__code__, private, fn.__name__, fn.__defaults__, fn.__closure__
        )
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        return new

    for name, value in list(private.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == __name__:
            private[name] = rebind(value)
    for cls in (recorder_class, _Sink):
        for name, value in list(vars(cls).items()):
            if isinstance(value, types.FunctionType):
                setattr(cls, name, rebind(value))


_booted = sys.modules.get("exitsafe_boot_audit")
if _booted is not None and _booted is not sys.modules.get(__name__):
    # exitsafe run's start-up hook loaded this same file first, under another name: share
    # its state, so that the window exitsafe's exit hook opens is the one it installed.
    _state = _booted._state
elif enabled():
    install()

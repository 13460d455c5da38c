"""Audit mode: every native release that runs after exitsafe's exit teardown.

Turned on by ``EXITSAFE_AUDIT=1`` (``exitsafe run --audit`` sets it).  It is a validation
layer for exit order: a ``__del__`` that calls into a native library, an ``ffi.gc``
destructor or a ``weakref.finalize`` callback that runs while the interpreter finalizes its
modules ran in an order nobody chose.  It happened to work in this run; on another platform
or the next CPython it may crash.  Each one is reported, with where its object was created
and the exitsafe declaration that would put it in the ordered teardown instead.

Creation sites are taken only for the objects that have a native finalizer, when they are
made: each ``ffi.gc`` result of cffi's ``FFI`` (ABI mode), each ``weakref.finalize``, and each
instance of a class with a Python ``__del__`` and a Python ``__init__`` defined outside the
standard library (found as the class statement runs: ``builtins.__build_class__`` is
wrapped).  Nothing else is traced: the cost is a few hundred nanoseconds per such object and
nothing per other allocation (``tracemalloc`` from start-up made programs 5 to 14 times
slower).  A site that was not recorded (an object made before the audit was installed, an
API-mode ``ffi.gc``, an instance of a C type) is taken from ``tracemalloc`` when something
else started it (``PYTHONTRACEMALLOC``), else reported unknown.

The interface is narrow on purpose:

* `install` runs when this module is imported with ``EXITSAFE_AUDIT`` set (exitsafe
  imports it then; ``exitsafe run``'s start-up hook loads it in every Python process): it
  installs the creation-site hooks and registers a fallback `atexit` callback for programs
  that never import exitsafe.
* `after_exit_teardown` is called by exitsafe's exit hook once the exit teardown has
  finished: from then on releases are recorded (the *window*).  It also lists the threads
  still alive (``EXITSAFE_TRACE=1`` or audit on), with their whole stacks and the locks
  they hold, so that a thread unwound or stopped later can be named.
* In a run of ``exitsafe run`` (``EXITSAFE_RUN_DIR``), the start-up hook's `atexit` callback
  is the last one: it writes ``exit-<pid>.txt`` into the run directory when every exit hook
  has run (the interpreter finalizes modules next: a hang after it is in a finalizer), and
  the audit keeps the release in progress in ``audit-<pid>.state``, 16 bytes, so that a
  finalizer the process hung or crashed in is named.

Everything is written at once, as trace lines on stderr (``os.write`` on fd 2, so a crash
right after loses nothing)::

    exitsafe: thread ident=0x00007f... name="pool-1" daemon=true frame="app.py:12 in work"
        stack="app.py:12 in work <- threading.py:975 in run ..." holds="lock (locked)"
    exitsafe: audit-begin after="teardown" candidates=3 sites="hooks"
    exitsafe: audit-release seq=1 group=1 what="__del__" type="mylib.Device" site="app.py:20"
        holds="_ptr (cffi pointer)" suggest="..."   (one line in the real output)
    exitsafe: audit-repeat group=1 count=2

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
        "netCDF4", "rasterio", "pyrealsense2", "usb", "hid", "serial", "pyglet", "duckdb",
        "jpype", "cv2", "PySide6", "PyQt6", "PyQt5", "shiboken6",
    }
)
#: Method names that look like a release function (for the suggested ``adopt(close=...)``).
CLOSE_METHODS = ("close", "release", "destroy", "free", "dispose", "shutdown", "terminate")
#: Attribute names whose non-zero ``int`` value is taken for a native handle.
HANDLE_NAMES = frozenset({"_handle", "handle", "_ptr", "ptr", "_pointer", "pointer", "_raw"})
#: Frames kept per creation site (``EXITSAFE_AUDIT_FRAMES`` changes it).
DEFAULT_FRAMES = 4
#: Frames of a thread's stack written in its ``thread`` line.
THREAD_FRAMES = 16
#: Size of the file that holds the release in progress (``audit-<pid>.state``).
STATE_SIZE = 16

_TRUE = ("1", "true", "yes", "on")
#: Path fragments of frames that say nothing about who created an object.
_INTERNAL = ("/cffi/", "/ctypes/", "/tracemalloc.py", "/exitsafe/", "/_boot/")
#: Function names skipped when walking out of a constructor to its caller.
_CONSTRUCTORS = ("__init__", "__new__", "__call__", "__post_init__")
#: Lock types whose state a thread line reports: (module, type name).
_LOCKS = frozenset({
    ("_thread", "lock"), ("_thread", "RLock"), ("threading", "_RLock"),
    ("fastrlock.rlock", "FastRLock"), ("_multiprocessing", "SemLock"),
})


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.window = False  # releases are being recorded
        self.threads_listed = False
        self.fallback = False
        self.booted = False  # exitsafe run's start-up hook registered the fallback first
        self.phase_written = False
        self.seq = 0
        self.known: frozenset[str] = KNOWN_BINDINGS
        self.since = "none"
        self.frames = DEFAULT_FRAMES
        #: id(object) -> the number of its creation site (instances, finalizers)
        self.sites: dict[int, int] = {}
        #: (id(code), instruction, ...) of a creation site -> its number
        self.places: dict[tuple[int, ...], int] = {}
        #: number -> (code, instruction, code, instruction ...), innermost first
        self.place_sites: list[tuple[Any, ...]] = []
        #: id(ffi.gc result) -> the number of its creation site (pruned as it grows)
        self.gc_sites: dict[int, int] = {}
        #: (id(code), instruction, ...) of a place ffi.gc is called from -> its number
        self.gc_places: dict[tuple[int, ...], int] = {}
        #: number -> (code, instruction, code, instruction)
        self.gc_place_sites: list[tuple[Any, ...]] = []
        self.prune_at = 1 << 20
        self.hooked: list[str] = []


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


# ------------------------------------------------------------------- creation sites


def _hook_ffi_gc(ffi_class: Any) -> None:
    """Record where each ``ffi.gc`` result of cffi's ``FFI`` (ABI mode) is made.

    The hot path allocates nothing the garbage collector tracks (it would make every
    collection of an allocation-heavy program slower): each distinct place (the caller and
    its caller, as code and instruction) gets a number once, and the table maps the result's
    id to that number.  The table is pruned of dead pointers only when it has doubled."""
    original = ffi_class.__dict__.get("gc")
    if original is None or getattr(original, "_exitsafe_audit", False):
        return
    sites = _state.gc_sites
    places = _state.gc_places
    state = _state
    getframe = sys._getframe
    two = _state.frames >= 2

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
        if len(sites) >= state.prune_at:
            _prune_gc_sites()
        return result

    gc.__doc__ = original.__doc__
    gc.__wrapped__ = original  # type: ignore[attr-defined]
    gc._exitsafe_audit = True  # type: ignore[attr-defined]
    ffi_class.gc = gc
    _state.hooked.append("ffi.gc")


def _new_place(key: tuple[int, ...], frame: Any, outer: Any) -> int:
    """Number a new place of ``ffi.gc`` calls; its code objects are kept (their ids are
    in the key)."""
    number = len(_state.gc_place_sites)
    site = [frame.f_code, frame.f_lasti]
    if outer is not None:
        site += [outer.f_code, outer.f_lasti]
    _state.gc_place_sites.append(tuple(site))
    _state.gc_places[key] = number
    return number


def _prune_gc_sites() -> None:
    """Forget the ids of ``ffi.gc`` results no longer alive (the table would grow without
    bound in a program that makes and drops millions of them): one scan of the objects the
    garbage collector tracks, each time the table has doubled."""
    import gc

    sites = _state.gc_sites
    live = {id(o) for o in gc.get_objects() if type(o).__name__ == "__CDataGCP"}
    for key in [k for k in sites if k not in live]:
        del sites[key]
    _state.prune_at = max(1 << 20, 2 * len(sites))


def _gc_site(cdata: object) -> Optional[tuple[Any, ...]]:
    """The recorded site of an ``ffi.gc`` result, as (code, line, code, line)."""
    number = _state.gc_sites.get(id(cdata))
    if number is None:
        return None
    return _lines(_state.gc_place_sites[number])


def _object_site(obj: object) -> Optional[tuple[Any, ...]]:
    """The recorded site of an instance or a finalizer, as (code, line, code, line ...)."""
    number = _state.sites.get(id(obj))
    return None if number is None else _lines(_state.place_sites[number])


def _lines(entry: tuple[Any, ...]) -> tuple[Any, ...]:
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
    sites = _state.sites
    frames = _state.frames

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            sites[id(self)] = _place(sys._getframe(1), frames)
        except Exception:
            pass

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._exitsafe_audit = True  # type: ignore[attr-defined]
    finalize.__init__ = __init__
    _state.hooked.append("weakref.finalize")


def _place(frame: Optional[FrameType], count: int) -> int:
    """The number of the place ``frame`` and its ``count - 1`` callers are at (numbered
    once each: the table maps an object's id to a small number, not to frames)."""
    key: list[int] = []
    current = frame
    while current is not None and len(key) < 2 * count:
        key.append(id(current.f_code))
        key.append(current.f_lasti)
        current = current.f_back
    number = _state.places.get(tuple(key))
    if number is None:
        number = len(_state.place_sites)
        site: list[Any] = []
        current = frame
        while current is not None and len(site) < 2 * count:
            site.append(current.f_code)
            site.append(current.f_lasti)
            current = current.f_back
        _state.place_sites.append(tuple(site))
        _state.places[tuple(key)] = number
    return number


def _record_instance(obj: object) -> None:
    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None and frame.f_code.co_name in _CONSTRUCTORS:
        frame = frame.f_back
    _state.sites[id(obj)] = _place(frame, _state.frames)


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
    if module.split(".")[0] in stdlib and module.split(".")[0] not in _state.known:
        return
    _hook_del_class(cls)


def _install_site_hooks() -> None:
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
    _state.hooked.append("classes")


def install() -> None:
    """Start the audit in this process (idempotent): the creation-site hooks
    (``EXITSAFE_AUDIT_FRAMES`` frames per site, default 4) and the fallback exit hook."""
    if _state.installed:
        return
    _state.installed = True
    extra = os.environ.get("EXITSAFE_AUDIT_MODULES", "")
    if extra:
        _state.known = KNOWN_BINDINGS | {m.strip() for m in extra.split(",") if m.strip()}
    try:
        _state.frames = max(1, int(os.environ.get("EXITSAFE_AUDIT_FRAMES", "") or DEFAULT_FRAMES))
    except ValueError:
        _state.frames = DEFAULT_FRAMES
    _state.since = "startup" if _state.booted or not sys.modules.get("exitsafe") else "import"
    try:
        _install_site_hooks()
    except Exception:
        pass
    if not _state.fallback:
        _state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def boot() -> None:
    """Called by ``exitsafe run``'s start-up hook before the program runs: the audit when
    ``EXITSAFE_AUDIT`` is set, and the fallback exit hook that lists threads (and opens
    the audit window) in a program that never imports exitsafe.  Registered before
    anything else, that hook is the last one to run: it also writes the ``exit-phase``
    line."""
    _state.booted = True
    if enabled() or _flag("EXITSAFE_TRACE"):
        try:
            _when_imported("threading", _list_at_shutdown)
        except Exception:
            pass
    if enabled():
        install()
    elif not _state.fallback:
        _state.fallback = True
        import atexit

        atexit.register(_fallback_at_exit)


def _fallback_at_exit() -> None:
    # Registered when the audit was installed.  When exitsafe's exit hook is pending (it
    # was registered before this one, so it runs after it) it opens the window itself.
    if _state.booted:
        _exit_phase()
    if "exitsafe._process" in sys.modules and not _state.window and not _state.booted:
        return
    try:
        _open_window("atexit")
    except Exception:
        pass


def _exit_phase() -> None:
    """The last exit hook has run: the interpreter finalizes modules next.  Written to
    ``exit-<pid>.txt`` of exitsafe run's directory (``finalizing 0x<thread ident>``), not
    on stderr, so the program's output is unchanged."""
    run_dir = os.environ.get("EXITSAFE_RUN_DIR")
    if _state.phase_written or not run_dir:
        return
    _state.phase_written = True
    try:
        import _thread

        path = os.path.join(run_dir, f"exit-{os.getpid()}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"finalizing 0x{_thread.get_ident():016x}\n".encode("ascii"))
        finally:
            os.close(fd)
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


# ------------------------------------------------------------------ threads at exit


class _AfterImport:
    """A ``sys.meta_path`` entry that runs ``callback(module)`` once ``name`` is imported
    (and then leaves ``sys.meta_path``): nothing is imported early for it."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenLoader(spec.loader, self.callback)  # type: ignore[assignment]
        return spec


class _ThenLoader:
    """A loader that runs the real one, then a callback; anything else is the real one's."""

    def __init__(self, loader: Any, callback: Callable[[Any], None]) -> None:
        self._loader = loader
        self._callback = callback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            module.__loader__ = self._loader
            module.__spec__.loader = self._loader
        except AttributeError:
            pass
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception:
            pass


def _when_imported(name: str, callback: Callable[[Any], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _list_at_shutdown(threading: Any) -> None:
    """List the threads when the exit begins too (``threading._shutdown``, before the
    interpreter joins the non-daemon threads): a hang in an exit handler comes before the
    list at the end of the exit hooks."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(lambda: list_threads("shutdown"))


def list_threads(when: str = "exit") -> None:
    """Write one ``thread`` trace line per thread still alive besides this one (once per
    ``when``: ``"shutdown"`` as the exit begins, ``"exit"`` after the exit hooks), with its
    whole stack and the locks its frames hold."""
    if _state.threads_listed or (when == "shutdown" and _state.phase_written):
        return
    if when == "exit":
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
                stack=None if frame is None else _stack_text(frame),
                holds=None if frame is None else _held_locks(frame, ident),
                when=when,
            )
    except Exception:
        pass


def _frame_text(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def _stack_text(frame: FrameType) -> str:
    parts: list[str] = []
    current: Optional[FrameType] = frame
    while current is not None and len(parts) < THREAD_FRAMES:
        parts.append(_frame_text(current))
        current = current.f_back
    if current is not None:
        parts.append("...")
    return " <- ".join(parts)


def _lock_state(obj: object, ident: int) -> Optional[str]:
    """How ``obj``, a lock, is held: ``"locked"``, ``"held by this thread"``, or ``None``."""
    cls = type(obj)
    key = (getattr(cls, "__module__", ""), cls.__name__)
    if key not in _LOCKS:
        inner = getattr(obj, "__dict__", {}).get("_lock") if key == (
            "threading", "Condition") else None
        return None if inner is None else _lock_state(inner, ident)
    if key == ("_thread", "RLock") or key == ("threading", "_RLock"):
        text = repr(obj)
        if "owner=" in text:
            try:
                owner = int(text.split("owner=", 1)[1].split()[0])
            except ValueError:
                return None
            return "held by this thread" if owner == ident else None
        return None
    if key == ("fastrlock.rlock", "FastRLock"):
        return None  # no way to tell its owner from another thread
    try:
        return "locked" if obj.locked() else None  # type: ignore[attr-defined]
    except Exception:
        return None


def _held_locks(frame: FrameType, ident: int) -> Optional[str]:
    """The locks the names of ``frame`` and the frames below it refer to that are held
    (by this thread, when the lock type tells; else locked by someone)."""
    found: list[str] = []
    seen: set[int] = set()
    current: Optional[FrameType] = frame
    depth = 0
    while current is not None and depth < 32:
        code = current.f_code
        try:
            local = dict(current.f_locals)
        except Exception:
            local = {}
        scopes = (local, current.f_globals)
        for name in (*code.co_varnames, *code.co_names, *code.co_freevars, *code.co_cellvars):
            for scope in scopes:
                value = scope.get(name)
                if value is None or id(value) in seen:
                    continue
                candidates = [(name, value)]
                owned = getattr(value, "__dict__", None)
                if isinstance(owned, dict):  # self._lock, module.lock
                    candidates += [(f"{name}.{attr}", owned[attr]) for attr in code.co_names
                                   if attr in owned]
                for label, candidate in candidates:
                    if id(candidate) in seen:
                        continue
                    seen.add(id(candidate))
                    state = _lock_state(candidate, ident)
                    if state is not None:
                        kind = f"{type(candidate).__module__}.{type(candidate).__name__}"
                        found.append(f"{label} ({kind}, {state})")
        current = current.f_back
        depth += 1
    return "; ".join(found) if found else None


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


def _internal(filename: str) -> bool:
    name = filename.replace("\\", "/")
    return any(part in name for part in _INTERNAL)


def _format_site(site: tuple[Any, ...]) -> tuple[Optional[str], Optional[str]]:
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


def _traced_site(
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
        if _is_pointer(value) is not None:
            continue
        if getattr(cls, "__del__", None) is not None or _module_of(value).split(".")[0] in known:
            if _pointer_attrs(value):
                return name
    return None


def _suggest_del(
    obj: object, holds: list[tuple[str, str]], known: frozenset[str]
) -> tuple[str, Optional[str]]:
    """(the exitsafe code that declares ``obj``, another declaration for an object the
    program does not own, or ``None``).  Each is valid code where ``obj`` names the
    object; statements are separated by ``"; "``."""
    cls = type(obj)
    parent = _parent_attr(obj, known)
    close = next((m for m in CLOSE_METHODS if callable(getattr(cls, m, None))), None)
    pointer = next((name for name, kind in holds if kind not in ("cffi library",
                                                                  "ctypes library")), None)
    before = f"parent = exitsafe.adopt(obj.{parent}, close=None); " if parent else ""
    depends = ", depends_on=[parent]" if parent else ""
    neutralize = None
    if pointer is not None:  # its __del__ becomes a no-op: no order to keep
        neutralize = f'exitsafe.lowlevel.neutralize_at_exit(obj, attr="{pointer}")'
    if close is not None:
        return f'{before}exitsafe.adopt(obj, close="{close}"{depends})', neutralize
    if neutralize is not None:
        return neutralize, None
    return f"{before}exitsafe.adopt(obj, close=type(obj).__del__{depends})", None


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


def _library_names(libraries: Optional[list[Any]] = None) -> dict[int, str]:
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


def _code_name(fn: object, library_names: Callable[[], dict[int, str]]) -> Optional[str]:
    """A name ``fn`` can be written as in suggested code (``lib.free``, ``free_frame``), or
    ``None``; ``library_names`` gives the names of cffi functions (`_library_names`)."""
    if getattr(type(fn), "__module__", "") == "_cffi_backend":
        declared = library_names().get(id(fn))
        return None if declared is None else f"lib.{declared}"
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name.isidentifier():
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, type(sys)):
            return None
        return name
    return None


class _Group:
    """Releases of one kind, type and creation site: reported once, then counted."""

    __slots__ = ("begin", "count", "fields", "gid")

    def __init__(self, gid: int, fields: dict[str, Any]) -> None:
        self.gid = gid
        self.fields = fields
        self.count = 0
        self.begin = (b"%-15d" % gid)[:15] + b"R"


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
        self.traced = tracemalloc.is_tracing()
        try:
            import _tracemalloc

            self.traceback_of: Callable[[object], Any] = _tracemalloc._get_object_traceback
        except ImportError:  # pragma: no cover - CPython always has it
            self.traceback_of = lambda obj: None
        self.known = _state.known
        self.state = _state
        self.wrapped: dict[type, Any] = {}
        self.objects: dict[int, _Group] = {}  # id(instance or finalize) -> its group
        self.groups: dict[tuple[Any, ...], _Group] = {}
        self.destructors: dict[int, tuple[Optional[str], str]] = {}
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
            import _cffi_backend

            self.typeof: Callable[[object], Any] = _cffi_backend.typeof
        except ImportError:
            self.typeof = type
        self.sink = _Sink(self.names, self._unknown_site())

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
        _emit(
            "audit-begin",
            after=self.after,
            candidates=candidates,
            sites=",".join(self.state.hooked) or "none",
            tracemalloc=1 if self.traced else 0,
            since=self.state.since,
        )

    def _site(self, obj: object, table: dict[int, Any]) -> tuple[Optional[str], Optional[str]]:
        recorded = _gc_site(obj) if table is self.state.gc_sites else _object_site(obj)
        if recorded:
            return _format_site(recorded)
        if self.traced:
            return _traced_site(self.traceback_of, obj)
        return None, None

    def _library_names(self) -> dict[int, str]:
        if self.lib_names is None:
            self.lib_names = _library_names()
        return self.lib_names

    def _group(self, key: tuple[Any, ...], make: Callable[[], dict[str, Any]]) -> _Group:
        group = self.groups.get(key)
        if group is None:
            group = _Group(len(self.groups) + 1, make())
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
            holds = _pointer_attrs(obj)
            if what == 2 and not holds:
                continue
            if cls not in self.wrapped:
                self._wrap_del(cls)
            self.objects[id(obj)] = self._del_group(obj, holds)
            count += 1
        self.lib_names = _library_names(libraries)
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

    def _del_group(self, obj: object, holds: list[tuple[str, str]]) -> _Group:
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
            site, origin = _format_site(_lines(self.state.place_sites[place]))
        elif place is not None:
            site, origin = _format_site(_lines(self.state.gc_place_sites[-1 - place]))
        elif self.traced:
            site, origin = _traced_site(self.traceback_of, obj)
        else:
            site, origin = None, None
        module = _module_of(obj)

        def make() -> dict[str, Any]:
            original = self.wrapped.get(cls)
            code = getattr(original, "__code__", None)
            suggest, alternative = _suggest_del(obj, holds, self.known)
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

    def _finalize_group(self, fin: Any, info: Any) -> _Group:
        func = info.func
        target = info.weakref()
        site, origin = self._site(fin, self.state.sites)
        args = tuple(info.args or ())
        label = type(target).__qualname__ if target is not None else "a dead object"

        def make() -> dict[str, Any]:
            code = _code_name(func, self._library_names)
            if code is not None and len(args) == 1 and not info.kwargs:
                suggest = f"exitsafe.track(raw, {code})"
            elif code is not None:
                suggest = f"exitsafe.on_teardown(lambda: {code}(*args))"
            else:
                suggest = "exitsafe.on_teardown(lambda: callback(*args))"
            return {
                "what": "weakref.finalize",
                "type": "finalizer of " + label,
                "site": site,
                "stack": origin,
                "holds": None,
                "via": _callable_name(func),
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

    def _gc_group(self, key: tuple[Any, ...], cdata: Any, destructor: Any) -> _Group:
        named = self.destructors.get(id(destructor))
        if named is None:
            via = None if destructor is None else _callable_name(destructor)
            code = None if destructor is None else _code_name(destructor, self._library_names)
            if code is None:
                code = f"lib.{via.split(' (')[0]}" if via and " (" in via else "release"
            named = self.destructors[id(destructor)] = (via, code)
        via, release = named
        site, origin = self._site(cdata, self.state.gc_sites)
        cname = _ctype_name(cdata)
        return self._group(key, lambda: {
            "what": "ffi.gc",
            "type": f"cdata '{cname}'",
            "site": site,
            "stack": origin,
            "holds": None,
            "via": via,
            # ptr: the pointer before ffi.gc; the pin makes the library outlive it
            "suggest": (
                f"exitsafe.cffi.pin(ffi, lib); handle = exitsafe.cffi.track(ffi, ptr,"
                f" {release})"
            ),
            "alternative": None,
        })

    # -- what runs -----------------------------------------------------------------

    def _on_del(self, obj: object) -> Optional[_Group]:
        group = self.objects.pop(id(obj), None)
        if group is None:
            # not alive when the window opened: made later, look now
            holds = _pointer_attrs(obj)
            if not holds and _module_of(obj).split(".")[0] not in self.known:
                return None
            group = self._del_group(obj, holds)
        self.sink.begin(group)
        return group

    def _on_finalize(self, fin: Any) -> Optional[_Group]:
        info = self.finalize._registry.get(fin)  # type: ignore[attr-defined]
        if info is None:
            return None  # already called or detached: it will not run its callback
        group = self.objects.pop(id(fin), None)
        if group is None:
            group = self._finalize_group(fin, info)
        self.sink.begin(group)
        return group


def _ctype_name(cdata: Any) -> str:
    try:
        import _cffi_backend

        return str(_cffi_backend.typeof(cdata).cname)
    except Exception:
        text = repr(cdata)
        return text.split(" 0x")[0].replace("<cdata ", "").strip("'>")


class _Sink:
    """What records a release: the only part of the audit kept alive to the very end
    (`_keep_forever`), so it holds nothing of the program: no module dictionary,
    no function of the program, only strings, weak references and builtins."""

    def __init__(self, names: dict[int, str], unknown: str) -> None:
        import _thread

        self.unknown = unknown
        self.state = _state
        self.names = names
        self.get_ident = _thread.get_ident
        #: id(weak reference) -> the reference, and its group: one per ffi.gc pointer
        self.refs: dict[int, Any] = {}
        self.groups_of: dict[int, _Group] = {}
        self.slot = _open_slot()

    def begin(self, group: _Group) -> None:
        """A release of ``group`` begins (written before the finalizer runs)."""
        group.count += 1
        count = group.count
        slot = self.slot
        if slot is not None:
            slot[0:STATE_SIZE] = group.begin
        if count & (count - 1) == 0:  # 1, 2, 4 ...
            self.report(group, count)

    def report(self, group: _Group, count: int) -> None:
        """The first release of ``group`` (all its fields), then how many so far."""
        if count == 1:
            self.state.seq += 1
            fields = group.fields
            _emit(
                "audit-release",
                seq=self.state.seq,
                group=group.gid,
                what=fields["what"],
                type=fields["type"],
                site=fields["site"] or self.unknown,
                stack=fields["stack"],
                holds=fields["holds"],
                via=fields["via"],
                thread=self.names.get(self.get_ident(), "a thread started late"),
                suggest=fields["suggest"],
                alternative=fields["alternative"],
            )
        else:  # 2, 4, 8 ...: how many, without a line each
            _emit("audit-repeat", group=group.gid, count=count)

    def done(self, group: _Group) -> None:
        """The release of ``group`` that began last has returned."""
        slot = self.slot
        if slot is not None:
            slot[STATE_SIZE - 1 : STATE_SIZE] = b"D"

    def gc_released(self, ref: Any) -> None:
        """The weak reference on an ``ffi.gc`` pointer died: its destructor runs next
        (cffi clears the weak references first); its end cannot be seen."""
        try:
            key = id(ref)
            group = self.groups_of.pop(key, None)
            if group is not None:  # begin(), inlined: there may be millions of them
                group.count += 1
                count = group.count
                slot = self.slot
                if slot is not None:
                    slot[0:STATE_SIZE] = group.begin
                if count & (count - 1) == 0:
                    self.report(group, count)
            del self.refs[key]
        except BaseException:
            pass


def _open_slot() -> Any:
    """A writable 16-byte map of ``audit-<pid>.state`` in exitsafe run's directory, or
    ``None``: the release in progress, for the runner to read after the process ended."""
    run_dir = os.environ.get("EXITSAFE_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return None
    try:
        import mmap

        path = os.path.join(run_dir, f"audit-{os.getpid()}.state")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b" " * STATE_SIZE)
            return mmap.mmap(fd, STATE_SIZE)
        finally:
            os.close(fd)
    except Exception:
        return None


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
    for cls in (recorder_class, _Sink, _Group):
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

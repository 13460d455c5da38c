"""Bad input is answered with TypeError / ValueError (or an ExitsafeError) naming the
argument, before anything changes; never a crash, a hang or a later AttributeError."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import inspect
import signal
import sys
import threading

import pytest

import exitsafe
import exitsafe.cffi
import exitsafe.ctypes
from exitsafe import HandleClosedError, LiveDependentsError, Registry, RegistryClosedError
from exitsafe._usage import explained
from exitsafe.policies import any_leak
from exitsafe.signals import teardown_on_signals


@pytest.fixture
def reg() -> Registry:
    return Registry("bad-input", ledger_limit=None)


def noop(raw: object) -> None:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": 5}, TypeError, "name must be a str"),
        ({"strict": "no"}, TypeError, "strict must be True or False"),
        ({"strict": 1}, TypeError, "strict must be True or False"),
        ({"exit_policy": "maybe"}, ValueError, "exit_policy must be"),
        ({"exit_policy": 5}, TypeError, "exit_policy must be"),
        ({"ledger_limit": -1}, ValueError, "ledger_limit"),
        ({"ledger_limit": True}, ValueError, "ledger_limit"),
        ({"step_timeout": "1"}, TypeError, "step_timeout must be a number"),
        ({"teardown_timeout": 0}, ValueError, "teardown_timeout must be a positive"),
    ],
)
def test_registry_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        Registry(**kwargs)


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (10**400, ValueError),  # too large for a float: not an OverflowError
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (-1, ValueError),
        (0, ValueError),
        ("1", TypeError),
        (True, TypeError),
    ],
)
def test_timeouts(reg, timeout, error):
    with pytest.raises(error, match="timeout must be"):
        reg.track("x", noop, timeout=timeout)
    with pytest.raises(error, match="timeout must be"):
        reg.step_timeout = timeout
    assert reg.live_handles() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kind": 5}, TypeError, "kind must be a str"),
        ({"name": b"x"}, TypeError, "name must be a str"),
        ({"depends_on": 5}, TypeError, "depends_on must be a Handle or an iterable"),
        ({"depends_on": [object()]}, TypeError, "depends_on must contain exitsafe Handles"),
        ({"exit_policy": "never"}, ValueError, "exit_policy must be"),
    ],
)
def test_track_arguments(reg, kwargs, error, match):
    with pytest.raises(error, match=match):
        reg.track("x", noop, **kwargs)
    assert reg.live_handles() == []


def test_track_release_must_be_callable(reg):
    with pytest.raises(TypeError, match="release must be callable"):
        reg.track("x", "free")


def test_guard_arguments():
    with pytest.raises(TypeError, match=r"registry must be an exitsafe\.Registry"):
        exitsafe.guard(print, registry="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a callable"):
        exitsafe.guard("print")  # type: ignore[arg-type]


def test_teardown_reason_is_checked_before_anything_is_claimed(reg):
    h = reg.track("x", noop, name="x")
    with pytest.raises(TypeError, match="reason must be a str"):
        reg.teardown(reason=5)  # type: ignore[arg-type]
    assert not reg.tearing_down and h.state == "live" and h.raw == "x"
    reg.teardown()
    assert h.state == "released"


def test_handle_cannot_be_constructed_directly_and_leaves_no_noise():
    unraisable = []
    old, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(TypeError, match="created by track"):
            exitsafe.Handle()
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert unraisable == []


def test_on_teardown_and_pin_arguments(reg):
    with pytest.raises(TypeError, match="fn must be callable"):
        reg.on_teardown("hook")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a loaded library"):
        reg.pin(None)
    with pytest.raises(TypeError, match="close must be callable"):
        reg.pin("lib", close="dlclose")  # type: ignore[arg-type]


def test_adopt_arguments(reg):
    with pytest.raises(TypeError, match="needs an object"):
        exitsafe.adopt(None, registry=reg)
    h = reg.track("x", noop)
    with pytest.raises(TypeError, match="not an exitsafe Handle"):
        exitsafe.adopt(h, registry=reg)
    with pytest.raises(TypeError, match=r"registry must be an exitsafe\.Registry"):
        exitsafe.adopt(object(), close=None, registry="default")  # type: ignore[arg-type]


def test_any_leak_rejects_what_is_not_a_policy():
    with pytest.raises(ValueError, match="not an exit policy"):
        any_leak("release", "sometimes")


def test_detach_refusals(reg):
    parent = reg.track("p", noop, name="p")
    child = reg.track("c", noop, name="c", depends_on=[parent])
    with pytest.raises(LiveDependentsError, match="live dependents: c") as info:
        parent.detach()
    assert info.value.dependents == ("c",)
    with child.borrow():
        with pytest.raises(HandleClosedError, match="borrowed"):
            child.detach()
    assert child.detach() == "c"
    assert child.state == "detached"
    with pytest.raises(HandleClosedError):
        child.detach()
    reg.teardown()
    with pytest.raises(RegistryClosedError):
        parent.detach()


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("restore_signals")
def test_teardown_on_signals_takes_one_signal_name_as_one_signal():
    installed = teardown_on_signals("SIGTERM")
    assert list(installed) == [signal.SIGTERM]
    installed = teardown_on_signals(signal.SIGINT, mode="immediate")
    assert list(installed) in ([signal.SIGINT], [])


@pytest.mark.usefixtures("restore_signals")
@pytest.mark.parametrize(
    ("signals", "error", "match"),
    [
        (["SIGKILL"], ValueError, "SIGKILL cannot be caught"),
        (["SIGSTOP"], ValueError, "SIGSTOP cannot be caught"),
        (["SIGNOPE"], ValueError, "unknown signal name"),
        ([10_000], ValueError, "not a valid signal number"),
        ([3.5], TypeError, "names or numbers"),
        (None, TypeError, "a signal or an iterable"),
    ],
)
def test_teardown_on_signals_bad_signals(signals, error, match):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(error, match=match):
        teardown_on_signals(["SIGTERM", *signals] if isinstance(signals, list) else signals)
    assert signal.getsignal(signal.SIGTERM) is before, "nothing installed"


def test_teardown_on_signals_bad_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        teardown_on_signals(mode="later")


# ------------------------------------------------- wrong calls name the call and the fix
#
# Each public function of exitsafe, exitsafe.cffi and exitsafe.ctypes, fed the shapes a
# wrong call usually has (an argument missing or swapped, an option given by position, a
# misspelled keyword, the result of a call where the function was meant): the error names
# the public call, what is wrong, and what to write.  No case changes any state: each is
# refused before anything is registered.


WINDOWS = sys.platform == "win32"


@pytest.fixture(scope="module")
def native():
    """A cffi FFI and library and a ctypes library, over the C library (cffi's
    ``dlopen(None)``: POSIX only)."""
    if WINDOWS:
        pytest.skip("ffi.dlopen(None) opens the C library on POSIX systems only")
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    lib = ffi.dlopen(None)
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    registry = Registry("wrong calls")
    handle = registry.track("raw", noop, name="h")
    memory = []

    def pointer():
        p = lib.malloc(8)
        memory.append(p)
        return p

    yield {"ffi": ffi, "lib": lib, "libc": libc, "reg": registry, "h": handle,
           "ptr": pointer, "proto": ctypes.CFUNCTYPE(None, ctypes.c_int)}
    registry.teardown()
    for p in memory:
        lib.free(p)


#: (the call, as a program would write it; the error's type; what the message must contain
#: besides the public call's name).  ``n`` holds the fixture's objects.
def case(code: str, *says: str, error: type = TypeError) -> tuple[str, type, tuple[str, ...]]:
    """A wrong call (``code``), the error it raises and what its message says (besides the
    call's name)."""
    return code, error, says


#: Messages of Registry.track's own checks, the same for exitsafe.track and Registry.track
#: (one function serves both, in both cores): they name the call "track()".
SHARED = ("release must be callable", "kind must be a str")


WRONG_CALLS = [
    # ---- exitsafe
    case(
        "exitsafe.track('x')",
        "missing the argument release", "write exitsafe.track(raw, release",
    ),
    case("exitsafe.track()", "missing the arguments raw (the native object) and release"),
    case(
        "exitsafe.track(print, 'x')",
        "release must be callable", "swapped", "track(raw, release)",
    ),
    case("exitsafe.track('x', 'free')", "release must be callable", "lib.thing_free"),
    case("exitsafe.track('x', print, n['h'])", "kind must be a str", "depends_on=[...]"),
    case(
        "exitsafe.track('x', print, depend_on=[n['h']])",
        "no parameter 'depend_on'", "did you mean depends_on",
    ),
    case(
        "exitsafe.pin()",
        "missing the argument library", "ffi.dlopen()", "write exitsafe.pin(library",
    ),
    case(
        "exitsafe.pin(n['lib'], n['ffi'].dlclose)",
        "takes 1 positional argument", "write exitsafe.pin(library, close=...)",
    ),
    case("exitsafe.pin(None)", "needs a loaded library object", "ffi.dlopen()"),
    case("exitsafe.adopt()", "missing the argument obj", "write exitsafe.adopt(obj"),
    case(
        "exitsafe.adopt(object(), 'close')",
        "keyword-only", "write exitsafe.adopt(obj, close=...)",
    ),
    case("exitsafe.adopt(object())", "no callable 'close' method", "close=<method name>"),
    case("exitsafe.on_teardown()", "missing the argument fn", "write exitsafe.on_teardown(fn"),
    case(
        "exitsafe.on_teardown(print, [n['h']])",
        "keyword-only", "write exitsafe.on_teardown(fn, before=...)",
    ),
    case("exitsafe.on_teardown(None)", "fn must be callable", "not what calling it returned"),
    case("exitsafe.on_early_exit()", "missing the argument fn", "write exitsafe.on_early_exit(fn)"),
    case(
        "exitsafe.on_early_exit(threading.Event().set())",
        "fn must be callable", "the function itself",
    ),
    case(
        "exitsafe.worker(threading.Thread(), threading.Event())",
        "takes 1 positional argument", "write exitsafe.worker(thread, stop=...)",
    ),
    case("exitsafe.worker(threading.Thread(), stop='x')", "stop must be"),
    case("exitsafe.quiesce('x')", "thread idents", "write quiesce() for every thread"),
    case("exitsafe.quiesce(timeout=-1)", "timeout must be a positive", error=ValueError),
    case("exitsafe.guard()", "missing the argument fn", "write exitsafe.guard(fn"),
    case("exitsafe.guard(print, 0)", "keyword-only", "write exitsafe.guard(fn, default=...)"),
    case("exitsafe.guard('print')", "needs a callable", "the function itself"),
    case("exitsafe.teardown(5)", "reason must be a str", "a label"),
    case(
        "exitsafe.teardown('a', 'b')",
        "takes 1 positional argument (reason)", "write exitsafe.teardown()",
    ),
    case("exitsafe.ledger(n['reg'])", "takes 0 positional arguments", "write exitsafe.ledger()"),
    case("exitsafe.native(None)", "needs a library name", "exitsafe.native('cv2')"),
    case("exitsafe.exit('x')", "code must be an int or None", "sys.exit"),
    case("exitsafe.exit(1, 2)", "takes 1 positional argument (code)", "write exitsafe.exit(code)"),
    # ---- exitsafe.cffi
    case(
        "exitsafe.cffi.track(n['ptr'](), n['lib'].free)",
        "must be the cffi FFI object", "write exitsafe.cffi.track(ffi, ptr, release)",
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], n['ptr']())",
        "missing the argument release", "lib.thing_free",
        "write exitsafe.cffi.track(ffi, ptr, release)",
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], n['ptr'](), n['lib'].free, n['h'])",
        "keyword-only", "write exitsafe.cffi.track(ffi, ptr, release, depends_on=...)",
    ),
    case(
        "exitsafe.cffi.track(n['lib'], n['ptr'](), n['lib'].free)",
        "cffi FFI object as first argument", "write exitsafe.cffi.track(ffi, ptr, release)",
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], n['lib'].malloc, n['lib'].free)",
        "needs a pointer", "call the function for the pointer it returns",
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], 12345, n['lib'].free)",
        "needs a cffi cdata pointer", "ffi.cast('void *', address)",
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], n['ffi'].NULL, n['lib'].free)",
        "NULL pointer", "did the C call fail?", error=ValueError,
    ),
    case(
        "exitsafe.cffi.track(n['ffi'], n['ptr'](), 'free')",
        "release must be callable", "lib.thing_free",
    ),
    case(
        "exitsafe.cffi.pin(n['lib'])",
        "must be the cffi FFI object", "write exitsafe.cffi.pin(ffi, lib)",
    ),
    case(
        "exitsafe.cffi.pin(n['lib'], n['ffi'])",
        "cffi FFI object as first argument", "write exitsafe.cffi.pin(ffi, lib)",
    ),
    case(
        "exitsafe.cffi.pin(n['ffi'], 'libc.so.6')",
        "needs the library object", "exitsafe.cffi.pin(ffi, ffi.dlopen('libc.so.6'))",
    ),
    case(
        "exitsafe.cffi.pin(n['ffi'], n['lib'], False)",
        "keyword-only", "write exitsafe.cffi.pin(ffi, lib, close=...)",
    ),
    case(
        "exitsafe.cffi.pin(n['ffi'], n['lib'], close=n['ffi'].dlclose)",
        "close must be True or False", "close=False",
    ),
    case(
        "exitsafe.cffi.callback('void(*)(int)', print)",
        "must be the cffi FFI object", "write exitsafe.cffi.callback(ffi, 'void(*)(int)', fn)",
    ),
    case(
        "exitsafe.cffi.callback(n['ffi'], print)",
        "missing the argument fn", "write exitsafe.cffi.callback(ffi,",
    ),
    case(
        "exitsafe.cffi.callback(n['ffi'], print, 'void(*)(int)')",
        "the C type comes before the function", "exitsafe.cffi.callback(ffi, 'void(*)(int)', fn)",
    ),
    case(
        "exitsafe.cffi.callback(n['ffi'], 'void(int)', print)",
        "function type", "write 'void(*)(int)'", error=Exception,
    ),
    case(
        "exitsafe.cffi.callback(n['ffi'], 'int', print)",
        "needs a function pointer type", "'int(*)(int)'",
    ),
    case(
        "exitsafe.cffi.callback(n['ffi'], 'void(*)(int)', print, 0)",
        "keyword-only", "default=...",
    ),
    case(
        "exitsafe.cffi.call(5)",
        "fn must be the foreign function", "not exitsafe.cffi.call(lib.thing_run(handle.raw, 10))",
    ),
    case(
        "exitsafe.cffi.call(n['h'], n['lib'].free)",
        "the function comes first", "exitsafe.cffi.call(lib.thing_run, handle",
    ),
    case(
        "exitsafe.cffi.handle_of()",
        "missing the argument obj", "write exitsafe.cffi.handle_of(ptr)",
    ),
    case(
        "exitsafe.cffi.handle_of(n['ptr'](), n['reg'])",
        "keyword-only", "write exitsafe.cffi.handle_of(obj, registry=...)",
    ),
    case(
        "exitsafe.cffi.pinned(n['lib'], n['reg'])",
        "keyword-only", "write exitsafe.cffi.pinned(lib, registry=...)",
    ),
    case(
        "exitsafe.cffi.borrowing()",
        "missing the argument lib", "write exitsafe.cffi.borrowing(lib)",
    ),
    case(
        "exitsafe.cffi.borrowing(n['ffi'])",
        "the ffi object itself", "the library its dlopen() returned",
    ),
    case("exitsafe.cffi.borrowing('libc')", "needs a library", "must be loaded first"),
    # ---- exitsafe.ctypes
    case(
        "exitsafe.ctypes.track(n['libc'].malloc(8))",
        "missing the argument release", "write exitsafe.ctypes.track(ptr, release)",
    ),
    case(
        "exitsafe.ctypes.track(n['libc'].free, 4096)",
        "release must be callable", "swapped", "exitsafe.ctypes.track(ptr, release)",
    ),
    case(
        "exitsafe.ctypes.track(4096, n['libc'].free, n['h'])",
        "keyword-only", "write exitsafe.ctypes.track(ptr, release, depends_on=...)",
    ),
    case("exitsafe.ctypes.track(None, n['libc'].free)", "got None", "NULL pointer"),
    case("exitsafe.ctypes.track('x', n['libc'].free)", "needs a ctypes pointer", "restype"),
    case(
        "exitsafe.ctypes.track(n['libc'].malloc, n['libc'].free)",
        "function pointer", "call the function for the pointer it returns",
    ),
    case("exitsafe.ctypes.pin()", "missing the argument lib", "write exitsafe.ctypes.pin(lib)"),
    case(
        "exitsafe.ctypes.pin('libc.so.6')",
        "needs a ctypes CDLL", "exitsafe.ctypes.pin(ctypes.CDLL('libc.so.6'))",
    ),
    case(
        "exitsafe.ctypes.pin(n['libc'], False)",
        "keyword-only", "write exitsafe.ctypes.pin(lib, close=...)",
    ),
    case("exitsafe.ctypes.pin(None)", "needs a ctypes library", "ctypes.CDLL()"),
    case("exitsafe.ctypes.callback(print)", "must be the prototype", "ctypes.CFUNCTYPE("),
    case(
        "exitsafe.ctypes.callback(print, n['proto'])",
        "the prototype comes before the function", "callback(proto, fn)",
    ),
    case(
        "exitsafe.ctypes.callback(n['proto'](print), print)",
        "already made from a prototype", "callback(PROTO, fn)",
    ),
    case(
        "exitsafe.ctypes.callback('void(int)', print)",
        "cffi's form", "ctypes.CFUNCTYPE(None, ctypes.c_int)",
    ),
    case("exitsafe.ctypes.callback(n['proto'], print, 0)", "keyword-only", "default=..."),
    case("exitsafe.ctypes.call(5)", "fn must be the foreign function", "apart"),
    case("exitsafe.ctypes.handle_of(4096, n['reg'])", "keyword-only", "registry=..."),
    case("exitsafe.ctypes.pinned(n['libc'], n['reg'])", "keyword-only", "registry=..."),
    case(
        "exitsafe.ctypes.borrowing()",
        "missing the argument lib", "write exitsafe.ctypes.borrowing(lib)",
    ),
    case("exitsafe.ctypes.borrowing('libc')", "needs a library", "must be loaded first"),
]


def _public_call(code: str) -> str:
    return code.partition("(")[0]


@pytest.mark.parametrize(("code", "error", "says"), WRONG_CALLS, ids=[c for c, _, _ in WRONG_CALLS])
def test_a_wrong_call_names_the_call_and_the_fix(native, code, error, says):
    live = len(native["reg"].live_handles())
    with pytest.raises(error) as info:
        eval(code, {"exitsafe": exitsafe, "threading": threading, "n": native})
    message = str(info.value)
    named = "track()" if message.startswith(tuple(f"track(): {s}" for s in SHARED)) else (
        _public_call(code)
    )
    assert named in message, f"{code}: the call is not named: {message}"
    for part in says:  # ("Write ..." ends a sentence, "; write ..." a clause)
        assert part.lower() in message.lower(), f"{code}: {part!r} not in {message!r}"
    assert len(native["reg"].live_handles()) == live, "a wrong call registered something"


def test_every_public_function_has_a_wrong_call():
    """WRONG_CALLS covers every public function of the three modules."""
    covered = {_public_call(code) for code, _, _ in WRONG_CALLS}
    public = set()
    for module in (exitsafe, exitsafe.cffi, exitsafe.ctypes):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isbuiltin(value):
                public.add(f"{module.__name__}.{name}")
    assert public - covered == set(), f"no wrong call tried for {sorted(public - covered)}"


def test_an_error_of_the_programs_own_code_is_left_alone():
    """A TypeError raised by code that is not exitsafe's (a callback run inside the call)
    reaches the caller unchanged: the same object, the same message."""
    raised = TypeError("the program's own error")

    def run(fn):
        """Runs fn."""
        fn()

    wrapped = explained("exitsafe.example", "exitsafe.example(fn)")(run)

    def fail():
        raise raised

    with pytest.raises(TypeError) as info:
        wrapped(fail)
    assert info.value is raised and str(info.value) == "the program's own error"
    assert inspect.signature(wrapped) == inspect.signature(run)
    assert wrapped.__doc__ == "Runs fn." and wrapped.__name__ == "run"
    with pytest.raises(TypeError, match=r"exitsafe\.example\(\): missing the argument fn"):
        wrapped()

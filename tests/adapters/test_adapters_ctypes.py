"""exitsafe.ctypes in-process: track, pin (CDLL and raw dlopen handles), callback."""

from __future__ import annotations

import _ctypes
import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import exitsafe
from exitsafe import AlreadyTrackedError, HandleClosedError
from exitsafe import ctypes as es_ctypes
from exitsafe.lowlevel import CORE

from ..support import is_mapped
from .toy import (
    PinReleasedInACollection,
    collection_inside_a_c_call,
    needs_proc_maps,
    python_frames_of_adapter_track,
    remembers_no_pin_until_one_is_made,
)

#: whether the compiled core runs (its fast paths are tested only then)
COMPILED = CORE == "compiled"

vp = ctypes.c_void_p


@pytest.fixture(params=["compiled", "python"])
def track(request: pytest.FixtureRequest) -> Any:
    """`exitsafe.ctypes.track` as users call it (compiled when the core is), or the Python
    function the compiled one hands its other cases to: a test taking it runs on both paths."""
    if request.param == "python":
        return getattr(es_ctypes, "_track_py", es_ctypes.track)  # (the compiled core's)
    return es_ctypes.track


def test_track_c_void_p_int_and_pointer(ctoy, reg):
    before = ctoy.toy_live()
    h1 = es_ctypes.track(vp(ctoy.toy_ctx_new()), ctoy.toy_ctx_free, registry=reg)
    h2 = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)  # an int address

    class Opaque(ctypes.Structure):
        pass

    h3 = es_ctypes.track(
        ctypes.cast(ctoy.toy_ctx_new(), ctypes.POINTER(Opaque)), ctoy.toy_ctx_free, registry=reg
    )
    assert ctoy.toy_live() == before + 3
    assert isinstance(h2.raw, int) and isinstance(h1.raw, vp)
    for h in (h1, h2, h3):
        h.release()
        h.release()  # idempotent
    assert ctoy.toy_live() == before
    with pytest.raises(HandleClosedError):
        _ = h1.raw


def test_int_address_reaches_a_release_without_argtypes_untruncated(toy_so, reg):
    lib = ctypes.CDLL(toy_so)  # no argtypes declared at all
    lib.toy_ctx_new.restype = vp
    before = lib.toy_live()
    address = lib.toy_ctx_new()
    assert address > 2**32 or True  # on most 64-bit systems heap addresses exceed 32 bits
    h = es_ctypes.track(address, lib.toy_ctx_free, registry=reg)
    h.release()  # toy would abort on a truncated pointer ("not a live context")
    assert lib.toy_live() == before


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: 0, ValueError, "NULL"),
        (lambda: vp(None), ValueError, "NULL"),
        (lambda: ctypes.POINTER(ctypes.c_int)(), ValueError, "NULL"),
        (lambda: -5, ValueError, "negative"),
        # beyond a pointer: ctypes would pass it truncated (a second key for one object)
        (lambda: 2 ** (8 * ctypes.sizeof(vp)) + 0x1000, ValueError, "beyond"),
        (lambda: True, TypeError, "bool"),
        (lambda: ctypes.c_int(3), TypeError, "not a pointer type"),
        (lambda: (ctypes.c_int * 2)(), TypeError, "belongs"),
        (lambda: ctypes.CFUNCTYPE(None)(lambda: None), TypeError, "callback"),
        (lambda: "0x1234", TypeError, "int address"),
    ],
)
def test_track_rejects_what_it_cannot_own(ctoy, reg, make, error, words):
    with pytest.raises(error, match=words):
        es_ctypes.track(make(), ctoy.toy_ctx_free, registry=reg)
    assert len(reg) == 0


def test_same_address_cannot_be_tracked_twice_and_handle_of_finds_it(ctoy, reg):
    address = ctoy.toy_ctx_new()
    h = es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg)
    with pytest.raises(AlreadyTrackedError):
        es_ctypes.track(vp(address), ctoy.toy_ctx_free, registry=reg)
    assert es_ctypes.handle_of(vp(address), registry=reg) is h
    assert es_ctypes.handle_of(address, registry=reg) is h
    obj = es_ctypes.track(
        ctoy.toy_obj_new(address), ctoy.toy_obj_free, registry=reg, depends_on=[address]
    )
    assert obj.depends_on == (h,)
    h.release()
    assert h.state == "live"  # deferred behind obj
    obj.release()
    assert h.state == "released"
    assert es_ctypes.handle_of(address, registry=reg) is None


def test_teardown_releases_children_first(ctoy, reg):
    order = []
    ctx = es_ctypes.track(
        ctoy.toy_ctx_new(), lambda p: (order.append("ctx"), ctoy.toy_ctx_free(p)), registry=reg
    )
    objs = [
        es_ctypes.track(
            ctoy.toy_obj_new(ctx.raw),
            lambda p: (order.append("obj"), ctoy.toy_obj_free(p)),
            registry=reg,
            depends_on=[ctx],
        )
        for _ in range(2)
    ]
    reg.teardown()
    assert order == ["obj", "obj", "ctx"]
    assert all(o.state == "released" for o in objs)


# ---------------------------------------------------------------------- pin


@needs_proc_maps
def test_pin_cdll_is_found_from_the_release_function_and_survives_early_dlclose(toy_copy, reg):
    lib = ctypes.CDLL(toy_copy)
    lib.toy_ctx_new.restype = vp
    lib.toy_ctx_free.argtypes = (vp,)
    # close=False: the binding keeps the right to close its CDLL; the pin only holds
    # its own loader reference, for the life of the process.
    pin = es_ctypes.pin(lib, registry=reg, close=False)
    assert pin.kind == "library" and es_ctypes.pinned(lib, registry=reg) is pin
    h = es_ctypes.track(lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    assert h.depends_on == (pin,)
    _ctypes.dlclose(lib._handle)  # the binding closes its library early
    assert is_mapped(toy_copy)
    h.release()  # safe: the pin holds its own loader reference
    pin.release()
    assert is_mapped(toy_copy)


@needs_proc_maps
def test_pin_a_raw_dlopen_handle(toy_copy, reg):
    handle = _ctypes.dlopen(toy_copy, os.RTLD_NOW)
    lib = ctypes.CDLL(toy_copy, handle=handle)
    lib.toy_ctx_new.restype = vp
    lib.toy_ctx_free.argtypes = (vp,)
    pin = es_ctypes.pin(handle, registry=reg, name="raw toy")
    assert es_ctypes.pinned(handle, registry=reg) is pin
    h = es_ctypes.track(lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg, lib=handle)
    assert h.depends_on == (pin,)
    pin.release()
    assert pin.state == "live" and is_mapped(toy_copy)
    h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)


@needs_proc_maps
def test_pin_close_false_keeps_the_library_for_ever(toy_copy, reg):
    lib = ctypes.CDLL(toy_copy)
    pin = es_ctypes.pin(lib, registry=reg, close=False)
    assert es_ctypes.pin(lib, registry=reg, close=False) is pin and pin.owners == 2
    with pytest.raises(ValueError, match="close=False"):
        es_ctypes.pin(lib, registry=reg, close=True)
    reg.teardown()
    _ctypes.dlclose(lib._handle)
    assert is_mapped(toy_copy)


@pytest.mark.parametrize("bad", [None, True, "libtoy.so", object()])
def test_pin_rejects_non_libraries(bad, reg):
    with pytest.raises(TypeError):
        es_ctypes.pin(bad, registry=reg)


def test_pin_rejects_an_int_that_is_no_library_handle_without_crashing():
    # The loader's dlinfo / dlclose crash on what is not a handle: checked first (in a
    # child process, which a crash would kill instead of the test run).
    program = textwrap.dedent(
        """
        import ctypes, exitsafe, exitsafe.ctypes as es
        reg = exitsafe.Registry("bogus")
        for bogus in (-1, 0, 1, 4096, 2 ** 70, id(reg)):
            try:
                es.pin(bogus, registry=reg)
            except ValueError as exc:
                print("refused:", exc)
        lib = ctypes.CDLL("libm.so.6")
        print("pinned:", es.pin(lib._handle, registry=reg).kind)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    not_a_handle, not_loaded = "which is not a library handle", "not the handle of a loaded"
    expected = [not_a_handle, not_a_handle, not_loaded, not_loaded, not_a_handle, not_loaded]
    lines = out.stdout.splitlines()
    assert len(lines) == 7 and lines[-1] == "pinned: library", out.stdout
    assert all(words in line for words, line in zip(expected, lines)), out.stdout


# ---------------------------------------------------------------------- callbacks

INT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def test_callback_guarded_and_kept_alive(ctoy):
    registry = exitsafe.Registry("ctypes-cb")
    ctoy.toy_call.argtypes = (INT_FN, ctypes.c_int)
    calls = []
    cb = es_ctypes.callback(INT_FN, lambda x: calls.append(x) or x + 1, registry=registry)
    import weakref

    ref = weakref.ref(cb)
    del cb
    gc.collect()
    cb = ref()
    assert cb is not None and ctoy.toy_call(cb.raw, 1) == 2
    raw = cb.raw
    registry.teardown()
    assert cb.state == "leaked"
    kept = weakref.ref(raw)
    del cb, raw
    gc.collect()
    raw = kept()
    assert raw is not None, "exitsafe keeps a leaked callback alive"
    assert ctoy.toy_call(raw, 5) == 0 and calls == [1]


def test_callback_onerror_and_default(ctoy, reg):
    ctoy.toy_call.argtypes = (INT_FN, ctypes.c_int)
    seen = []
    cb = es_ctypes.callback(
        INT_FN,
        lambda x: 1 // x,
        default=-1,
        onerror=lambda t, e, tb: seen.append(t),
        registry=reg,
    )
    assert ctoy.toy_call(cb.raw, 0) == -1 and seen == [ZeroDivisionError]
    cb2 = es_ctypes.callback(INT_FN, lambda x: 1 // x, onerror=lambda *a: 9, registry=reg)
    assert ctoy.toy_call(cb2.raw, 0) == 9
    cb.release()
    cb2.release()
    assert cb.state == cb2.state == "released"


def test_callback_void_logger_and_retire(ctoy, reg):
    ctoy.toy_set_logger.argtypes = (LOG_FN,)
    ctoy.toy_log.argtypes = (ctypes.c_char_p,)
    got = []
    cb = es_ctypes.callback(LOG_FN, got.append, registry=reg)
    ctoy.toy_set_logger(cb.raw)
    ctoy.toy_log(b"hello")
    ctoy.toy_set_logger(LOG_FN())  # unregister (NULL) first, then retire
    cb.release()
    assert got == [b"hello"] and cb.state == "released"


def test_callback_rejects_bad_arguments(reg):
    with pytest.raises(TypeError, match="CFUNCTYPE"):
        es_ctypes.callback(ctypes.c_int, lambda: 0, registry=reg)
    with pytest.raises(TypeError, match="callable"):
        es_ctypes.callback(INT_FN, None, registry=reg)


# ----------------------------------------------------- the compiled track (and its rules)


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
def test_the_compiled_track_stands_for_the_python_function():
    import inspect

    track = es_ctypes.track
    assert (track.__name__, track.__module__) == ("track", "exitsafe.ctypes")
    assert "The ctypes counterpart of `ffi.gc`" in (track.__doc__ or "")
    params = list(inspect.signature(track).parameters)
    assert params == [
        "ptr", "release", "registry", "lib", "kind", "depends_on", "exit_policy", "name",
        "timeout", "affinity",
    ]


class Opaque(ctypes.Structure):
    pass


class ContextPointer(vp):
    """A binding's own pointer type, as many ctypes bindings declare them."""


@pytest.mark.parametrize(
    "form",
    [int, vp, ContextPointer, lambda a: ctypes.cast(a, ctypes.POINTER(Opaque))],
    ids=["int", "c_void_p", "c_void_p-subclass", "POINTER"],
)
def test_track_keeps_every_rule_for_each_pointer_form(ctoy, reg, form):
    # The same rules whichever path runs (the compiled core reads these forms in C): the
    # raw object, one owner per address whatever form names it, handle_of, the kind,
    # the registry, the address free again after the release.
    before = ctoy.toy_live()
    address = ctoy.toy_ctx_new()
    ptr = form(address)
    h = es_ctypes.track(ptr, ctoy.toy_ctx_free, registry=reg, kind="ctx")
    assert (h.kind, h.registry, h.raw) == ("ctx", reg, ptr)
    assert es_ctypes.handle_of(address, registry=reg) is h
    for other in (address, vp(address), ContextPointer(address)):
        with pytest.raises(AlreadyTrackedError) as info:
            es_ctypes.track(other, ctoy.toy_ctx_free, registry=reg)
        assert info.value.handle is h
    h.release()
    assert h.state == "released" and ctoy.toy_live() == before
    assert es_ctypes.handle_of(address, registry=reg) is None


def test_track_checks_release_and_registry_and_uses_the_default_registry(ctoy, reg):
    address = ctoy.toy_ctx_new()
    with pytest.raises(TypeError, match="release must be callable"):
        es_ctypes.track(address, 42, registry=reg)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="registry must be"):
        es_ctypes.track(address, ctoy.toy_ctx_free, registry="default")  # type: ignore[arg-type]
    h = es_ctypes.track(address, ctoy.toy_ctx_free)  # the refused calls claimed nothing
    assert h.registry is exitsafe.lowlevel.default_registry()
    h.release()


def test_a_registry_subclass_overriding_track_is_called(ctoy):
    calls: list[str] = []

    class Audited(exitsafe.Registry):
        def track(self, raw, release, **options):  # type: ignore[no-untyped-def, override]
            calls.append(options.get("kind", "handle"))
            return super().track(raw, release, **options)

    audited = Audited("audited")
    try:
        es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=audited).release()
    finally:
        audited.teardown()
    assert calls == ["handle"]


def test_call_ends_every_borrow_when_a_release_it_let_run_fails(reg):
    # b's release, asked for during the call, runs as b's borrow ends, and fails: a's
    # borrow must end all the same (it stayed open until the call's frame died, a review
    # finding: while pytest kept the traceback, a's release was deferred for good).
    released: list[str] = []

    def fail(raw: object) -> None:
        raise OSError("device lost")

    a = reg.track("a", released.append, name="a")
    b = reg.track("b", fail, name="b")
    with pytest.raises(OSError, match="device lost") as caught:  # (kept, with its frames)
        es_ctypes.call(lambda x, y: b.release(), a, b)
    a.release()
    assert released == ["a"]
    del caught


def test_a_ctypes_release_that_raises_leaves_the_address_free(ctoy, reg):
    address = ctoy.toy_ctx_new()

    def failing(ptr):
        ctoy.toy_ctx_free(ptr)
        raise RuntimeError("driver error")

    h = es_ctypes.track(vp(address), failing, registry=reg)
    with pytest.raises(RuntimeError, match="driver error"):
        h.release()
    assert es_ctypes.handle_of(address, registry=reg) is None
    assert [e.outcome for e in reg.ledger()][-1] == "release_failed"


def test_a_ctypes_pointer_tracked_in_a_closed_registry_is_not_owned(ctoy, reg):
    closed = exitsafe.Registry("adapters-closed")
    closed.teardown()
    address = ctoy.toy_ctx_new()
    late = es_ctypes.track(address, ctoy.toy_ctx_free, registry=closed)
    assert late.state == "leaked"
    h = es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg)  # not bound to the leaked one
    assert es_ctypes.handle_of(address, registry=reg) is h
    h.release()


def test_garbage_collected_ctypes_handle_releases_once(ctoy, reg):
    before = ctoy.toy_live()
    h = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    del h
    gc.collect()
    assert ctoy.toy_live() == before
    assert [e.outcome for e in reg.ledger()] == ["released"]


def test_an_int_subclass_address_is_keyed_as_a_plain_int(ctoy, reg):
    class Address(int):
        def __hash__(self) -> int:  # a hash of its own: one address must still be one key
            return id(self)

    address = ctoy.toy_ctx_new()
    h = es_ctypes.track(Address(address), ctoy.toy_ctx_free, registry=reg)
    with pytest.raises(AlreadyTrackedError):
        es_ctypes.track(Address(address), ctoy.toy_ctx_free, registry=reg)
    assert es_ctypes.handle_of(Address(address), registry=reg) is h
    assert es_ctypes.handle_of(address, registry=reg) is h
    h.release()


def test_a_stand_in_for_a_foreign_function_without_argtypes_gets_a_pointer(reg):
    # isinstance() believes a __class__ attribute (unittest.mock's spec=): such a release
    # is wrapped as a foreign function without argtypes is, whichever path runs
    from unittest import mock

    free = ctypes.CDLL(None).free
    release = mock.Mock(spec=free)
    release.argtypes = None
    es_ctypes.track(0x1234, release, registry=reg).release()
    (arg,), _ = release.call_args
    assert isinstance(arg, vp) and arg.value == 0x1234


@pytest.mark.skipif(sys.version_info < (3, 12), reason="__buffer__ in Python is new in 3.12")
def test_a_pointer_subclass_with_its_own_buffer_is_read_as_the_python_path_reads_it(reg):
    class ReadOnly(vp):
        def __buffer__(self, flags):  # type: ignore[no-untyped-def]
            return memoryview((0x1234).to_bytes(ctypes.sizeof(vp), sys.byteorder))

    # c_void_p.from_buffer refuses a read-only buffer: so must the compiled path
    with pytest.raises(TypeError, match="not writable"):
        es_ctypes.track(ReadOnly(0x5678), lambda raw: None, registry=reg)
    assert len(reg) == 0


def test_track_inside_a_section_of_this_thread_is_refused_not_deadlocked(ctoy, reg):
    # What a finalizer calling track() sees when the collector ran it inside one of
    # exitsafe's sections on this thread: the compiled path hands it to the Python path,
    # which refuses it instead of waiting for itself.
    from exitsafe import _sync
    from exitsafe.lowlevel import ReentrancyError

    address = ctoy.toy_ctx_new()
    with _sync.LOCK:  # (a section of this thread)
        with pytest.raises(ReentrancyError, match="track"):
            es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg)
    es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg).release()  # nothing was claimed


# ------------------------------------------ pinned libraries on the compiled track's path


def _toy_cdll(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.toy_ctx_new.restype = vp
    lib.toy_ctx_free.argtypes = (vp,)
    return lib


@needs_proc_maps
def test_a_pinned_librarys_function_keeps_its_pin_on_every_track(toy_copy, reg):
    # The first track of a foreign function finds the pin of the library it was loaded
    # from; every later one depends on that pin too (the compiled core remembers it), until
    # the pin ends; a Python release function never depends on a pin.
    lib = _toy_cdll(toy_copy)
    pin = es_ctypes.pin(lib, registry=reg)
    handles = [es_ctypes.track(lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)]
    handles += [
        es_ctypes.track(form(lib.toy_ctx_new()), lib.toy_ctx_free, registry=reg, kind="ctx")
        for form in (int, vp, lambda a: ctypes.cast(a, ctypes.POINTER(Opaque)))
    ]
    assert {h.depends_on for h in handles} == {(pin,)}
    plain = es_ctypes.track(lib.toy_ctx_new(), lambda p: lib.toy_ctx_free(p), registry=reg)
    assert plain.depends_on == ()
    plain.release()
    pin.release()  # waits for its dependents: the library stays mapped
    assert pin.state == "live" and is_mapped(toy_copy)
    for h in handles:
        h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
def test_with_a_pin_the_second_track_of_a_function_takes_the_compiled_path(ctoy, reg):
    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    handles: list[exitsafe.Handle] = []

    def track() -> None:
        handles.append(es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg))

    assert python_frames_of_adapter_track(track) == 1  # finds the pin
    assert python_frames_of_adapter_track(track) == 0  # remembers it
    # a function of an unpinned library, or given with lib=: the Python path each time
    assert python_frames_of_adapter_track(
        lambda: handles.append(
            es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg, lib=ctoy)
        )
    ) == 1
    assert [h.depends_on for h in handles] == [(pin,)] * 3
    for h in handles:
        h.release()
    pin.release()


def test_a_remembered_ctypes_pin_serves_its_own_registry_only_and_not_once_ended(ctoy, reg):
    other = exitsafe.Registry("adapters-other")
    try:
        pin = es_ctypes.pin(ctoy, registry=reg, close=False)
        es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg).release()
        elsewhere = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=other)
        assert elsewhere.depends_on == ()  # no pin in that registry
        elsewhere.release()
        other_pin = es_ctypes.pin(ctoy, registry=other, close=False)
        h = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=other)
        assert h.depends_on == (other_pin,)
        h.release()
        pin.release()
        assert pin.state == "released"
        h = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
        assert h.depends_on == ()  # its pin ended: nothing to depend on
        h.release()
        again = es_ctypes.pin(ctoy, registry=reg, close=False)  # a new pin: found again
        h = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
        assert h.depends_on == (again,)
        h.release()
    finally:
        other.teardown()


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)  # the program and what it links: malloc and free of libc
    libc.malloc.restype, libc.malloc.argtypes = vp, (ctypes.c_size_t,)
    libc.free.argtypes = (vp,)
    return libc


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
def test_a_function_of_an_unpinned_library_takes_the_compiled_path_too(ctoy, reg):
    # While one library is pinned, a foreign function of another one, unpinned, is looked
    # up once: the compiled track remembers that it has no pin, until a pin is made.
    libc = _libc()
    toy_pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    handles: list[exitsafe.Handle] = []

    def track() -> None:
        handles.append(es_ctypes.track(libc.malloc(16), libc.free, registry=reg))

    libc_pin = remembers_no_pin_until_one_is_made(
        track, handles, lambda: es_ctypes.pin(libc, registry=reg, close=False)
    )
    for h in handles:
        h.release()
    libc_pin.release()
    toy_pin.release()


def test_no_pin_in_one_registry_is_not_remembered_for_another(ctoy, reg, track):
    other = exitsafe.Registry("adapters-other")
    try:
        other_pin = es_ctypes.pin(ctoy, registry=other, close=False)
        here = [track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg) for _ in range(2)]
        there = [track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=other) for _ in range(2)]
        assert [h.depends_on for h in here] == [(), ()]  # no pin in reg
        assert [h.depends_on for h in there] == [(other_pin,), (other_pin,)]
        for h in (*here, *there):
            h.release()
        other_pin.release()
    finally:
        other.teardown()


def test_a_pin_made_during_a_track_is_found_by_the_next_one(ctoy, reg, monkeypatch):
    # The pin is made after the track looked for it and before it remembered what it found
    # (nothing): that track depends on no pin, but the next one must find it, on the
    # compiled path too (the track remembers only what it found since the last pin change).
    made: list[exitsafe.Handle] = []
    looked_up = type(es_ctypes._ADAPTER).pin_for_release

    def pin_meanwhile(self, release, ctx, registry):  # type: ignore[no-untyped-def]
        found = looked_up(self, release, ctx, registry)
        if not made:
            made.append(es_ctypes.pin(ctoy, registry=reg, close=False))
        return found

    libc_pin = es_ctypes.pin(_libc(), registry=reg, close=False)  # a pin: the table is used
    # (patched on the class: monkeypatch.undo() would leave a bound method on the instance)
    monkeypatch.setattr(type(es_ctypes._ADAPTER), "pin_for_release", pin_meanwhile)
    first = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    monkeypatch.undo()
    second = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    assert (first.depends_on, second.depends_on) == ((), tuple(made))
    for h in (first, second, *made, libc_pin):
        h.release()


def test_a_ctypes_pin_ending_late_keeps_the_newer_pin_of_its_library(ctoy, reg, track):
    old = es_ctypes.pin(ctoy, registry=reg, close=False)
    first = track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    old.release()  # waits for first
    new = es_ctypes.pin(ctoy, registry=reg, close=False)
    assert new is not old
    first.release()
    assert old.state == "released" and new.state == "live"
    later = [track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg) for _ in range(2)]
    assert [h.depends_on for h in later] == [(new,), (new,)]
    assert es_ctypes.pinned(ctoy, registry=reg) is new
    for h in later:
        h.release()
    new.release()


def test_a_released_pin_waiting_for_its_dependents_takes_no_new_one(ctoy, reg, track):
    # pin.release() with a handle still depending on it: the pin stays live, with no owner,
    # until that handle ends; a new track of the library's function then depends on nothing
    # (as handle_of / pinned say), on either path, whatever the compiled core remembered.
    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    first = track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    assert first.depends_on == (pin,)
    pin.release()
    assert (pin.state, pin.owners) == ("live", 0)
    assert es_ctypes.pinned(ctoy, registry=reg) is None
    later = [track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg) for _ in range(2)]
    assert [h.depends_on for h in later] == [(), ()]
    for h in (first, *later):
        h.release()
    assert pin.state == "released"


@needs_proc_maps
def test_pinning_a_pinned_library_again_takes_no_extra_loader_reference(toy_copy, reg):
    # A second pin() returns the first pin (retained); a refused one (other close=, a bad
    # name) pins nothing: none of them may leave the library loaded for ever.
    lib = _toy_cdll(toy_copy)
    pin = es_ctypes.pin(lib, registry=reg, close=True)
    assert es_ctypes.pin(lib, registry=reg, close=True) is pin
    with pytest.raises(ValueError, match="already pinned"):
        es_ctypes.pin(lib, registry=reg, close=False)
    pin.release()
    assert pin.state == "live"  # the second owner
    pin.release()
    assert pin.state == "released" and not is_mapped(toy_copy)

    lib = _toy_cdll(toy_copy)
    with pytest.raises(TypeError, match="name"):
        es_ctypes.pin(lib, registry=reg, name=42)  # type: ignore[arg-type]
    _ctypes.dlclose(lib._handle)
    assert not is_mapped(toy_copy)


@needs_proc_maps
def test_a_library_pinned_by_its_raw_handle_is_found_from_its_functions(
    toy_copy, reg, track
):
    lib = _toy_cdll(toy_copy)
    pin = es_ctypes.pin(lib._handle, registry=reg, name="raw toy")
    assert es_ctypes.pinned(lib, registry=reg) is pin  # the CDLL's own handle is pinned
    handles = [track(lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg) for _ in range(3)]
    assert [h.depends_on for h in handles] == [(pin,)] * 3
    pin.release()
    assert pin.state == "live" and is_mapped(toy_copy)
    for h in handles:
        h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)


@needs_proc_maps
@pytest.mark.parametrize("pinned_as", ["cdll", "raw handle"])
def test_a_function_pointer_made_from_an_address_finds_the_pin_of_its_library(
    toy_copy, reg, track, pinned_as
):
    # A binding that reads its release function's address from a table (or builds it with
    # PROTO(address)) holds a foreign function ctypes loaded from no library: the loader
    # says which library its code is in, and the handle depends on that library's pin.
    lib = _toy_cdll(toy_copy)
    free = ctypes.CFUNCTYPE(None, vp)(ctypes.cast(lib.toy_ctx_free, vp).value)
    assert not free._objects  # (no CDLL to find it by)
    pin = es_ctypes.pin(lib if pinned_as == "cdll" else lib._handle, registry=reg)
    handles = [track(lib.toy_ctx_new(), free, registry=reg) for _ in range(3)]
    assert [h.depends_on for h in handles] == [(pin,)] * 3
    # a function pointer into another library, or a CFUNCTYPE of a Python function
    # (libffi's trampoline), depends on no pin
    libc = ctypes.CDLL(None)
    libc.malloc.restype = vp
    libc_free = ctypes.CFUNCTYPE(None, vp)(ctypes.cast(libc.free, vp).value)
    other = track(libc.malloc(16), libc_free, registry=reg)
    python_free = ctypes.CFUNCTYPE(None, vp)(lambda p, free=lib.toy_ctx_free: free(p))
    plain = track(lib.toy_ctx_new(), python_free, registry=reg)
    assert other.depends_on == () and plain.depends_on == ()
    other.release()
    plain.release()
    del lib, free
    pin.release()  # waits for its dependents: the library stays mapped
    assert pin.state == "live" and is_mapped(toy_copy)
    for h in handles:
        h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)


def test_a_pin_ending_between_its_lookup_and_the_registration_is_not_an_error(
    ctoy, reg, monkeypatch
):
    # Another thread releases the library's last pin owner just after track() found the pin
    # (forced here: the lookup itself lets go of it): the handle is made as by a track just
    # after that release, depending on no pin, instead of raising HandleClosedError.
    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    first = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    found = type(es_ctypes._ADAPTER).pin_for_release

    def found_then_released(self, release, ctx, registry):  # type: ignore[no-untyped-def]
        pin_found = found(self, release, ctx, registry)
        assert pin_found is pin
        pin.release()  # the other thread's
        return pin_found

    monkeypatch.setattr(type(es_ctypes._ADAPTER), "pin_for_release", found_then_released)
    python_track = getattr(es_ctypes, "_track_py", es_ctypes.track)
    address = ctoy.toy_ctx_new()
    h = python_track(address, ctoy.toy_ctx_free, registry=reg)
    assert h.depends_on == () and es_ctypes.handle_of(address, registry=reg) is h
    for handle in (first, h):
        handle.release()
    assert pin.state == "released"


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
@collection_inside_a_c_call
def test_a_pin_ending_inside_the_compiled_track_is_not_an_error(ctoy, reg):
    # The compiled track checked the remembered pin (owned), then a garbage collection
    # inside the call (forced: threshold 1, a gc callback) releases the pin's last owner
    # before the registration: the registration fails in C, and the Python path decides
    # again: a handle depending on no pin (this raised HandleClosedError).
    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    first = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)
    address = ctoy.toy_ctx_new()
    with PinReleasedInACollection(pin, address) as collection:
        h = es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg)
    assert pin.owners == 0
    assert collection.window  # the pin ended after the C check, before the registration
    assert h.depends_on == () and es_ctypes.handle_of(address, registry=reg) is h
    for handle in (first, h):
        handle.release()
    assert pin.state == "released"


def test_an_error_after_the_registration_is_raised_once_and_owns_nothing(ctoy, reg):
    # Queued work runs right after a registration (here: the pin's last owner letting go,
    # then a failing release whose error log a strict logging filter turns into an
    # exception). The error reaches the caller of track() on either path; the compiled
    # path must not take it for a refused dependency and register the pointer again.
    import logging

    from exitsafe import _sync

    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    first = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg)

    class Strict(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            raise RuntimeError("logged: " + record.getMessage())

    def failing_release() -> None:
        raise OSError("a release requested by a finalizer failed")

    strict = Strict()
    logger = logging.getLogger("exitsafe")
    address = ctoy.toy_ctx_new()
    logger.addFilter(strict)
    try:
        _sync.defer(pin.release)
        _sync.defer(failing_release)
        with pytest.raises(RuntimeError, match="logged"):
            es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg)
    finally:
        logger.removeFilter(strict)
    assert pin.owners == 0
    assert es_ctypes.handle_of(address, registry=reg) is None  # not registered again
    first.release()
    assert pin.state == "released"


@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pinned"])
def test_track_interrupted_after_its_registration_frees_nothing(ctoy, reg, track, pinned):
    # A KeyboardInterrupt in queued work that runs inside track(), after the registration:
    # track() raises it, and the object stays the caller's on either path (the compiled
    # one used to drop the registered handle, which freed the object: a double free for a
    # caller freeing what track() did not take).
    from exitsafe import _sync

    pin = es_ctypes.pin(ctoy, registry=reg, close=False) if pinned else None
    track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg).release()  # warm

    def interrupted() -> None:
        raise KeyboardInterrupt

    address = ctoy.toy_ctx_new()
    live = ctoy.toy_live()
    _sync.defer(interrupted)
    with pytest.raises(KeyboardInterrupt):
        track(address, ctoy.toy_ctx_free, registry=reg)
    gc.collect()
    assert ctoy.toy_live() == live  # not freed
    assert es_ctypes.handle_of(address, registry=reg) is None
    h = track(address, ctoy.toy_ctx_free, registry=reg)  # the caller may track it again
    h.release()
    assert ctoy.toy_live() == live - 1
    if pin is not None:
        pin.release()


@needs_proc_maps
def test_pinning_a_cdll_whose_raw_handle_is_pinned_shares_that_pin(toy_copy, reg):
    lib = _toy_cdll(toy_copy)
    other = _toy_cdll(toy_copy)  # another user of the library, with its own loader reference
    raw = es_ctypes.pin(lib._handle, registry=reg)  # close=True: closes lib's handle
    assert es_ctypes.pin(lib, registry=reg) is raw and raw.owners == 2
    with pytest.raises(ValueError, match="already pinned"):
        es_ctypes.pin(lib, registry=reg, close=False)
    raw.release()
    raw.release()
    assert raw.state == "released"
    assert is_mapped(toy_copy)  # closed once: `other`'s reference keeps it loaded
    assert other.toy_live() >= 0


@needs_proc_maps
def test_pinning_the_raw_handle_of_a_pinned_cdll_shares_that_pin(toy_copy, reg):
    # The other order: the CDLL first, then the handle it holds.  Two pins closed the same
    # handle twice, unmapping the library under `other`.
    lib = _toy_cdll(toy_copy)
    other = _toy_cdll(toy_copy)
    pin = es_ctypes.pin(lib, registry=reg)
    assert es_ctypes.pin(lib._handle, registry=reg) is pin and pin.owners == 2
    assert es_ctypes.pinned(lib._handle, registry=reg) is pin
    pin.release()
    pin.release()
    assert pin.state == "released"
    assert is_mapped(toy_copy)  # closed once
    assert other.toy_live() >= 0


@needs_proc_maps
@pytest.mark.parametrize("second", ["raw handle", "equal int"])
def test_one_library_reference_pinned_in_two_registries_is_closed_once(toy_copy, second):
    # A CDLL in one registry and its raw handle in another (or the handle as two equal int
    # objects): both pins stand for the CDLL's one loader reference; the last to end closes
    # it, once (each pin closed it: the library was unmapped under `other`).
    lib = _toy_cdll(toy_copy)
    other = _toy_cdll(toy_copy)
    one, two = exitsafe.Registry("pins-one"), exitsafe.Registry("pins-two")
    try:
        first = lib if second == "raw handle" else lib._handle
        pins = [
            es_ctypes.pin(first, registry=one),
            es_ctypes.pin(int(str(lib._handle)), registry=two),
        ]
        assert pins[0] is not pins[1]
        for pin in pins:
            pin.release()
        assert [pin.state for pin in pins] == ["released", "released"]
        assert is_mapped(toy_copy)  # closed once: `other`'s reference keeps it loaded
        assert other.toy_live() >= 0
        _ctypes.dlclose(other._handle)
        assert not is_mapped(toy_copy)  # and closed: the pins leaked no reference
    finally:
        one.teardown()
        two.teardown()


@needs_proc_maps
def test_two_threads_pinning_one_library_at_once_get_one_pin(toy_copy, reg, monkeypatch):
    # Forced: while this thread is between its lookup of the library's pin and its
    # registration, another thread pins the same library.  The first pin stays the pin;
    # this one is undone (recorded detached, it never closes) and the caller gets the
    # first pin with one more owner.  The library is closed once, when that pin ends.
    lib = _toy_cdll(toy_copy)
    other = _toy_cdll(toy_copy)
    adapter_type = type(es_ctypes._ADAPTER)
    describe = adapter_type.describe_library
    elsewhere: list[exitsafe.Handle] = []

    def describe_while_another_thread_pins(self, lib_arg, ctx):  # type: ignore[no-untyped-def]
        if not elsewhere:
            elsewhere.append(None)  # type: ignore[arg-type]
            thread = threading.Thread(
                target=lambda: elsewhere.append(es_ctypes.pin(lib, registry=reg))
            )
            thread.start()
            thread.join()
        return describe(self, lib_arg, ctx)

    monkeypatch.setattr(adapter_type, "describe_library", describe_while_another_thread_pins)
    mine = es_ctypes.pin(lib, registry=reg)
    monkeypatch.undo()
    theirs = elsewhere[1]
    assert mine is theirs and mine.owners == 2
    assert [e.outcome for e in reg.ledger()] == ["detached"]  # the undone pin
    mine.release()
    mine.release()
    assert mine.state == "released"
    assert is_mapped(toy_copy)  # closed once
    _ctypes.dlclose(other._handle)
    assert not is_mapped(toy_copy)


def test_track_lib_must_be_a_library_and_an_unpinned_one_keeps_the_release_pin(ctoy, reg):
    # lib= names the library of release; when that one is not pinned, the pin of the
    # library release actually comes from still counts (it was dropped).
    pin = es_ctypes.pin(ctoy, registry=reg, close=False)
    unpinned = ctypes.CDLL(None)
    h = es_ctypes.track(ctoy.toy_ctx_new(), ctoy.toy_ctx_free, registry=reg, lib=unpinned)
    assert h.depends_on == (pin,)
    h.release()
    address = ctoy.toy_ctx_new()
    with pytest.raises(TypeError, match="lib must be a library of ctypes or None, got str"):
        es_ctypes.track(address, ctoy.toy_ctx_free, registry=reg, lib="libtoy")
    assert len(reg) == 1  # the pin only
    ctoy.toy_ctx_free(address)  # still the caller's
    pin.release()


@needs_proc_maps
def test_close_false_pins_of_one_library_keep_one_loader_reference(toy_copy):
    # Pinning with close=False and releasing, in a loop, kept one more loader reference
    # (and one more object) each time.  One is kept: after the CDLL's own dlclose, one
    # more dlclose unmaps the library.
    lib = _toy_cdll(toy_copy)
    registry = exitsafe.Registry("pins-close-false")
    try:
        for _ in range(20):
            es_ctypes.pin(lib, registry=registry, close=False).release()
        _ctypes.dlclose(lib._handle)  # the CDLL's own reference
        assert is_mapped(toy_copy)  # kept by exitsafe
        _ctypes.dlclose(lib._handle)  # exitsafe's one (closed here only to count them)
        assert not is_mapped(toy_copy)
    finally:
        registry.teardown()

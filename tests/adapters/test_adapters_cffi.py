"""exitsafe.cffi in-process: track, pin, callback, handle_of (ABI and API mode)."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import weakref
from typing import Any

import pytest

import exitsafe
from exitsafe import AlreadyTrackedError, HandleClosedError
from exitsafe.lowlevel import CORE

from ..support import is_mapped
from .toy import (
    HEADER,
    NATIVE,
    PinReleasedInACollection,
    collection_inside_a_c_call,
    needs_proc_maps,
    remembers_no_pin_until_one_is_made,
)

#: whether the compiled core runs (its fast paths are tested only then)
COMPILED = CORE == "compiled"

cffi = pytest.importorskip("cffi")
es_cffi = pytest.importorskip("exitsafe.cffi")


@pytest.fixture(params=["compiled", "python"])
def track(request: pytest.FixtureRequest) -> Any:
    """`exitsafe.cffi.track` as users call it (compiled when the core is), or the Python
    function the compiled one hands its other cases to: a test taking it runs on both paths."""
    if request.param == "python":
        return getattr(es_cffi, "_track_py", es_cffi.track)  # (the compiled core's)
    return es_cffi.track


def test_importing_exitsafe_does_not_import_the_adapters():
    import subprocess

    code = (
        "import sys, exitsafe; "
        "print(sorted(m for m in ('cffi', 'exitsafe.cffi', 'exitsafe.ctypes', 'ctypes') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_track_returns_a_handle_whose_raw_is_the_cdata(abi, reg):
    ffi, lib = abi
    before = lib.toy_live()
    ctx = lib.toy_ctx_new()
    h = es_cffi.track(ffi, ctx, lib.toy_ctx_free, registry=reg, kind="ctx")
    assert isinstance(h, exitsafe.Handle)
    assert h.raw is ctx and h.kind == "ctx" and h.state == "live"
    # No ffi.gc destructor was attached: the cdata is a plain pointer.
    assert type(h.raw).__name__ == "_CDataBase"
    h.release()
    assert h.state == "released" and lib.toy_live() == before
    h.release()  # idempotent: toy would abort on a double free
    with pytest.raises(HandleClosedError):
        _ = h.raw


def test_children_are_released_before_their_parent(abi, reg):
    ffi, lib = abi
    ctx = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    objs = [
        es_cffi.track(
            ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, registry=reg, depends_on=[ctx]
        )
        for _ in range(3)
    ]
    ctx.release()  # deferred: toy would abort "context freed while its objects are alive"
    assert ctx.state == "live"
    for obj in objs:
        obj.release()
    assert ctx.state == "released"


def test_teardown_releases_in_dependency_order(abi, reg):
    ffi, lib = abi
    order = []

    def rec(fn, label):
        def release(p):
            order.append(label)
            fn(p)

        return release

    ctx = es_cffi.track(ffi, lib.toy_ctx_new(), rec(lib.toy_ctx_free, "ctx"), registry=reg)
    obj = es_cffi.track(
        ffi, lib.toy_obj_new(ctx.raw), rec(lib.toy_obj_free, "obj"), registry=reg, depends_on=ctx
    )
    reg.teardown()
    assert order == ["obj", "ctx"]
    assert obj.state == ctx.state == "released"


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda ffi, lib: ffi.NULL, ValueError, "NULL"),
        (lambda ffi, lib: ffi.cast("toy_obj *", 0), ValueError, "NULL"),
        (lambda ffi, lib: ffi.cast("int", 5), TypeError, "needs a pointer"),
        (lambda ffi, lib: ffi.new("int[2]"), TypeError, "arrays are owned by cffi"),
        (lambda ffi, lib: ffi.new("int *"), TypeError, "ffi.new"),
        (lambda ffi, lib: ffi.from_buffer(bytearray(4)), TypeError, "owned by cffi|from_buffer"),
        (lambda ffi, lib: ffi.gc(lib.toy_ctx_new(), lib.toy_ctx_free), TypeError, "ffi.gc"),
        (lambda ffi, lib: lib.toy_ctx_free, TypeError, "function pointer"),
        (lambda ffi, lib: 1234, TypeError, "cdata pointer"),
    ],
)
@pytest.mark.parametrize("warm", [False, True], ids=["first", "after-valid-pointers"])
def test_track_rejects_what_it_cannot_own(abi, reg, make, error, words, warm):
    ffi, lib = abi
    if warm:
        # Valid pointers of the C types the cases use, tracked first: what the adapter
        # learns from them (their cdata class and C type) must not let a bad one through.
        ctx = lib.toy_ctx_new()
        es_cffi.track(ffi, ffi.cast("void *", ctx), lib.toy_ctx_free, registry=reg).release()
        ctx = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
        obj = es_cffi.track(ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, registry=reg)
        obj.release()
        ctx.release()
    with pytest.raises(error, match=words):
        es_cffi.track(ffi, make(ffi, lib), lib.toy_ctx_free, registry=reg)
    assert len(reg) == 0


def test_track_rejects_a_bad_ffi_and_release(abi, reg):
    ffi, lib = abi
    with pytest.raises(TypeError, match="FFI"):
        es_cffi.track(object(), lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    with pytest.raises(TypeError, match="release must be callable"):
        es_cffi.track(ffi, lib.toy_ctx_new(), None, registry=reg)


def test_same_pointer_cannot_be_tracked_twice(abi, reg):
    ffi, lib = abi
    p = lib.toy_ctx_new()
    h = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    with pytest.raises(AlreadyTrackedError) as info:
        es_cffi.track(ffi, ffi.cast("void *", p), lib.toy_ctx_free, registry=reg)
    assert info.value.handle is h
    h.release()
    # Once released, the address may be tracked again (C may reuse it).
    es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)


compiled_only = pytest.mark.skipif(
    not COMPILED, reason="the compiled core is not in use here"
)


@compiled_only
def test_the_compiled_track_stands_for_the_python_function():
    import inspect

    track = es_cffi.track
    assert (track.__name__, track.__module__) == ("track", "exitsafe.cffi")
    assert "Use instead of `ffi.gc(ptr, release)`" in (track.__doc__ or "")
    params = list(inspect.signature(track).parameters)
    assert params == [
        "ffi", "ptr", "release", "registry", "lib", "kind", "depends_on", "exit_policy",
        "name", "timeout", "affinity",
    ]


def _warm(ffi, lib, reg):
    """Track and release one pointer of each C type: the compiled path takes it from then on."""
    ctx = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    es_cffi.track(ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, registry=reg).release()
    ctx.release()


def test_track_after_warm_up_keeps_every_rule(abi, reg):
    # The same rules whichever path runs: one owner per address, the address free again
    # after the release, handle_of, the kind, the registry, and the errors.
    ffi, lib = abi
    _warm(ffi, lib, reg)
    before = lib.toy_live()
    p = lib.toy_ctx_new()
    h = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg, kind="ctx")
    assert (h.kind, h.registry, h.raw) == ("ctx", reg, p)
    assert es_cffi.handle_of(p, registry=reg) is h
    with pytest.raises(AlreadyTrackedError) as info:
        es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    assert info.value.handle is h
    with pytest.raises(TypeError, match="registry must be"):
        es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry="default")
    h.release()
    assert es_cffi.handle_of(p, registry=reg) is None
    assert lib.toy_live() == before + 1  # (the context the refused call made)
    again = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free)  # the default registry
    assert again.registry is exitsafe.lowlevel.default_registry()
    again.release()
    with pytest.raises(ValueError, match="NULL"):
        es_cffi.track(ffi, ffi.cast("toy_ctx *", 0), lib.toy_ctx_free, registry=reg)
    with pytest.raises(TypeError, match="release must be callable"):
        es_cffi.track(ffi, lib.toy_ctx_new(), 42, registry=reg)
    # an FFI of cffi's other backend does not make cdata of this class: refused
    from cffi.backend_ctypes import CTypesBackend

    other = cffi.FFI(backend=CTypesBackend())
    with pytest.raises(TypeError, match="needs a cffi cdata pointer"):
        es_cffi.track(other, ffi.cast("toy_ctx *", 0x1000), lib.toy_ctx_free, registry=reg)


def test_a_release_that_raises_leaves_the_address_free(abi, reg):
    ffi, lib = abi
    _warm(ffi, lib, reg)
    p = lib.toy_ctx_new()

    def failing(ptr):
        lib.toy_ctx_free(ptr)
        raise RuntimeError("driver error")

    h = es_cffi.track(ffi, p, failing, registry=reg)
    with pytest.raises(RuntimeError, match="driver error"):
        h.release()
    assert es_cffi.handle_of(p, registry=reg) is None
    assert [e.outcome for e in reg.ledger()][-1] == "release_failed"


def test_a_pointer_tracked_in_a_closed_registry_is_not_owned(abi, reg):
    ffi, lib = abi
    _warm(ffi, lib, reg)
    closed = exitsafe.Registry("adapters-closed")
    closed.teardown()
    p = lib.toy_ctx_new()
    late = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=closed)
    assert late.state == "leaked"
    # the address was not bound to the leaked handle: another registry may own it
    h = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    assert es_cffi.handle_of(p, registry=reg) is h
    h.release()


def test_handle_of_maps_any_cdata_with_the_address_back(abi, reg):
    ffi, lib = abi
    p = lib.toy_ctx_new()
    h = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    assert es_cffi.handle_of(p, registry=reg) is h
    assert es_cffi.handle_of(ffi.cast("void *", p), registry=reg) is h
    assert es_cffi.handle_of(ffi.cast("char *", p) + 1, registry=reg) is None
    assert es_cffi.handle_of(p) is None  # not in the default registry
    # depends_on accepts the cdata itself
    obj = es_cffi.track(ffi, lib.toy_obj_new(p), lib.toy_obj_free, registry=reg, depends_on=[p])
    assert obj.depends_on == (h,)
    obj.release()
    h.release()
    assert es_cffi.handle_of(p, registry=reg) is None


def test_garbage_collected_handle_releases_once(abi, reg):
    ffi, lib = abi
    before = lib.toy_live()
    es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    gc.collect()
    assert lib.toy_live() == before
    assert [e.outcome for e in reg.ledger()] == ["released"]


def test_track_keeps_ffi_and_lib_alive(toy_so, reg):
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_so)
    h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg, lib=lib)
    import weakref

    ffi_ref, lib_ref = weakref.ref(ffi), weakref.ref(lib)
    del ffi, lib
    gc.collect()
    assert ffi_ref() is not None and lib_ref() is not None
    h.release()


# ---------------------------------------------------------------------- pin


@needs_proc_maps
def test_pin_keeps_the_library_mapped_through_an_early_dlclose(toy_copy, reg):
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg)
    assert pin.kind == "library" and toy_copy in pin.name
    free = lib.toy_ctx_free
    h = es_cffi.track(ffi, lib.toy_ctx_new(), free, registry=reg)
    assert h.depends_on == (pin,)  # found from the release function's address
    ffi.dlclose(lib)  # somebody closes the library early
    assert is_mapped(toy_copy)  # ... but the pin's loader reference keeps the code mapped
    h.release()  # calls into the library: safe
    pin.release()
    assert not is_mapped(toy_copy)


@needs_proc_maps
def test_pin_finds_the_library_when_its_first_symbol_is_a_constant(toy_copy, reg):
    # dir(lib) is sorted: "AAA_..." comes first, and addressof() of an integer constant
    # is its value, not an address; the pin must look further for a real symbol.
    ffi = cffi.FFI()
    ffi.cdef("#define AAA_FIRST_CONSTANT 7\n" + HEADER)
    lib = ffi.dlopen(toy_copy)
    assert dir(lib)[0] == "AAA_FIRST_CONSTANT"
    pin = es_cffi.pin(ffi, lib, registry=reg)
    h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    assert h.depends_on == (pin,)
    ffi.dlclose(lib)
    assert is_mapped(toy_copy), "the pin holds its own loader reference"
    h.release()
    pin.release()
    assert not is_mapped(toy_copy)


@needs_proc_maps
def test_pin_release_waits_for_dependents_then_dlcloses(toy_copy, reg):
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg)
    assert es_cffi.pinned(lib, registry=reg) is pin
    assert es_cffi.handle_of(lib, registry=reg) is pin
    h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg, lib=lib)
    pin.release()
    assert pin.state == "live" and is_mapped(toy_copy)
    h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)
    with pytest.raises(ValueError):
        lib.toy_live()  # cffi: the library was closed


@needs_proc_maps
def test_pin_at_teardown_goes_last_and_close_false_never_unloads(toy_copy, reg):
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
    es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    keep = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    reg.teardown()
    assert [e.kind for e in reg.ledger()][-1] == "library"
    assert pin.state == keep.state == "released"
    del lib
    gc.collect()
    assert is_mapped(toy_copy)


def test_pin_twice_shares_the_pin(abi, reg):
    ffi, lib = abi
    pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
    assert es_cffi.pin(ffi, lib, registry=reg, close=False) is pin
    assert pin.owners == 2
    with pytest.raises(ValueError, match="close=False"):
        es_cffi.pin(ffi, lib, registry=reg, close=True)


def test_a_dropped_pin_stays_pinned(abi, reg):
    ffi, lib = abi
    es_cffi.pin(ffi, lib, registry=reg, close=False)
    gc.collect()
    pin = es_cffi.pinned(lib, registry=reg)
    assert pin is not None and pin.state == "live"


@pytest.mark.parametrize(
    "bad", [None, "libtoy.so", 3, {}, object(), "the ffi", "a ctypes CDLL"]
)
def test_pin_rejects_non_libraries(abi, reg, bad):
    # (what is not a library used to be pinned, and failed only when the pin ended)
    import ctypes

    ffi, _ = abi
    if bad == "the ffi":
        bad = ffi
    elif bad == "a ctypes CDLL":
        bad = ctypes.CDLL(None)
    with pytest.raises(TypeError, match=r"ffi\.dlopen"):
        es_cffi.pin(ffi, bad, registry=reg)
    assert len(reg) == 0


def test_track_lib_must_be_a_library(abi, reg):
    ffi, lib = abi
    p = lib.toy_ctx_new()
    with pytest.raises(TypeError, match="lib must be a library of cffi or None, got str"):
        es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg, lib="libtoy")
    es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg, lib=lib).release()  # still mine


@needs_proc_maps
def test_leaked_pin_never_unloads(toy_copy):
    registry = exitsafe.Registry("leaky", exit_policy="leak")
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=registry)
    ctx = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=registry)
    registry.teardown()
    assert pin.state == ctx.state == "leaked"
    assert all(e.outcome.startswith("leaked_") for e in registry.ledger())
    ffi.dlclose(lib)
    assert is_mapped(toy_copy)


# ---------------------------------------------------------------------- callbacks


def test_callback_calls_fn_until_teardown_then_returns_default(abi):
    ffi, lib = abi
    registry = exitsafe.Registry("cb")
    calls = []
    cb = es_cffi.callback(ffi, "toy_int_fn", lambda x: calls.append(x) or x * 2, registry=registry)
    assert cb.kind == "callback"
    assert lib.toy_call(cb.raw, 21) == 42
    raw = cb.raw
    registry.teardown()
    assert calls == [21]
    # leaked by default at teardown and kept alive: C may still call it
    assert cb.state == "leaked"
    kept = weakref.ref(raw)
    del cb, raw
    gc.collect()
    raw = kept()
    assert raw is not None, "exitsafe keeps a leaked callback alive"
    assert lib.toy_call(raw, 5) == 0  # the int zero, not None (which would not convert)
    assert calls == [21]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_callback_default_and_error_values(abi, reg):
    ffi, lib = abi
    cb = es_cffi.callback(ffi, "int(*)(int)", lambda x: 1 // x, default=-1, registry=reg)
    assert lib.toy_call(cb.raw, 1) == 1
    assert lib.toy_call(cb.raw, 0) == -1  # error value defaults to default
    seen = []
    cb2 = es_cffi.callback(
        ffi,
        ffi.typeof("toy_int_fn"),
        lambda x: 1 // x,
        error=-7,
        onerror=lambda *exc: seen.append(exc[0]),
        registry=reg,
    )
    assert lib.toy_call(cb2.raw, 0) == -7
    assert seen == [ZeroDivisionError]


def test_callback_is_kept_alive_until_retired(abi, reg):
    ffi, lib = abi
    cb = es_cffi.callback(ffi, "toy_int_fn", lambda x: x + 1, registry=reg)
    raw_addr = int(ffi.cast("uintptr_t", cb.raw))
    import weakref

    ref = weakref.ref(cb)
    del cb
    gc.collect()
    cb = ref()
    assert cb is not None and cb.state == "live"
    assert int(ffi.cast("uintptr_t", cb.raw)) == raw_addr
    assert lib.toy_call(cb.raw, 1) == 2
    cb.release()
    assert cb.state == "released"
    del cb
    gc.collect()
    assert ref() is None


def test_callback_rejects_non_function_types(abi, reg):
    ffi, _ = abi
    with pytest.raises(TypeError, match="function pointer type"):
        es_cffi.callback(ffi, "int *", lambda: 0, registry=reg)
    with pytest.raises(TypeError, match="callable"):
        es_cffi.callback(ffi, "toy_int_fn", 3, registry=reg)


def test_callback_takes_a_function_type_as_ffi_callback_does(abi, reg):
    # ffi.callback("int(int)", fn) is accepted by cffi (a function type stands for its
    # pointer type); exitsafe.cffi.callback accepts the same spelling
    ffi, lib = abi
    cb = es_cffi.callback(ffi, "int(int)", lambda x: x * 3, registry=reg)
    assert ffi.typeof(cb.raw) is ffi.typeof("int(*)(int)")
    assert lib.toy_call(cb.raw, 5) == 15
    # a typedef of a function type, too
    own = cffi.FFI()
    own.cdef("typedef int fn_t(int);")
    cb = es_cffi.callback(own, "fn_t", lambda x: x - 1, registry=reg)
    assert own.typeof(cb.raw) is own.typeof("int(*)(int)")
    assert cb.raw(5) == 4


def test_a_function_type_no_spelling_fixes_names_the_pointer_type_to_write():
    from exitsafe._usage import cffi_function_type

    class Refusing:  # an ffi whose parser takes neither pointer spelling
        def typeof(self, ctype):
            raise ValueError(
                f"the type {ctype!r} is a function type, not a pointer-to-function type"
            )

    fix = r"takes the pointer-to-function type, such as 'int\(\*\)\(int\)'"
    with pytest.raises(ValueError, match=fix):
        cffi_function_type(Refusing(), "int(int)")


def test_callback_with_release_policy_is_freed_in_order(abi):
    ffi, lib = abi
    registry = exitsafe.Registry("cb-release")
    cb = es_cffi.callback(
        ffi, "toy_log_fn", lambda msg: None, registry=registry, exit_policy="release"
    )
    ctx = es_cffi.track(
        ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=registry, depends_on=[cb]
    )
    registry.teardown()
    assert [e.name for e in registry.ledger() if e.outcome == "released_at_exit"] == [
        ctx.name,
        cb.name,
    ]


# ---------------------------------------------------------------------- API mode


@pytest.fixture(scope="session")
def api_module(tmp_path_factory, toy_so):
    """A cffi API-mode extension over toy.c, compiled in the test session."""
    pytest.importorskip("setuptools", reason="cffi's ffi.compile() needs setuptools")
    builder = cffi.FFI()
    builder.cdef(HEADER)
    builder.set_source(
        "_exitsafe_toyapi",
        '#include "toy.h"',
        sources=[str(NATIVE / "toy.c")],
        include_dirs=[str(NATIVE)],
        libraries=["pthread"],
    )
    tmpdir = tmp_path_factory.mktemp("api")
    so = builder.compile(tmpdir=str(tmpdir), verbose=False)
    spec = importlib.util.spec_from_file_location("_exitsafe_toyapi", so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_mode_track_callback_and_lookup(api_module, reg):
    ffi, lib = api_module.ffi, api_module.lib
    ctx = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg, kind="ctx")
    obj = es_cffi.track(
        ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, registry=reg, depends_on=[ctx]
    )
    assert lib.toy_live() == 2
    assert es_cffi.handle_of(ffi.cast("void *", obj.raw), registry=reg) is obj
    with pytest.raises(ValueError, match="NULL"):
        es_cffi.track(ffi, ffi.NULL, lib.toy_ctx_free, registry=reg)
    cb = es_cffi.callback(ffi, "toy_int_fn", lambda x: -x, registry=reg)
    assert lib.toy_call(cb.raw, 3) == -3
    raw = cb.raw
    ctx.release()
    assert lib.toy_live() == 2  # deferred behind obj
    reg.teardown()
    assert lib.toy_live() == 0
    assert cb.state == "leaked"
    assert lib.toy_call(raw, 3) == 0


def test_a_registry_subclass_overriding_track_sees_every_pointer(abi):
    # The compiled path calls the registry's track itself only for exitsafe.Registry; a
    # subclass that overrides track() gets every call (a review finding).
    ffi, lib = abi
    calls = []

    class Audited(exitsafe.Registry):
        def track(self, raw, release, **options):
            calls.append(raw)
            return super().track(raw, release, **options)

    reg = Audited("adapters-audited")
    handles = [
        es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg) for _ in range(3)
    ]
    assert len(calls) == 3
    for h in handles:
        h.release()
    reg.teardown()


def test_a_track_interrupted_as_the_registry_hands_the_handle_over_releases_it_once(abi):
    # CPython acts on a Ctrl-C right after a C function returns: the compiled registry's
    # track returned the handle, and the KeyboardInterrupt dropped it before the adapter
    # held it.  As for Registry.track, the handle was handed over: it is released as it is
    # dropped, once (the caller must not free the pointer: see the adapters' track), and
    # the address is left free to track again.
    ffi, lib = abi
    freed: list[object] = []

    class Interrupted(exitsafe.Registry):
        def track(self, raw, release, **options):
            super().track(raw, release, **options)  # (the handle dropped at once)
            raise KeyboardInterrupt

    reg = Interrupted("adapters-interrupted")
    ptr = lib.toy_ctx_new()
    with pytest.raises(KeyboardInterrupt):
        es_cffi.track(ffi, ptr, lambda p: freed.append(p), registry=reg, name="ctx")
    gc.collect()
    assert freed == [ptr]
    assert [(e.name, e.outcome) for e in reg.ledger()] == [("ctx", "released")]
    again = exitsafe.Registry("adapters-again")
    handle = es_cffi.track(ffi, ptr, lib.toy_ctx_free, registry=again)  # (not refused)
    handle.release()
    again.teardown()
    reg.teardown()


def test_track_inside_a_section_of_this_thread_is_refused_not_deadlocked(abi, reg):
    from exitsafe import _sync
    from exitsafe.lowlevel import ReentrancyError

    ffi, lib = abi
    _warm(ffi, lib, reg)  # the compiled path would take the next pointer
    p = lib.toy_ctx_new()
    with _sync.LOCK:  # (a section of this thread)
        with pytest.raises(ReentrancyError, match="track"):
            es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg).release()  # nothing was claimed


def test_a_pinned_librarys_release_function_keeps_its_pin_on_every_track(toy_copy, reg):
    # The first track of a release function finds its library's pin (the Python path);
    # the next ones (the compiled path, which remembers that pin) depend on it too, until
    # the pin ends; a Python release function never depends on a pin.
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg)
    first = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    later = [
        es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg) for _ in range(3)
    ]
    assert {h.depends_on for h in (first, *later)} == {(pin,)}
    plain = es_cffi.track(ffi, lib.toy_ctx_new(), lambda p: lib.toy_ctx_free(p), registry=reg)
    assert plain.depends_on == ()
    plain.release()
    pin.release()  # waits for its dependents: the library stays mapped
    assert pin.state == "live" and is_mapped(toy_copy)
    for h in (first, *later):
        h.release()
    assert pin.state == "released" and not is_mapped(toy_copy)


def _assert_the_pin_holds_its_library(ffi, lib, pin, path, reg):  # type: ignore[no-untyped-def]
    """A handle released by the library's function depends on ``pin``, which keeps the
    library at ``path`` mapped until that handle ends, then closes it."""
    h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    assert h.depends_on == (pin,)
    pin.release()  # waits for h
    assert is_mapped(path)
    h.release()
    assert pin.state == "released" and not is_mapped(path)


@needs_proc_maps
def test_a_pin_is_of_the_librarys_own_file_when_it_declares_libc_functions_too(toy_copy, reg):
    # `free` sorts before the library's own names and resolves in libc: the pin must still
    # be the library's (its functions depend on it, it keeps that file mapped), not libc's.
    ffi = cffi.FFI()
    ffi.cdef(HEADER + "\nvoid free(void *);")
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg)
    c_memory = es_cffi.track(ffi, ffi.cast("void *", 0x1000), lib.free, registry=reg)
    assert c_memory.depends_on == ()  # libc's free is not the library's
    c_memory.detach()
    _assert_the_pin_holds_its_library(ffi, lib, pin, toy_copy, reg)


@needs_proc_maps
def test_a_library_pinned_before_its_functions_are_declared_is_found(toy_copy, reg):
    # Nothing declared yet when it is pinned: the pin is of the file ffi.dlopen loaded
    # (it had no base address: no track ever found it, and its close unmapped the library
    # under live handles).
    ffi = cffi.FFI()
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg)
    ffi.cdef(HEADER)
    _assert_the_pin_holds_its_library(ffi, lib, pin, toy_copy, reg)


@needs_proc_maps
def test_a_pin_is_of_the_file_most_declared_symbols_are_in_when_its_name_is_unknown(
    toy_copy, reg, monkeypatch
):
    # Opened by a relative name, then the working directory changed: the name no longer
    # finds the file, so the file is the one most of the declared symbols are in.
    ffi = cffi.FFI()
    ffi.cdef(HEADER + "\nvoid free(void *);")
    monkeypatch.chdir(os.path.dirname(toy_copy))
    lib = ffi.dlopen("./" + os.path.basename(toy_copy))
    monkeypatch.chdir("/")
    pin = es_cffi.pin(ffi, lib, registry=reg)
    _assert_the_pin_holds_its_library(ffi, lib, pin, toy_copy, reg)


def test_a_remembered_pin_serves_its_own_registry_only_and_not_once_ended(abi, reg):
    ffi, lib = abi
    other = exitsafe.Registry("adapters-other")
    try:
        pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
        es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg).release()
        elsewhere = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=other)
        assert elsewhere.depends_on == ()  # no pin in that registry
        elsewhere.release()
        other_pin = es_cffi.pin(ffi, lib, registry=other, close=False)
        h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=other)
        assert h.depends_on == (other_pin,)
        h.release()
        pin.release()
        assert pin.state == "released"
        h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
        assert h.depends_on == ()  # its pin ended: nothing to depend on
        h.release()
        again = es_cffi.pin(ffi, lib, registry=reg, close=False)  # a new pin: found again
        h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
        assert h.depends_on == (again,)
        h.release()
    finally:
        other.teardown()


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
def test_a_function_of_an_unpinned_library_takes_the_compiled_path_too(abi, reg):
    # While one library is pinned, a function of another one, unpinned, is looked up once:
    # the compiled track remembers that it has no pin, until a pin is made.
    ffi, lib = abi
    toy_pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
    cffi_c = cffi.FFI()
    cffi_c.cdef("void *malloc(size_t); void free(void *);")
    libc = cffi_c.dlopen(None)  # the program and what it links (malloc and free of libc)
    handles: list[exitsafe.Handle] = []

    def track() -> None:
        handles.append(es_cffi.track(cffi_c, libc.malloc(16), libc.free, registry=reg))

    libc_pin = remembers_no_pin_until_one_is_made(
        track, handles, lambda: es_cffi.pin(cffi_c, libc, registry=reg, close=False)
    )
    for h in handles:
        h.release()
    libc_pin.release()
    toy_pin.release()


def test_a_pin_ending_late_keeps_the_newer_pin_of_its_library(abi, reg, track):
    # A pin released while a handle still needs it ends only with that handle; a new pin of
    # the same library made meanwhile must stay the one later handles depend on (the old
    # pin's end used to drop the new pin's entry: later handles then depended on nothing).
    ffi, lib = abi
    old = es_cffi.pin(ffi, lib, registry=reg, close=False)
    first = track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    old.release()  # waits for first
    new = es_cffi.pin(ffi, lib, registry=reg, close=False)
    assert new is not old
    first.release()
    assert old.state == "released" and new.state == "live"
    later = track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    assert later.depends_on == (new,)
    assert es_cffi.pinned(lib, registry=reg) is new
    later.release()
    new.release()


def test_pins_of_one_library_in_two_registries_keep_each_other_open(toy_copy, reg):
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    other = exitsafe.Registry("adapters-other-pin")
    try:
        mine = es_cffi.pin(ffi, lib, registry=reg)
        theirs = es_cffi.pin(ffi, lib, registry=other)
        h = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
        g = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=other)
        assert (h.depends_on, g.depends_on) == ((mine,), (theirs,))
        h.release()
        mine.release()  # the other registry's pin still holds the library open
        assert mine.state == "released" and lib.toy_live() >= 1 and is_mapped(toy_copy)
        assert es_cffi.pinned(lib, registry=other) is theirs
        g2 = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=other)
        assert g2.depends_on == (theirs,)
        g2.release()
        g.release()
        theirs.release()  # the last pin closes it
        assert not is_mapped(toy_copy)
        with pytest.raises(ValueError):
            lib.toy_live()
    finally:
        other.teardown()


def test_a_released_pin_waiting_for_its_dependents_takes_no_new_one(abi, reg, track):
    # pin.release() with a handle still depending on it: the pin stays live, with no owner,
    # until that handle ends; a new track of the library's function then depends on nothing
    # (it used to be refused: "depends_on: ... has no owner left"), on either path.
    ffi, lib = abi
    pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
    first = track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    assert first.depends_on == (pin,)
    pin.release()
    assert (pin.state, pin.owners) == ("live", 0)
    assert es_cffi.pinned(lib, registry=reg) is None
    later = [track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg) for _ in range(2)]
    assert [h.depends_on for h in later] == [(), ()]
    for h in (first, *later):
        h.release()
    assert pin.state == "released"


@needs_proc_maps
def test_pinning_a_pinned_library_again_takes_no_extra_loader_reference(toy_copy, reg):
    # A second pin() returns the first pin (retained); a refused one (other close=, a bad
    # name) pins nothing: none of them may leave the library loaded for ever.
    ffi = cffi.FFI()
    ffi.cdef(HEADER)
    lib = ffi.dlopen(toy_copy)
    pin = es_cffi.pin(ffi, lib, registry=reg, close=True)
    assert es_cffi.pin(ffi, lib, registry=reg, close=True) is pin
    with pytest.raises(ValueError, match="already pinned"):
        es_cffi.pin(ffi, lib, registry=reg, close=False)
    pin.release()
    assert pin.state == "live"  # the second owner
    pin.release()
    assert pin.state == "released" and not is_mapped(toy_copy)

    lib = ffi.dlopen(toy_copy)
    with pytest.raises(TypeError, match="name"):
        es_cffi.pin(ffi, lib, registry=reg, name=42)  # type: ignore[arg-type]
    ffi.dlclose(lib)
    assert not is_mapped(toy_copy)


@pytest.mark.skipif(not COMPILED, reason="the compiled core is not in use here")
@collection_inside_a_c_call
def test_a_pin_ending_inside_the_compiled_track_is_not_an_error(abi, reg):
    # As the ctypes test of the same name: the remembered pin loses its last owner (a
    # forced garbage collection's callback) after the compiled track checked it; the
    # handle is made depending on no pin instead of raising HandleClosedError.
    ffi, lib = abi
    pin = es_cffi.pin(ffi, lib, registry=reg, close=False)
    first = es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg)
    # once more: the compiled track has learnt this FFI and remembered the pin (no
    # allocation of its own left before the window)
    es_cffi.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, registry=reg).release()
    p = lib.toy_ctx_new()
    address = int(ffi.cast("uintptr_t", p))
    with PinReleasedInACollection(pin, address) as collection:
        h = es_cffi.track(ffi, p, lib.toy_ctx_free, registry=reg)
    assert pin.owners == 0
    assert collection.window  # the pin ended after the C check, before the registration
    assert h.depends_on == ()
    for handle in (first, h):
        handle.release()
    assert pin.state == "released"

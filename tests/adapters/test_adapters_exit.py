"""Real exit behaviour of the adapters, in subprocesses, on the toy C library.

Each scenario runs the program a binding user would write twice: unprotected (it
crashes: SIGSEGV or SIGABRT with the toy library's FATAL message) and protected by
exitsafe (exit 0, no noise, releases in order per the library's own trace).
"""

from __future__ import annotations

import signal

import pytest

from ..support import assert_clean, run_py
from .toy import NATIVE, needs_posix

pytestmark = needs_posix

CFFI_PRELUDE = """
import os, sys, gc
import cffi
ffi = cffi.FFI()
ffi.cdef(open(os.environ["TOY_H"]).read())
lib = ffi.dlopen(os.environ["TOY_SO"])
"""

CTYPES_PRELUDE = """
import os, sys, gc, atexit, ctypes, _ctypes
vp = ctypes.c_void_p
lib = ctypes.CDLL(os.environ["TOY_SO"])
lib.toy_ctx_new.restype = vp
lib.toy_ctx_free.argtypes = (vp,)
lib.toy_obj_new.restype = vp
lib.toy_obj_new.argtypes = (vp,)
lib.toy_obj_free.argtypes = (vp,)
lib.toy_catalog_open.restype = vp
lib.toy_catalog_release.argtypes = (vp,)
"""


def run(code, tmp_path, toy_so, **env):
    base = {"TOY_SO": toy_so, "TOY_H": str(NATIVE / "toy.h"), "TOY_TRACE": "1"}
    base.update(env)
    return run_py(code, tmp_path, env=base)


def toy_lines(proc):
    return [line[5:] for line in proc.stderr.splitlines() if line.startswith("toy: ")]


def assert_signal(proc, sig):
    assert proc.returncode == -sig, f"exit {proc.returncode}\n{proc.stderr}"


# ---------------------------------------------------------------------- S1: library unloaded first


def test_cffi_release_into_a_closed_library_segfaults_unprotected(tmp_path, toy_copy):
    proc = run(
        CFFI_PRELUDE
        + """
ctx = ffi.gc(lib.toy_ctx_new(), lib.toy_ctx_free)
ffi.dlclose(lib)   # a plugin unloader / the binding's shutdown runs before ctx goes
""",
        tmp_path,
        toy_copy,
    )
    assert_signal(proc, signal.SIGSEGV)


def test_cffi_pin_keeps_the_code_until_the_handle_is_released(tmp_path, toy_copy):
    proc = run(
        CFFI_PRELUDE
        + """
import exitsafe.cffi as es
pin = es.pin(ffi, lib)
ctx = es.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free)
ffi.dlclose(lib)   # the same early close: the pin's loader reference keeps the code mapped
""",
        tmp_path,
        toy_copy,
    )
    assert_clean(proc)
    assert toy_lines(proc) == ["new ctx 1", "free ctx 1"]


def test_ctypes_release_after_the_binding_unloaded_its_library(tmp_path, toy_copy):
    program = """
{protect_import}
{prelude}
atexit.register(_ctypes.dlclose, lib._handle)   # the binding unloads its library at exit

class Context:
    def __init__(self):
        {create}
    def __del__(self):
        {delete}

ctx = Context()
"""
    unprotected = program.format(
        protect_import="",
        prelude=CTYPES_PRELUDE,
        create="self.p = lib.toy_ctx_new()",
        delete="lib.toy_ctx_free(self.p)",
    )
    proc = run(unprotected, tmp_path, toy_copy)
    assert_signal(proc, signal.SIGSEGV)

    protected = program.format(
        # exitsafe is imported first, so its teardown runs after the binding's atexit
        # unload: only the pin's own loader reference makes the release safe.
        protect_import="import exitsafe.ctypes as es",
        prelude=CTYPES_PRELUDE + "\npin = es.pin(lib, close=False)\n",
        create="self.h = es.track(lib.toy_ctx_new(), lib.toy_ctx_free)",
        delete="pass  # nothing: the handle releases itself",
    )
    proc = run(protected, tmp_path, toy_copy)
    assert_clean(proc)
    assert toy_lines(proc) == ["new ctx 1", "free ctx 1"]

    # The same with track() but no pin: the ordered release alone cannot help here.
    proc = run(protected.replace("pin = es.pin(lib, close=False)", ""), tmp_path, toy_copy)
    assert_signal(proc, signal.SIGSEGV)


# ---------------------------------------------------------------------- S2: order at exit


def test_cffi_parent_freed_first_at_exit_aborts_unprotected_and_is_ordered_protected(
    tmp_path, toy_so
):
    # Unprotected: the objects keep only the context's pointer, not the context, so
    # module teardown (which clears __main__'s globals in definition order on every
    # CPython 3.9-3.13) frees the context first: deterministic.  (With a reference
    # cycle instead, the collector's order decides, and on 3.9 it happens to free the
    # objects first: the protected program below uses such a cycle.)
    unprotected = (
        CFFI_PRELUDE
        + """
class Ctx:
    def __init__(self):
        self.p = ffi.gc(lib.toy_ctx_new(), lib.toy_ctx_free)

class Obj:
    def __init__(self, ctx):
        self.p = ffi.gc(lib.toy_obj_new(ctx.p), lib.toy_obj_free)

ctx = Ctx()
objs = [Obj(ctx) for _ in range(3)]
"""
    )
    proc = run(unprotected, tmp_path, toy_so)
    assert_signal(proc, signal.SIGABRT)
    assert "context freed while its objects are alive" in proc.stderr

    protected = (
        CFFI_PRELUDE
        + """
import exitsafe.cffi as es

class Ctx:
    def __init__(self):
        self.h = es.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, kind="ctx")
        self.objs = []

class Obj:
    def __init__(self, ctx):
        self.ctx = ctx
        self.h = es.track(ffi, lib.toy_obj_new(ctx.h.raw), lib.toy_obj_free, depends_on=[ctx.h])
        ctx.objs.append(self)

ctx = Ctx()
objs = [Obj(ctx) for _ in range(3)]
"""
    )
    proc = run(protected, tmp_path, toy_so)
    assert_clean(proc)
    lines = toy_lines(proc)
    assert lines[-1] == "free ctx 1"
    assert sorted(lines[-4:-1]) == ["free obj 2", "free obj 3", "free obj 4"]


def test_wrapper_classes_release_in_order_at_exit(tmp_path, toy_so):
    proc = run(
        CFFI_PRELUDE
        + """
from exitsafe import NativeObject

class Context(NativeObject, kind="ctx", release=lib.toy_ctx_free):
    def __init__(self):
        super().__init__(lib.toy_ctx_new())
        self.children = []

class Obj(NativeObject, kind="obj", release=lib.toy_obj_free):
    def __init__(self, ctx):
        super().__init__(lib.toy_obj_new(ctx.raw), parent=ctx)
        ctx.children.append(self)   # a cycle, as bindings often have

ctx = Context()
objs = [Obj(ctx) for _ in range(2)]
""",
        tmp_path,
        toy_so,
    )
    assert_clean(proc)
    assert toy_lines(proc)[-3:] in (
        ["free obj 3", "free obj 2", "free ctx 1"],
        ["free obj 2", "free obj 3", "free ctx 1"],
    )


# ---------------------------------------------------------------------- policies and leak reports


@pytest.mark.parametrize("mode, live", [("release", 0), ("leak", 2)])
def test_process_wide_override_with_the_library_leak_report(tmp_path, toy_so, mode, live):
    proc = run(
        CFFI_PRELUDE
        + """
import exitsafe.cffi as es
pin = es.pin(ffi, lib, close=False)
ctx = es.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, exit_policy="leak")
obj = es.track(ffi, lib.toy_obj_new(ctx.raw), lib.toy_obj_free, depends_on=[ctx])
""",
        tmp_path,
        toy_so,
        EXITSAFE_AT_EXIT=mode,
        TOY_REPORT="1",
    )
    assert_clean(proc)
    assert f"unloaded with {live} live objects" in proc.stderr
    assert ("free obj" in proc.stderr) == (mode == "release")


# ------------------------------------------------------------ S4: native thread calls back


def test_guarded_callback_from_a_native_thread_exits_cleanly(tmp_path, toy_so):
    proc = run(
        CFFI_PRELUDE
        + """
import time, exitsafe, exitsafe.cffi as es
calls = []

def on_log(msg):
    calls.append(ffi.string(msg))

cb = es.callback(ffi, "toy_log_fn", on_log)
lib.toy_set_logger(cb.raw)
# unregister first at teardown; the guard covers a call already in flight
exitsafe.on_teardown(lambda: lib.toy_set_logger(ffi.NULL), before=[cb])
lib.toy_logger_thread_start(200)
time.sleep(0.05)
assert calls, "the native thread called back"
""",
        tmp_path,
        toy_so,
        TOY_TRACE="",
    )
    assert_clean(proc)


# ------------------------------------------------------------ the seed: a catalog's __del__

BINDING = """
class Catalog:
    '''A third-party wrapper shaped like windowsml.EpCatalog.'''
    def __init__(self):
        self._handle = lib.toy_catalog_open()
    def close(self):
        if self._handle:
            lib.toy_catalog_release(self._handle)
            self._handle = None
    def __del__(self):
        self.close()

# The native runtime shuts down at exit; releasing a catalog after that crashes.
atexit.register(lib.toy_runtime_shutdown)
"""


def test_third_party_finalizer_after_runtime_shutdown_aborts_unprotected(tmp_path, toy_so):
    proc = run(CTYPES_PRELUDE + BINDING + "catalog = Catalog()\n", tmp_path, toy_so)
    assert_signal(proc, signal.SIGABRT)
    assert "catalog released after toy_runtime_shutdown" in proc.stderr


def test_neutralize_at_exit_is_the_seed_fix_in_one_call(tmp_path, toy_so):
    proc = run(
        CTYPES_PRELUDE
        + BINDING
        + """
from exitsafe.lowlevel import neutralize_at_exit
catalog = Catalog()
neutralize_at_exit(catalog, "_handle")
""",
        tmp_path,
        toy_so,
    )
    assert_clean(proc)
    assert "release catalog" not in proc.stderr  # deliberately leaked; the OS reclaims it


def test_adopt_closes_the_catalog_in_order_before_the_runtime_goes(tmp_path, toy_so):
    proc = run(
        CTYPES_PRELUDE
        + BINDING
        + """
import exitsafe.ctypes as es
from exitsafe import adopt
runtime = es.pin(lib, close=False)
catalog = Catalog()
adopt(catalog, depends_on=[runtime])
""",
        tmp_path,
        toy_so,
    )
    assert_clean(proc)
    assert toy_lines(proc) == ["open catalog 1", "release catalog 1", "runtime shutdown"]


def test_adopt_with_leak_policy_and_neutralize(tmp_path, toy_so):
    proc = run(
        CTYPES_PRELUDE
        + BINDING
        + """
from exitsafe import adopt
catalog = Catalog()
adopt(catalog, exit_policy="leak", neutralize="_handle")
""",
        tmp_path,
        toy_so,
        EXITSAFE_TRACE="1",
    )
    assert_clean(proc)
    assert "release catalog" not in proc.stderr
    assert "outcome=leaked_policy" in proc.stderr


# ------------------------------------------------------------ a thread inside a pinned library

THREAD_INSIDE_A_PINNED_LIBRARY = CFFI_PRELUDE + """
import logging, threading, time
import exitsafe.cffi as es
logging.basicConfig(level=logging.INFO, format="%(message)s")
path = os.path.realpath(os.environ["TOY_SO"])

def mapped():
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(path) for line in maps)

inside = threading.Event()

@ffi.callback("int(int)")
def wait_in_the_library(x):
    # called by toy_call: returns into the library's code once it is unmapped (or after 2 s)
    inside.set()
    end = time.monotonic() + 2
    while mapped() and time.monotonic() < end:
        time.sleep(0.001)
    return x

pin = es.pin(ffi, lib)  # close=True: the library is unloaded at the end of the exit's teardown
threading.Thread(target=lib.toy_call, args=(wait_in_the_library, 1), daemon=True).start()
inside.wait(30)
"""


def test_a_pinned_library_stays_loaded_at_exit_while_a_thread_may_be_inside_it(
    tmp_path, toy_copy
):
    # A daemon thread inside a handle-less call of the library (nothing to borrow) when the
    # exit's teardown ends the pin: unloading the library under it crashed the thread
    # (second adoption: libarchive, 14 of 20 runs).  The pin keeps it loaded, and says so.
    proc = run(THREAD_INSIDE_A_PINNED_LIBRARY, tmp_path, toy_copy)
    assert_clean(proc)
    assert "kept loaded at exit: 'Thread-1" in proc.stderr, proc.stderr


def test_a_pinned_library_is_unloaded_at_exit_when_only_the_teardowns_workers_remain(
    tmp_path, toy_copy
):
    # A step with a time limit ran on one of the teardown's worker threads, which stays in
    # standby: that thread runs no code of the library, so the pin still unloads it, in
    # order, after the handle (the library's destructor speaks before the process ends).
    proc = run(
        CFFI_PRELUDE
        + """
import logging
import exitsafe.cffi as es
logging.basicConfig(level=logging.INFO, format="%(message)s")
pin = es.pin(ffi, lib)
ctx = es.track(ffi, lib.toy_ctx_new(), lib.toy_ctx_free, timeout=30)  # a timed step
""",
        tmp_path,
        toy_copy,
        TOY_REPORT="1",
    )
    assert_clean(proc)
    assert "kept loaded at exit" not in proc.stderr, proc.stderr
    assert toy_lines(proc) == ["new ctx 1", "free ctx 1", "unloaded with 0 live objects"]

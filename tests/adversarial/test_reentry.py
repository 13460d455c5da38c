"""Class 1: garbage collection (or a ``__del__``) inside exitsafe's critical sections.

A collected handle's release, a user ``__del__`` calling ``release()``, a release
function releasing a handle of another registry: each used to run on the thread that
held exitsafe's lock and wait for it (a deadlock).  Each must now be queued and done
right after the section, with exactly one outcome.
"""

from __future__ import annotations

from collections import Counter

import pytest

from ..support import assert_clean, run_program
from .programs import FORCE_IN_SECTIONS, program

N = 300

CFFI_LOOP = """
    import cffi
    from exitsafe import cffi as es_cffi

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    libc = ffi.dlopen(None)

    def release(ptr):
        record("free")
        libc.free(ptr)   # a double free would abort in glibc

    class Wrapper:
        def __init__(self):
            self.h = es_cffi.track(ffi, libc.malloc(16), release, kind="buffer", name="b")
            self.cycle = self  # only the cyclic garbage collector can free it

        def __del__(self):
            if in_section():
                record("reentered")
            self.h.release()  # the binding's finalizer, asking exitsafe

    # (A name takes the Python path of the compiled core too: its sections run Python
    # code, where the collection is forced.  The compiled path's sections run none.)
    force_in_sections(gc.collect)
    for i in range(N):
        Wrapper()
        es_cffi.track(ffi, libc.malloc(16), release, name="c").release()
    stop_forcing()
    gc.collect()
    print(len(exitsafe.lowlevel.default_registry()))
"""

CTYPES_LOOP = """
    import ctypes
    from exitsafe import ctypes as es_ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)

    def release(ptr):
        record("free")
        libc.free(ptr)

    class Wrapper:
        def __init__(self):
            self.h = es_ctypes.track(ctypes.c_void_p(libc.malloc(16)), release, name="b")
            self.cycle = self

        def __del__(self):
            if in_section():
                record("reentered")
            self.h.release()

    # (A name takes the Python path of the compiled core, as in the cffi loop.)
    force_in_sections(gc.collect)
    for i in range(N):
        Wrapper()
        es_ctypes.track(libc.malloc(16), release, name="c").release()
    stop_forcing()
    gc.collect()
    print(len(exitsafe.lowlevel.default_registry()))
"""


@pytest.mark.parametrize("body", [CFFI_LOOP, CTYPES_LOOP], ids=["cffi", "ctypes"])
def test_collection_inside_every_section_of_the_adapters(tmp_path, body):
    pytest.importorskip("cffi")
    run = run_program(
        program(FORCE_IN_SECTIONS, body, N=N), tmp_path, ledger=True, timeout=120
    )
    assert_clean(run)
    counts = Counter(run.order)
    assert counts["reentered"] > 0, "the hazard was not forced: no finalizer ran in a section"
    assert counts["free"] == 2 * N, "every buffer freed exactly once"
    assert run.stdout.split() == ["0"], "nothing left live"
    entries = run.ledger()["registries"][0]["entries"]
    assert len(entries) == 2 * N and {e["outcome"] for e in entries} == {"released"}


CROSS_REGISTRY = """
    a = exitsafe.Registry("A")
    b = exitsafe.Registry("B")
    b_handles = {}

    def release_a(raw):
        record(f"a{raw}")
        b_handles.pop(raw).release()  # a release function releasing another registry's handle

    class Wrapper:
        def __init__(self, i):
            # (An option: the locked path of both cores, whose sections run Python code
            # where the collection is forced; the pure-Python core's lock-free path for
            # handles without options has no section.)
            b_handles[i] = b.track(
                i, lambda raw: record(f"b{raw}"), name=f"b{i}", exit_policy="release"
            )
            self.h = a.track(i, release_a, name=f"a{i}", exit_policy="release")
            self.cycle = self

        def __del__(self):
            if in_section():
                record("reentered")
            self.h.release()

    force_in_sections(gc.collect)
    for i in range(N):
        Wrapper(i)
    stop_forcing()
    gc.collect()
    print(len(a), len(b))
"""


def test_release_function_releasing_another_registry_inside_sections(tmp_path):
    run = run_program(
        program(FORCE_IN_SECTIONS, CROSS_REGISTRY, N=N), tmp_path, ledger=True, timeout=120
    )
    assert_clean(run)
    counts = Counter(run.order)
    assert counts.pop("reentered", 0) > 0, "the hazard was not forced"
    assert set(counts.values()) == {1} and len(counts) == 2 * N, "each released exactly once"
    assert run.stdout.split() == ["0", "0"]
    assert set(run.outcomes("A").values()) == {"released"} and len(run.outcomes("A")) == N
    assert set(run.outcomes("B").values()) == {"released"} and len(run.outcomes("B")) == N


ADOPT_AND_NEUTRALIZE = """
    class Resource:
        def __init__(self, i):
            self.i = i
            self._handle = i
            self.cycle = self

        def close(self):
            record(f"close{self.i}")
            self._handle = None

        def __del__(self):
            if self._handle is not None:
                record(f"del{self.i}")  # a finalizer of the library: must not run twice

    force_in_sections(gc.collect)
    for i in range(N):
        h = exitsafe.adopt(Resource(i), name=f"r{i}")
        h.release()                                  # closes it now
        # collected right away: its hook is cancelled
        exitsafe.lowlevel.neutralize_at_exit(Resource(N + i))
    stop_forcing()
    gc.collect()
    print(len(exitsafe.lowlevel.default_registry()))
"""


def test_adopt_and_neutralize_at_exit_inside_sections(tmp_path):
    run = run_program(
        program(FORCE_IN_SECTIONS, ADOPT_AND_NEUTRALIZE, N=N), tmp_path, ledger=True, timeout=120
    )
    assert_clean(run)
    closes = [x for x in run.order if x.startswith("close")]
    assert sorted(closes) == sorted(f"close{i}" for i in range(N))
    dels = {x for x in run.order if x.startswith("del")}
    assert dels == {f"del{N + i}" for i in range(N)}, "unneutralized objects finalize once"
    outcomes = run.outcome_counts()
    assert outcomes.pop("released") == N
    assert outcomes.pop("hook_cancelled", 0) + outcomes.pop("hook_ran", 0) == N
    assert outcomes == {}


ORDINARY_USE = """
    import ctypes
    from exitsafe import ctypes as es_ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    freed = [0]

    def release(ptr):
        freed[0] += 1
        libc.free(ptr)

    class Buffer:
        def __init__(self):
            self.h = es_ctypes.track(libc.malloc(16), release)
            self.owner = [self]  # a reference cycle, as wrappers often have

    for i in range(60_000):
        Buffer()
    gc.collect()
    print(freed[0], len(exitsafe.lowlevel.default_registry()))
"""


def test_ordinary_loop_of_wrappers_in_cycles_never_hangs(tmp_path):
    # The report: a plain loop of exitsafe.ctypes.track() whose wrappers sit in
    # reference cycles hung every time on CPython 3.13 after about 100k iterations.
    run = run_program(ORDINARY_USE, tmp_path, timeout=180)
    assert_clean(run)
    assert run.stdout.split() == ["60000", "0"]

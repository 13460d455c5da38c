"""Per-handle cost of the hot path against cffi's ``ffi.gc`` and ``weakref.finalize``.

Every contender uses the same raw value (a cffi ``void *`` cdata from ABI mode) and
the same release function (a Python function doing nothing), so the ratios show
what each mechanism adds around the native release call.
"""

from __future__ import annotations

import _thread
import weakref
from time import perf_counter
from typing import Any, Dict, List, Tuple

import cffi

import exitsafe
from exitsafe.lowlevel import CORE

from ._util import (
    Bar,
    Config,
    Loop,
    Section,
    Table,
    fmt_ns,
    fmt_spread,
    gc_paused,
    interleaved,
    paired_ratios,
    profile_call,
    profile_table,
    summarize,
)
from .floor import LockedRegistry, MinimalRegistry

#: Bars: track + release at most 0.8x ffi.gc + ffi.release with the compiled core, 3.5x in
#: pure Python (the performance issue's), and at most 0.5x weakref.finalize create + call.
BAR_VS_CFFI = 0.8 if CORE == "compiled" else 3.5
BAR_VS_FINALIZE = 0.5


def noop_release(raw: object) -> None:
    """The release function of every contender: a plain Python call that does nothing."""


class Target:
    """A weak-referenceable object for ``weakref.finalize`` to watch."""

    __slots__ = ("__weakref__",)


def _ffi_pointer() -> Any:
    ffi = cffi.FFI()
    ffi.dlopen(None)  # ABI mode, the process's own symbols: enough for cdata pointers
    return ffi, ffi.cast("void *", 0x1234)


def make_loops() -> Tuple[Dict[str, Loop], exitsafe.Registry]:
    """The contenders, each a closure with everything bound to locals."""
    ffi, ptr = _ffi_pointer()
    release = noop_release
    registry = exitsafe.Registry("bench-hot-path")
    parent = registry.track(ptr, release, kind="parent")
    dep = (parent,)
    target = Target()

    def empty(n: int) -> float:
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            pass
        return perf_counter() - t0

    def cffi_gc_release(n: int) -> float:
        gc_, rel, rng = ffi.gc, ffi.release, range(n)
        t0 = perf_counter()
        for _ in rng:
            rel(gc_(ptr, release))
        return perf_counter() - t0

    def finalize_call(n: int) -> float:
        fin, rng = weakref.finalize, range(n)
        t0 = perf_counter()
        for _ in rng:
            fin(target, release, ptr)()
        return perf_counter() - t0

    def es_track_release(n: int) -> float:
        track, rng = registry.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release).release()
        return perf_counter() - t0

    def es_module_track_release(n: int) -> float:
        track, rng = exitsafe.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release).release()
        return perf_counter() - t0

    def es_with_block(n: int) -> float:
        track, rng = registry.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            with track(ptr, release):
                pass
        return perf_counter() - t0

    def cffi_gc_drop(n: int) -> float:
        gc_, rng = ffi.gc, range(n)
        t0 = perf_counter()
        for _ in rng:
            gc_(ptr, release)
        return perf_counter() - t0

    def finalize_drop(n: int) -> float:
        fin, cls, rng = weakref.finalize, Target, range(n)
        t0 = perf_counter()
        for _ in rng:
            fin(cls(), release, ptr)
        return perf_counter() - t0

    def es_track_drop(n: int) -> float:
        track, rng = registry.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release)
        return perf_counter() - t0

    def es_track_dep_release(n: int) -> float:
        track, rng = registry.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release, depends_on=dep).release()
        return perf_counter() - t0

    def es_track_dep_drop(n: int) -> float:
        track, rng = registry.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release, depends_on=dep)
        return perf_counter() - t0

    minimal, locked = MinimalRegistry(), LockedRegistry()

    def floor_minimal(n: int) -> float:
        track, rng = minimal.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release).release()
        return perf_counter() - t0

    def floor_locked(n: int) -> float:
        track, rng = locked.track, range(n)
        t0 = perf_counter()
        for _ in rng:
            track(ptr, release).release()
        return perf_counter() - t0

    loops: Dict[str, Loop] = {
        "empty_loop": empty,
        "cffi_gc_release": cffi_gc_release,
        "finalize_create_call": finalize_call,
        "exitsafe_track_release": es_track_release,
        "exitsafe_module_track_release": es_module_track_release,
        "exitsafe_with_block": es_with_block,
        "cffi_gc_drop": cffi_gc_drop,
        "finalize_object_dies": finalize_drop,
        "exitsafe_track_drop": es_track_drop,
        "exitsafe_track_dep_release": es_track_dep_release,
        "exitsafe_track_dep_drop": es_track_dep_drop,
        "floor_minimal": floor_minimal,
        "floor_locked": floor_locked,
    }
    return loops, registry


#: name -> (label, baseline vs cffi, baseline vs weakref.finalize)
ROWS = [
    ("empty_loop", "empty loop (harness overhead)", None, None),
    ("cffi_gc_release", "cffi: ffi.gc + ffi.release", None, None),
    ("finalize_create_call", "weakref.finalize create + call", None, None),
    (
        "exitsafe_track_release",
        "exitsafe: Registry.track + Handle.release",
        "cffi_gc_release",
        "finalize_create_call",
    ),
    (
        "exitsafe_module_track_release",
        "exitsafe: exitsafe.track + release (default registry)",
        "cffi_gc_release",
        "finalize_create_call",
    ),
    (
        "exitsafe_with_block",
        "exitsafe: with Registry.track(...): pass",
        "cffi_gc_release",
        "finalize_create_call",
    ),
    ("cffi_gc_drop", "cffi: ffi.gc, drop last reference", None, None),
    ("finalize_object_dies", "weakref.finalize, object dies (incl. new object)", None, None),
    (
        "exitsafe_track_drop",
        "exitsafe: track, drop last reference (GC release)",
        "cffi_gc_drop",
        "finalize_object_dies",
    ),
    (
        "exitsafe_track_dep_release",
        "exitsafe: track(depends_on=(parent,)) + release",
        "cffi_gc_release",
        "finalize_create_call",
    ),
    (
        "exitsafe_track_dep_drop",
        "exitsafe: track(depends_on=(parent,)), drop last ref",
        "cffi_gc_drop",
        "finalize_object_dies",
    ),
    (
        "floor_minimal",
        "reference: minimal pure-Python tracker, no lock",
        "cffi_gc_release",
        "finalize_create_call",
    ),
    (
        "floor_locked",
        "reference: minimal tracker, 1 lock in track + 1 in release",
        "cffi_gc_release",
        "finalize_create_call",
    ),
]

_EXITSAFE_REGISTRY_LOOPS = (
    "exitsafe_track_release",
    "exitsafe_with_block",
    "exitsafe_track_drop",
    "exitsafe_track_dep_release",
    "exitsafe_track_dep_drop",
)


class _HandleLike:
    """An object shaped like ``exitsafe.Handle``: 17 slots set in ``__init__``, a ``__del__``."""

    __slots__ = (*(f"a{i}" for i in range(17)), "__weakref__")

    def __init__(self, a: object, b: object, c: object) -> None:
        self.a0 = a
        self.a1 = b
        self.a2 = c
        self.a3 = None
        self.a4 = None
        self.a5 = None
        self.a6 = None
        self.a7 = None
        self.a8 = 1
        self.a9 = 0
        self.a10 = 0
        self.a11 = 0
        self.a12 = 0
        self.a13 = None
        self.a14 = 0
        self.a15 = 0
        self.a16 = 0

    def __del__(self) -> None:
        if self.a8:
            pass


class _Bare:
    __slots__ = ("__weakref__",)


PRIMITIVES = {
    "call": "call a Python function f(x)",
    "lock": "with lock: pass (uncontended _thread lock)",
    "object": "create + free an object shaped like Handle",
    "weakref": "weakref.ref(new object) (minus the object itself)",
    "dict": "dict insert + delete (int key)",
    "counter": "counts[k] = counts.get(k, 0) + 1",
    "ledger": "append a 6-tuple ledger record",
}


def _primitives(cfg: Config) -> Dict[str, Any]:
    """Costs of the building blocks of the hot path, measured like the contenders."""
    lock = _thread.allocate_lock()
    release = noop_release

    def call(n: int) -> float:
        f, rng = release, range(n)
        t0 = perf_counter()
        for _ in rng:
            f(None)
        return perf_counter() - t0

    def lock_section(n: int) -> float:
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            with lock:
                pass
        return perf_counter() - t0

    def obj(n: int) -> float:
        cls, rng = _HandleLike, range(n)
        t0 = perf_counter()
        for _ in rng:
            cls(None, release, "handle")
        return perf_counter() - t0

    def bare(n: int) -> float:
        cls, rng = _Bare, range(n)
        t0 = perf_counter()
        for _ in rng:
            cls()
        return perf_counter() - t0

    def bare_ref(n: int) -> float:
        cls, ref, rng = _Bare, weakref.ref, range(n)
        t0 = perf_counter()
        for _ in rng:
            ref(cls())
        return perf_counter() - t0

    def dict_set_del(n: int) -> float:
        d: Dict[int, Any] = {}
        rng = range(n)
        t0 = perf_counter()
        for i in rng:
            d[i] = None
            del d[i]
        return perf_counter() - t0

    def counter(n: int) -> float:
        counts: Dict[str, int] = {}
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            counts["released"] = counts.get("released", 0) + 1
        return perf_counter() - t0

    def ledger(n: int) -> float:
        entries: List[Any] = []
        append, rng = entries.append, range(n)
        t0 = perf_counter()
        for i in rng:
            append((i, "handle", None, "released", None, False))
        return perf_counter() - t0

    loops: Dict[str, Loop] = {
        "call": call,
        "lock": lock_section,
        "object": obj,
        "bare": bare,
        "bare_ref": bare_ref,
        "dict": dict_set_del,
        "counter": counter,
        "ledger": ledger,
    }
    per_op = interleaved(loops, cfg.hot_n, max(3, cfg.hot_repeats // 4))
    out = {name: summarize(v) for name, v in per_op.items()}
    weak = [a - b for a, b in zip(per_op["bare_ref"], per_op["bare"])]
    out["weakref"] = summarize(weak)
    return out


def _split(cfg: Config) -> Dict[str, Any]:
    """Create-only and release-only time per handle, for each mechanism."""
    ffi, ptr = _ffi_pointer()
    release = noop_release
    registry = exitsafe.Registry("bench-split")
    target = Target()
    n = cfg.hot_n
    times: Dict[str, List[float]] = {
        k: []
        for k in (
            "exitsafe_track",
            "exitsafe_release",
            "cffi_gc",
            "cffi_release",
            "finalize_create",
            "finalize_call",
        )
    }
    for _ in range(cfg.hot_repeats):
        with gc_paused():
            track, rng = registry.track, range(n)
            t0 = perf_counter()
            handles = [track(ptr, release) for _ in rng]
            t1 = perf_counter()
            for h in handles:
                h.release()
            t2 = perf_counter()
            del handles
            times["exitsafe_track"].append((t1 - t0) / n)
            times["exitsafe_release"].append((t2 - t1) / n)

            gc_, rel = ffi.gc, ffi.release
            t0 = perf_counter()
            cdatas = [gc_(ptr, release) for _ in rng]
            t1 = perf_counter()
            for c in cdatas:
                rel(c)
            t2 = perf_counter()
            del cdatas
            times["cffi_gc"].append((t1 - t0) / n)
            times["cffi_release"].append((t2 - t1) / n)

            fin = weakref.finalize
            t0 = perf_counter()
            finalizers = [fin(target, release, ptr) for _ in rng]
            t1 = perf_counter()
            for f in finalizers:
                f()
            t2 = perf_counter()
            del finalizers
            times["finalize_create"].append((t1 - t0) / n)
            times["finalize_call"].append((t2 - t1) / n)
    return {k: summarize(v) for k, v in times.items()}


def profile_track_release(n: int) -> Dict[str, Any]:
    """cProfile of ``n`` track + release pairs: the top entries by own time."""
    _ffi, ptr = _ffi_pointer()
    registry = exitsafe.Registry("bench-profile")
    track, release = registry.track, noop_release

    def run() -> None:
        for _ in range(n):
            track(ptr, release).release()

    return profile_call(run, n)


def run(cfg: Config) -> Section:
    loops, registry = make_loops()
    per_op = interleaved(loops, cfg.hot_n, cfg.hot_repeats)
    summaries = {name: summarize(v) for name, v in per_op.items()}

    ratios: Dict[str, Dict[str, Dict[str, Any]]] = {}
    baselines = (
        "cffi_gc_release",
        "finalize_create_call",
        "cffi_gc_drop",
        "finalize_object_dies",
        "exitsafe_track_release",
    )
    for name in per_op:
        ratios[name] = {
            base: summarize(paired_ratios(per_op[name], per_op[base]))
            for base in baselines
            if base != name
        }

    warm = max(1, cfg.hot_n // 5)
    expected = len(_EXITSAFE_REGISTRY_LOOPS) * (warm + cfg.hot_n * cfg.hot_repeats)
    counts = registry.ledger_counts()
    verified = counts.get("released", 0) == expected and len(registry) == 1

    table = Table(
        "Hot path: cost per handle (median over rounds; ratios paired within each round)",
        ["operation", "ns/op", "spread", "vs cffi", "vs finalize"],
    )
    for name, label, vs_cffi, vs_fin in ROWS:
        s = summaries[name]
        table.add(
            label,
            fmt_ns(s["median"]),
            fmt_spread(s),
            f"{ratios[name][vs_cffi]['median']:.2f}x" if vs_cffi else "-",
            f"{ratios[name][vs_fin]['median']:.2f}x" if vs_fin else "-",
        )
    table.notes.append(
        f"{cfg.hot_repeats} rounds x {cfg.hot_n:,} ops per contender, interleaved;"
        " spread = IQR/median; drop rows compare with the matching drop baselines"
    )
    table.notes.append(
        f"ledger check: {counts.get('released', 0):,} released == {expected:,} operations:"
        f" {'ok' if verified else 'MISMATCH'}"
    )

    split = _split(cfg)
    split_table = Table(
        "Hot path split: create and release measured separately (ns per handle)",
        ["mechanism", "create", "release", "total"],
    )
    for label, a, b in (
        ("exitsafe track / Handle.release", "exitsafe_track", "exitsafe_release"),
        ("cffi ffi.gc / ffi.release", "cffi_gc", "cffi_release"),
        ("weakref.finalize create / call", "finalize_create", "finalize_call"),
    ):
        ma, mb = split[a]["median"], split[b]["median"]
        split_table.add(label, fmt_ns(ma), fmt_ns(mb), fmt_ns(ma + mb))

    prims = _primitives(cfg)
    prim_table = Table(
        "Building blocks of the hot path on this machine (ns per operation, loop included)",
        ["operation", "ns/op", "spread"],
    )
    for key, label in PRIMITIVES.items():
        prim_table.add(label, fmt_ns(prims[key]["median"]), fmt_spread(prims[key]))
    prim_table.notes.append(
        "per track + release pair exitsafe takes 3 lock sections, creates one Handle, links"
        " and unlinks it in the registry's live table, appends a ledger record"
        f" (the {CORE} core)"
    )

    prof = profile_track_release(cfg.profile_n)
    prof_table = profile_table(
        f"Profile of Registry.track + Handle.release (cProfile, {prof['ops']:,} pairs;"
        " the profiler inflates per-call costs)",
        prof,
    )

    vs_cffi = ratios["exitsafe_track_release"]["cffi_gc_release"]
    vs_fin = ratios["exitsafe_track_release"]["finalize_create_call"]
    bars = [
        Bar(
            f"track + release <= {BAR_VS_CFFI}x ffi.gc + ffi.release ({CORE} core)",
            vs_cffi["median"],
            BAR_VS_CFFI,
            "<=",
            "x",
            f"IQR {vs_cffi['p25']:.2f}-{vs_cffi['p75']:.2f} over {vs_cffi['n']} rounds",
        ),
        Bar(
            "track + release <= 0.5x weakref.finalize create + call",
            vs_fin["median"],
            BAR_VS_FINALIZE,
            "<=",
            "x",
            f"IQR {vs_fin['p25']:.2f}-{vs_fin['p75']:.2f} over {vs_fin['n']} rounds",
        ),
    ]
    data = {
        "ops_per_measurement": cfg.hot_n,
        "repeats": cfg.hot_repeats,
        "release_function": "a Python function doing nothing",
        "raw": "cffi cdata 'void *' (ABI mode)",
        "per_op_s": summaries,
        "ratios": ratios,
        "ledger_check": {
            "released": counts.get("released", 0),
            "expected": expected,
            "live_left": len(registry),
            "ok": verified,
        },
        "split_per_op_s": split,
        "profile": prof,
    }
    data["primitives_per_op_s"] = prims
    return Section("hot_path", data, [table, split_table, prim_table, prof_table], bars)

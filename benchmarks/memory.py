"""Memory per tracked handle (tracemalloc), against ``weakref.finalize`` and ``ffi.gc``.

For each mechanism, ``n`` objects are created and kept in a list allocated beforehand
(so the list itself is not counted); the growth of traced memory divided by ``n`` is
the cost per live handle.  Then every handle is released and dropped: what is still
allocated is what the mechanism keeps per *released* handle (for exitsafe, the ledger
record, kept up to ``ledger_limit`` entries per registry).
"""

from __future__ import annotations

import gc
import statistics
import tracemalloc
import weakref
from typing import Any, Callable, Dict, List, Tuple

import cffi

import exitsafe

from ._util import Bar, Config, Section, Table

#: Memory per live handle with the compiled core, at most.
BAR_BYTES_PER_HANDLE = 200


def _noop(raw: object) -> None:
    """The release function: does nothing."""


class Target:
    __slots__ = ("__weakref__",)


Factory = Callable[[], Tuple[Callable[[], Any], Callable[[Any], None], Any]]


def _contenders(ptr: Any, ffi: Any) -> Dict[str, Factory]:
    def exitsafe_plain() -> Tuple[Callable[[], Any], Callable[[Any], None], Any]:
        registry = exitsafe.Registry("bench-memory")
        track = registry.track
        return (lambda: track(ptr, _noop)), (lambda h: h.release()), registry

    def exitsafe_dep() -> Tuple[Callable[[], Any], Callable[[Any], None], Any]:
        registry = exitsafe.Registry("bench-memory-dep")
        parent = registry.track(ptr, _noop)
        track = registry.track
        dep = (parent,)
        return (lambda: track(ptr, _noop, depends_on=dep)), (lambda h: h.release()), parent

    def finalize() -> Tuple[Callable[[], Any], Callable[[Any], None], Any]:
        fin = weakref.finalize
        target = Target()  # one watched object: the finalizer's own cost is measured
        return (lambda: fin(target, _noop, ptr)), (lambda f: f()), target

    def cffi_gc() -> Tuple[Callable[[], Any], Callable[[Any], None], Any]:
        gc_, rel = ffi.gc, ffi.release
        return (lambda: gc_(ptr, _noop)), rel, None

    return {
        "exitsafe_track": exitsafe_plain,
        "exitsafe_track_dep": exitsafe_dep,
        "weakref_finalize": finalize,
        "cffi_gc": cffi_gc,
    }


LABELS = {
    "exitsafe_track": "exitsafe: Registry.track",
    "exitsafe_track_dep": "exitsafe: track(depends_on=(parent,))",
    "weakref_finalize": "weakref.finalize",
    "cffi_gc": "cffi: ffi.gc",
}


def measure(factory: Factory, n: int) -> Tuple[float, float]:
    """Bytes per live handle, and bytes still allocated per handle once all are released."""
    create, release, keep = factory()
    out: List[Any] = [None] * n
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            out[i] = create()
        live = tracemalloc.get_traced_memory()[0] - base
        for obj in out:
            release(obj)
        for i in range(n):
            out[i] = None
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del keep
    return live / n, retained / n


def run(cfg: Config) -> Section:
    ffi = cffi.FFI()
    ptr = ffi.cast("void *", 0x1234)
    repeats = 2 if cfg.quick else 3
    results: Dict[str, Dict[str, Any]] = {}
    for name, factory in _contenders(ptr, ffi).items():
        lives, kept = [], []
        for _ in range(repeats):
            live, retained = measure(factory, cfg.memory_n)
            lives.append(live)
            kept.append(retained)
        results[name] = {
            "live_bytes_per_handle": statistics.median(lives),
            "retained_bytes_per_released_handle": statistics.median(kept),
            "live_values": lives,
            "retained_values": kept,
        }
    base = results["weakref_finalize"]["live_bytes_per_handle"]
    table = Table(
        f"Memory per handle (tracemalloc, {cfg.memory_n:,} handles, median of {repeats})",
        ["mechanism", "bytes per live handle", "vs finalize", "bytes kept after release"],
    )
    for name, row in results.items():
        table.add(
            LABELS[name],
            f"{row['live_bytes_per_handle']:,.0f}",
            f"{row['live_bytes_per_handle'] / base:.2f}x",
            f"{row['retained_bytes_per_released_handle']:,.0f}",
        )
    table.notes.append(
        "exitsafe keeps one ledger record per released handle, up to ledger_limit"
        " (100,000 by default, trimmed once a quarter more accumulated; ledger_limit=0 keeps"
        " counts only, trimmed every 1,024 records)"
    )
    data = {"n": cfg.memory_n, "repeats": repeats, "results": results}
    bars = []
    if exitsafe.lowlevel.CORE == "compiled":  # the bar is the compiled core's (the bars)
        bars.append(
            Bar(
                f"memory per live handle <= {BAR_BYTES_PER_HANDLE} B (compiled core)",
                results["exitsafe_track"]["live_bytes_per_handle"],
                BAR_BYTES_PER_HANDLE,
                "<=",
                "B",
            )
        )
    return Section("memory", data, [table], bars)

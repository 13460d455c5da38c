"""Teardown time against handle count, for wide and deep dependency graphs.

``Registry.teardown()`` is called directly (not at process exit) on a registry
holding ``n`` live handles:

* **wide**: a few parents (``Config.wide_parents``) and ``n - parents`` children,
  each depending on one parent (round robin): many children of few parents;
* **deep**: a chain, each handle depending on the previous one (up to 10^5).

Time per handle at each size, and its growth from one size to the next, show
whether teardown stays linear.  Building the graph is timed too (that is the cost
of ``track(depends_on=...)``), but it is not part of the teardown figure.
"""

from __future__ import annotations

import gc
from functools import partial
from time import perf_counter
from typing import Any, Dict, List, Tuple

import cffi

import exitsafe

from ._util import (
    Bar,
    Config,
    Section,
    Table,
    fmt_spread,
    fmt_time,
    profile_call,
    profile_table,
    progress,
    summarize,
)

SHAPE_LABELS = {"wide": "wide", "deep": "deep (chain)", "wide_leak": "wide, leak policy"}

#: "10^6 handles well under a few seconds" (DESIGN.md): checked as at most 3 s.
BAR_MILLION_SECONDS = 3.0
#: Linear growth: time per handle at the largest size at most this multiple of the smallest.
BAR_LINEAR_FACTOR = 2.0


def _noop(raw: object) -> None:
    """The release function: does nothing."""


def build_wide(
    n: int, parents: int, ptr: Any, exit_policy: str = "release"
) -> Tuple[exitsafe.Registry, List[Any]]:
    registry = exitsafe.Registry(f"bench-wide-{n}", exit_policy=exit_policy)
    track = registry.track
    tops = [track(ptr, _noop, kind="parent") for _ in range(min(parents, n))]
    deps = [(p,) for p in tops]
    k = len(deps)
    handles = tops + [track(ptr, _noop, depends_on=deps[i % k]) for i in range(n - len(tops))]
    return registry, handles


def build_deep(n: int, ptr: Any) -> Tuple[exitsafe.Registry, List[Any]]:
    registry = exitsafe.Registry(f"bench-deep-{n}")
    track = registry.track
    prev = track(ptr, _noop)
    handles = [prev]
    append = handles.append
    for _ in range(n - 1):
        prev = track(ptr, _noop, depends_on=(prev,))
        append(prev)
    return registry, handles


def measure(shape: str, n: int, cfg: Config, ptr: Any) -> Dict[str, Any]:
    """Build and tear down ``n`` handles ``repeats`` times; per-run build and teardown times."""
    builds: List[float] = []
    teardowns: List[float] = []
    ok = True
    for _ in range(cfg.teardown_repeats(n)):
        gc.collect()
        t0 = perf_counter()
        if shape == "wide":
            registry, handles = build_wide(n, cfg.wide_parents, ptr)
        elif shape == "wide_leak":
            registry, handles = build_wide(n, cfg.wide_parents, ptr, exit_policy="leak")
        else:
            registry, handles = build_deep(n, ptr)
        t1 = perf_counter()
        gc.collect()
        # The cyclic GC stays enabled: an exit-time teardown runs with it enabled too.
        t2 = perf_counter()
        registry.teardown(reason="benchmark")
        t3 = perf_counter()
        counts = registry.ledger_counts()
        if shape == "wide_leak":
            ok = ok and sum(counts.values()) == n and all(k.startswith("leaked_") for k in counts)
            ok = ok and all(h.state == "leaked" for h in (handles[0], handles[-1]))
        else:
            ok = ok and counts == {"released_at_exit": n}
            ok = ok and all(h.state == "released" for h in (handles[0], handles[-1]))
        ok = ok and len(registry) == 0
        builds.append(t1 - t0)
        teardowns.append(t3 - t2)
        del handles, registry
    return {
        "n": n,
        "shape": shape,
        "edges": n - 1 if shape == "deep" else n - min(cfg.wide_parents, n),
        "build_s": summarize(builds),
        "teardown_s": summarize(teardowns),
        "teardown_per_handle_s": summarize([t / n for t in teardowns]),
        "ledger_ok": ok,
    }


def run(cfg: Config) -> Section:
    _ffi = cffi.FFI()
    ptr = _ffi.cast("void *", 0x1234)
    results: Dict[str, List[Dict[str, Any]]] = {"wide": [], "deep": [], "wide_leak": []}
    leak_sizes = [n for n in cfg.teardown_wide if n <= 10**5]
    for shape, sizes in (
        ("wide", cfg.teardown_wide),
        ("deep", cfg.teardown_deep),
        ("wide_leak", leak_sizes),
    ):
        for n in sizes:
            progress(f"teardown {shape} n={n:,}")
            results[shape].append(measure(shape, n, cfg, ptr))

    table = Table(
        "Teardown: Registry.teardown() of n live handles (median of repeats)",
        [
            "graph",
            "handles",
            "repeats",
            "teardown",
            "spread",
            "per handle",
            "growth",
            "build per handle",
            "ledger",
        ],
    )
    growth: Dict[str, List[float]] = {}
    for shape, rows in results.items():
        growth[shape] = []
        prev = None
        for row in rows:
            per = row["teardown_per_handle_s"]["median"]
            total = row["teardown_s"]
            ratio = total["median"] / prev["teardown_s"]["median"] if prev else None
            size_ratio = row["n"] / prev["n"] if prev else None
            if ratio is not None and size_ratio is not None:
                growth[shape].append(ratio)
            row["growth_vs_previous"] = ratio
            table.add(
                SHAPE_LABELS[shape],
                f"{row['n']:,}",
                total["n"],
                fmt_time(total["median"]),
                fmt_spread(total),
                f"{per * 1e9:,.0f} ns",
                f"{ratio:.1f}x for {size_ratio:.0f}x" if ratio is not None else "-",
                f"{row['build_s']['median'] / row['n'] * 1e9:,.0f} ns",
                "ok" if row["ledger_ok"] else "MISMATCH",
            )
            prev = row
    table.notes.append(
        f"wide: {cfg.wide_parents} parents, every other handle depends on one of them;"
        " deep: a chain; growth = teardown time ratio to the previous size (linear = size ratio)"
    )
    table.notes.append(
        "wide, leak policy: the same wide graph in a registry with exit_policy='leak'"
        " (every handle leaked: the path EXITSAFE_AT_EXIT=leak takes)"
    )

    bars: List[Bar] = []
    for shape in ("wide", "deep"):
        rows = results[shape]
        per_first = rows[0]["teardown_per_handle_s"]["median"]
        per_last = rows[-1]["teardown_per_handle_s"]["median"]
        bars.append(
            Bar(
                f"teardown linear ({shape}): per-handle time at {rows[-1]['n']:,}"
                f" <= {BAR_LINEAR_FACTOR:g}x that at {rows[0]['n']:,}",
                per_last / per_first,
                BAR_LINEAR_FACTOR,
                "<=",
                "x",
            )
        )
    million = [r for r in results["wide"] if r["n"] == 10**6]
    if million:
        bars.append(
            Bar(
                f"teardown of 10^6 handles (wide) <= {BAR_MILLION_SECONDS:g} s",
                million[0]["teardown_s"]["median"],
                BAR_MILLION_SECONDS,
                "<=",
                "s",
            )
        )
    chains = [r for r in results["deep"] if r["n"] >= 10**5]
    if chains:
        bars.append(
            Bar(
                f"chain of {chains[-1]['n']:,} tears down without RecursionError",
                1.0 if chains[-1]["ledger_ok"] else 0.0,
                1.0,
                ">=",
                "",
            )
        )
    n_prof = cfg.teardown_wide[-2] if len(cfg.teardown_wide) > 1 else cfg.teardown_wide[0]
    progress(f"teardown profile n={n_prof:,}")
    registry, handles = build_wide(n_prof, cfg.wide_parents, ptr)
    gc.collect()
    prof = profile_call(partial(registry.teardown, reason="benchmark"), n_prof)
    handles.clear()
    prof_table = profile_table(
        f"Profile of Registry.teardown() over {n_prof:,} handles, wide graph (cProfile)", prof
    )
    data = {
        "profile": prof,
        "wide_parents": cfg.wide_parents,
        "gc_enabled_during_teardown": True,
        "wide": results["wide"],
        "deep": results["deep"],
        "wide_leak": results["wide_leak"],
    }
    return Section("teardown", data, [table, prof_table], bars)

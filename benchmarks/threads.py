"""Throughput of concurrent track + release, and a check that no update is lost.

The same total number of track + release pairs is run by one thread, then split
across 2 (and 4) threads that start together on a barrier, all on one registry.
The throughput ratio (threads / one thread) should stay close to 1 under the GIL
(the work cannot run in parallel; the question is what contention costs).  After
each run the ledger must count exactly one ``released`` per pair and nothing may
be left live.  A second workload has every thread's handles depend on one shared
parent, which concentrates the contention on that parent's dependent count: after
it, releasing the parent must release it natively (its count went back to zero).
"""

from __future__ import annotations

import sys
import threading
from time import perf_counter
from typing import Any, Callable, Dict, List

import cffi

import exitsafe

from ._util import Bar, Config, Section, Table, fmt_spread, paired_ratios, progress, summarize
from .floor import LockedRegistry, MinimalRegistry

#: "two threads tracking and releasing concurrently keep most of single-thread throughput"
BAR_THROUGHPUT = 0.8


def _noop(raw: object) -> None:
    """The release function: does nothing."""


def run_once(threads: int, total: int, shared_parent: bool, ptr: Any) -> Dict[str, Any]:
    registry = exitsafe.Registry(f"bench-threads-{threads}")
    parent = registry.track(ptr, _noop, kind="parent") if shared_parent else None
    dep = (parent,) if parent is not None else ()
    per_thread = total // threads
    barrier = threading.Barrier(threads + 1)
    errors: List[BaseException] = []

    def work() -> None:
        track = registry.track
        try:
            barrier.wait()
            if dep:
                for _ in range(per_thread):
                    track(ptr, _noop, depends_on=dep).release()
            else:
                for _ in range(per_thread):
                    track(ptr, _noop).release()
        except BaseException as exc:  # reported in the results
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = perf_counter()
    for w in workers:
        w.join()
    elapsed = perf_counter() - t0
    ops = per_thread * threads
    live = len(registry) - (1 if parent is not None else 0)
    parent_ok = True
    ops_expected = ops
    if parent is not None:
        parent.release()
        parent_ok = parent.state == "released"
        ops_expected += 1
    counts = registry.ledger_counts()
    ok = (
        not errors
        and counts == {"released": ops_expected}
        and live == 0
        and parent_ok
        and len(registry) == 0
    )
    return {
        "threads": threads,
        "ops": ops,
        "seconds": elapsed,
        "ops_per_s": ops / elapsed,
        "released": counts.get("released", 0),
        "expected_released": ops_expected,
        "live_left": live,
        "parent_released": parent_ok,
        "errors": [repr(e) for e in errors],
        "ok": ok,
    }


def run_reference(threads: int, total: int, make: Callable[[], Any], ptr: Any) -> float:
    """Throughput (pairs per second) of a reference tracker from :mod:`benchmarks.floor`."""
    registry = make()
    per_thread = total // threads
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        track = registry.track
        barrier.wait()
        for _ in range(per_thread):
            track(ptr, _noop).release()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = perf_counter()
    for w in workers:
        w.join()
    return per_thread * threads / (perf_counter() - t0)


REFERENCES: Dict[str, Callable[[], Any]] = {
    "reference_locked": LockedRegistry,
    "reference_no_lock": MinimalRegistry,
}


def run(cfg: Config) -> Section:
    ptr = cffi.FFI().cast("void *", 0x1234)
    workloads = {"independent": False, "shared_parent": True}
    results: Dict[str, Dict[str, Any]] = {}
    for workload, shared in workloads.items():
        progress(f"threads workload={workload}")
        runs: Dict[int, List[Dict[str, Any]]] = {t: [] for t in cfg.thread_counts}
        for _ in range(cfg.thread_repeats):
            for t in cfg.thread_counts:
                runs[t].append(run_once(t, cfg.thread_ops, shared, ptr))
        one = [r["ops_per_s"] for r in runs[1]]
        results[workload] = {
            str(t): {
                "ops_per_s": summarize([r["ops_per_s"] for r in rs]),
                "ratio_vs_one_thread": summarize(paired_ratios([r["ops_per_s"] for r in rs], one)),
                "all_ok": all(r["ok"] for r in rs),
                "runs": rs,
            }
            for t, rs in runs.items()
        }

    for ref_name, make in REFERENCES.items():
        progress(f"threads workload={ref_name}")
        speeds: Dict[int, List[float]] = {t: [] for t in cfg.thread_counts}
        for _ in range(cfg.thread_repeats):
            for t in cfg.thread_counts:
                speeds[t].append(run_reference(t, cfg.thread_ops, make, ptr))
        results[ref_name] = {
            str(t): {
                "ops_per_s": summarize(v),
                "ratio_vs_one_thread": summarize(paired_ratios(v, speeds[1])),
                "all_ok": None,
            }
            for t, v in speeds.items()
        }

    table = Table(
        f"Threads: {cfg.thread_ops:,} track + release pairs split across threads"
        f" (median of {cfg.thread_repeats})",
        ["workload", "threads", "ops/s", "spread", "vs 1 thread", "no lost update"],
    )
    for workload, rows in results.items():
        for t, row in rows.items():
            table.add(
                workload.replace("_", " "),
                t,
                f"{row['ops_per_s']['median']:,.0f}",
                fmt_spread(row["ops_per_s"]),
                f"{row['ratio_vs_one_thread']['median']:.2f}x",
                "n/a" if row["all_ok"] is None else "yes" if row["all_ok"] else "NO",
            )
    table.notes.append(
        f"switch interval {sys.getswitchinterval() * 1e3:g} ms; no lost update = ledger counts"
        " one 'released' per pair, nothing left live, shared parent released at the end"
    )
    table.notes.append(
        "reference rows: the minimal pure-Python trackers of benchmarks/floor.py"
        " (one lock section in track and one in release; no lock at all)"
    )
    bars = []
    if "2" in results["independent"]:
        two = results["independent"]["2"]["ratio_vs_one_thread"]
        bars.append(
            Bar(
                f"2 threads keep >= {BAR_THROUGHPUT:g}x single-thread throughput",
                two["median"],
                BAR_THROUGHPUT,
                ">=",
                "x",
                f"IQR {two['p25']:.2f}-{two['p75']:.2f} over {two['n']} runs",
            )
        )
    all_ok = all(row["all_ok"] for w in workloads for row in results[w].values())
    bars.append(
        Bar(
            "concurrent track + release loses no update (ledger == operations)",
            1.0 if all_ok else 0.0,
            1.0,
            ">=",
        )
    )
    data = {
        "total_ops": cfg.thread_ops,
        "repeats": cfg.thread_repeats,
        "switch_interval_s": sys.getswitchinterval(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "workloads": results,
    }
    return Section("threads", data, [table], bars)

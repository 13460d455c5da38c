"""The cost of one registration as registrations pile up: ``python -m benchmarks.registrations``.

Every registration must cost O(1) amortized, however many objects are registered already:
``neutralize_at_exit`` swept every object neutralized so far at each call, inside the lock,
so that 8,000 calls after 7,000 took 37 s.  For each kind of registration this makes
``--calls`` calls (default 10^5) on one fresh registry, keeping every registered object
alive (the worst case for anything that scans what is registered), and compares the
time per call of the last tenth of the calls with that of the first tenth:

* ``late / early`` about 1: a constant cost per call (below 4: what a table grown past
  the caches adds on a busy machine);
* far above: a cost growing with the registrations made, quadratic in total (the sweep
  ``neutralize_at_exit`` made at each call: 111 at 2 x 10^4 calls).

``--collected`` variants let each object go right after its call (for
``neutralize_at_exit``: a hook to cancel per object).  No bar fails the run; the table is
for reading (``--json PATH`` writes the numbers too).  No test asserts a time: see
``tests/adversarial/test_registration_cost.py`` for the same property counted in steps.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: python benchmarks/registrations.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

import exitsafe
from exitsafe import ctypes as es_ctypes
from exitsafe.lowlevel import CORE

from ._util import gc_paused


class Catalog:
    """A third-party object holding a native handle (weakly referenceable)."""

    def __init__(self) -> None:
        self._handle: Optional[int] = 1

    def close(self) -> None:
        self._handle = None


def _noop(raw: object) -> None:
    pass


#: name -> fn(registry, i, keep) making registration i (appending what must stay alive).
Kind = Callable[[exitsafe.Registry, int, List[Any]], None]


def _kinds(calls: int) -> Dict[str, Kind]:
    buffer = ctypes.create_string_buffer(calls)  # distinct native addresses
    base = ctypes.addressof(buffer)
    parent: List[Any] = []

    def neutralize(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        obj = Catalog()
        exitsafe.lowlevel.neutralize_at_exit(obj, registry=reg)
        keep.append(obj)

    def neutralize_collected(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        exitsafe.lowlevel.neutralize_at_exit(Catalog(), registry=reg)

    def on_teardown(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        reg.on_teardown(_noop_hook)

    def track(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        keep.append(reg.track(i, _noop))

    def track_child(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        if not parent or parent[0].registry is not reg:
            parent[:] = [reg.track("parent", _noop)]
        keep.append(reg.track(i, _noop, depends_on=[parent[0]]))

    def adopt(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        keep.append(exitsafe.adopt(Catalog(), registry=reg))

    def ctypes_track(reg: exitsafe.Registry, i: int, keep: List[Any]) -> None:
        keep.append(es_ctypes.track(base + i, _noop, registry=reg))

    keep_buffer.append(buffer)
    return {
        "neutralize_at_exit": neutralize,
        "neutralize_at_exit (collected)": neutralize_collected,
        "on_teardown": on_teardown,
        "track": track,
        "track (depends_on one parent)": track_child,
        "adopt": adopt,
        "exitsafe.ctypes.track": ctypes_track,
    }


keep_buffer: List[Any] = []


def _noop_hook() -> None:
    pass


#: Each tenth is timed in this many chunks; its time per call is the fastest chunk's
#: (what another process on a busy machine adds is never negative).
CHUNKS = 10


def _window(kind: Kind, reg: exitsafe.Registry, keep: List[Any], start: int, n: int) -> float:
    size = max(1, n // CHUNKS)
    best = float("inf")
    for first in range(start, start + n, size):
        last = min(first + size, start + n)
        t0 = perf_counter()
        for i in range(first, last):
            kind(reg, i, keep)
        best = min(best, (perf_counter() - t0) / (last - first))
    return best


def measure(kind: Kind, calls: int) -> Dict[str, float]:
    """Seconds per call of the first and of the last tenth of ``calls`` registrations."""
    reg = exitsafe.Registry("bench-registrations", ledger_limit=0)
    keep: List[Any] = []
    tenth = max(1, calls // 10)
    with gc_paused():
        early = _window(kind, reg, keep, 0, tenth)
        for i in range(tenth, calls - tenth):
            kind(reg, i, keep)
        late = _window(kind, reg, keep, calls - tenth, tenth)
    reg.teardown()
    keep.clear()
    return {"early_ns": early * 1e9, "late_ns": late * 1e9, "ratio": late / early}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--only", help="comma-separated kinds (substrings)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    kinds = _kinds(args.calls)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        kinds = {k: v for k, v in kinds.items() if any(w in k for w in wanted)}
    print(
        f"registrations: {args.calls} calls each, {CORE} core, CPython "
        f"{sys.version.split()[0]}; late / early = time per call of the last tenth / the first"
    )
    print(f"{'kind':32} {'early ns':>10} {'late ns':>10} {'late/early':>10}")
    results = {}
    for name, kind in kinds.items():
        r = results[name] = measure(kind, args.calls)
        verdict = "O(1)" if r["ratio"] < 4 else "GROWS"
        print(
            f"{name:32} {r['early_ns']:10.0f} {r['late_ns']:10.0f} {r['ratio']:10.2f}  {verdict}",
            flush=True,
        )
    if args.json:
        args.json.write_text(
            json.dumps({"calls": args.calls, "core": CORE, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The cost of automatic borrowing around a native call (``exitsafe.cffi.call``).

Contenders, each calling the same cheap native function (libc's ``abs``) through cffi's
ABI mode, interleaved in short rounds (see ``_util.interleaved``):

* a plain call: ``lib.abs(x)``;
* ``exitsafe.cffi.call(lib.abs, h)`` with one handle argument: borrowed for the call;
* ``with h.borrow() as raw: lib.abs(raw)``: the same by hand;
* a function of ``exitsafe.cffi.borrowing(lib)``, the library view.

Reported as nanoseconds per call and as the extra cost over the plain call, median of
the per-round differences.  No bar: the point is a number a binding author can weigh.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import cffi

import exitsafe
from exitsafe import cffi as es_cffi

from ._util import Config, Section, Table, fmt_spread, interleaved, summarize


def make_loops() -> Dict[str, Callable[[int], float]]:
    from time import perf_counter

    ffi = cffi.FFI()
    ffi.cdef("int abs(int);")
    lib = ffi.dlopen(None)
    registry = exitsafe.Registry("bench-calls", ledger_limit=0)
    handle = registry.track(-7, lambda raw: None, kind="value")
    view = es_cffi.borrowing(lib)
    fn = lib.abs
    call = es_cffi.call

    def plain(n: int) -> float:
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            fn(-7)
        return perf_counter() - t0

    def auto(n: int) -> float:
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            call(fn, handle)
        return perf_counter() - t0

    def by_hand(n: int) -> float:
        rng = range(n)
        t0 = perf_counter()
        for _ in rng:
            with handle.borrow() as raw:
                fn(raw)
        return perf_counter() - t0

    def library_view(n: int) -> float:
        rng = range(n)
        view_abs = view.abs
        t0 = perf_counter()
        for _ in rng:
            view_abs(handle)
        return perf_counter() - t0

    return {
        "plain": plain,
        "call": auto,
        "borrow": by_hand,
        "borrowing_view": library_view,
    }


LABELS = {
    "plain": "plain cffi call lib.abs(x)",
    "call": "exitsafe.cffi.call(lib.abs, handle)",
    "borrow": "with handle.borrow() as raw: lib.abs(raw)",
    "borrowing_view": "exitsafe.cffi.borrowing(lib).abs(handle)",
}


def run(cfg: Config) -> Section:
    loops = make_loops()
    per_op = interleaved(loops, cfg.hot_n, cfg.hot_repeats)
    base = per_op["plain"]
    data: Dict[str, Any] = {}
    table = Table(
        "Automatic borrow: cost per native call (median over rounds)",
        ["call", "ns/call", "spread", "extra over a plain call"],
    )
    for name, label in LABELS.items():
        summary = summarize(per_op[name])
        extra = summarize([a - b for a, b in zip(per_op[name], base)])
        data[name] = {"per_call": summary, "extra": extra}
        table.add(
            label,
            f"{summary['median'] * 1e9:,.0f} ns",
            fmt_spread(summary),
            "-" if name == "plain" else f"{extra['median'] * 1e9:,.0f} ns",
        )
    table.notes.append(
        f"{cfg.hot_repeats} rounds x {cfg.hot_n:,} calls per contender, interleaved; the extra"
        " cost is the median of the per-round differences"
    )
    return Section("calls", data, [table])

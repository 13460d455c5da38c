"""Each registration costs O(1) amortized, counted in steps, not in time.

``neutralize_at_exit`` swept every object neutralized so far at each call (inside the
lock): 8,000 calls after 7,000 took 37 s.  Here the work of a call is the number of trace
events (calls and lines) it runs in exitsafe's code: the calls made after ``CALLS``
registrations must do as much work as the first ones, every registered object still
alive (the worst case for a sweep).  ``benchmarks/registrations.py`` measures the same in
time, at 10^5 calls.
"""

from __future__ import annotations

import json

import pytest

from ..support import run_py

CORES = {"compiled": "0", "python": "1"}
#: Registrations made between the two measured windows.
CALLS = 3000
#: Calls per measured window.
WINDOW = 200

PROGRAM = """
import gc, json, os, sys
import exitsafe

PKG = os.path.dirname(exitsafe.__file__) + os.sep
steps = [0]


def tracer(frame, event, arg):
    if frame.f_code.co_filename.startswith(PKG):
        steps[0] += 1
        return local
    return None


def local(frame, event, arg):
    steps[0] += 1
    return local


class Catalog:
    def __init__(self):
        self._handle = 1

    def close(self):
        self._handle = None


def noop(raw):
    pass


def neutralize(reg, keep):
    obj = Catalog()
    exitsafe.lowlevel.neutralize_at_exit(obj, registry=reg)
    keep.append(obj)


def neutralize_collected(reg, keep):
    # collected at once: its hook goes
    exitsafe.lowlevel.neutralize_at_exit(Catalog(), registry=reg)


def on_teardown(reg, keep):
    keep.append(reg.on_teardown(lambda: None))


def adopt(reg, keep):
    keep.append(exitsafe.adopt(Catalog(), registry=reg))


def track_child(reg, keep):
    if not keep:
        keep.append(reg.track("parent", noop))
    keep.append(reg.track(len(keep), noop, depends_on=[keep[0]]))


def window(kind, reg, keep, n):
    gc.collect()
    start = steps[0]
    sys.settrace(tracer)
    try:
        for _ in range(n):
            kind(reg, keep)
    finally:
        sys.settrace(None)
    return steps[0] - start


out = {}
for name, kind in [("neutralize_at_exit", neutralize),
                   ("neutralize_at_exit, objects collected", neutralize_collected),
                   ("on_teardown", on_teardown), ("adopt", adopt),
                   ("track with depends_on", track_child)]:
    reg = exitsafe.Registry("cost", ledger_limit=0)
    keep = []
    first = window(kind, reg, keep, WINDOW)
    for _ in range(CALLS):
        kind(reg, keep)
    last = window(kind, reg, keep, WINDOW)
    out[name] = [first, last, len(reg)]
    reg.teardown()
print(json.dumps(out))
"""


@pytest.mark.parametrize("core", list(CORES))
def test_registrations_cost_as_much_late_as_early(tmp_path, core):
    program = f"CALLS = {CALLS}\nWINDOW = {WINDOW}\n" + PROGRAM
    run = run_py(program, tmp_path, env={"EXITSAFE_PURE_PYTHON": CORES[core]}, timeout=300)
    assert run.returncode == 0, run.describe()
    results = json.loads(run.stdout)
    growing = {
        name: f"{first / WINDOW:.0f} steps per call at first, {last / WINDOW:.0f} after "
        f"{CALLS} more (live: {live})"
        for name, (first, last, live) in results.items()
        if last > 1.2 * first + WINDOW
    }
    assert not growing, growing
    # the collected objects' hooks were cancelled, not kept: at most one left pending
    assert results["neutralize_at_exit, objects collected"][2] <= 1, results

"""The ledger file's counts and entries come from one moment.

Threads that keep registering while the process exits add ``leaked_after_close`` records
while the ledger is being written.  The counts were read apart from the entries, each
under the lock but not under the same hold: "counts sum 137403, entries 203381,
dropped_entries 0".  Here another thread registers at *every* step exitsafe takes on the
exiting thread outside its lock once the registries are closed (a tracer on the exiting
thread asks that thread, started before the exit, and waits for it), which forces every
interleaving such a thread could produce.
"""

from __future__ import annotations

import pytest

from ..support import assert_clean, run_program

CORES = {"compiled": "0", "python": "1"}

BODY = """
    import atexit
    from exitsafe import _sync

    PKG = os.path.dirname(exitsafe.__file__) + os.sep
    regs = [
        exitsafe.Registry("busy", ledger_limit=None),
        exitsafe.Registry("capped", ledger_limit=3),
    ]
    keep = [reg.track(i, record, name=f"{reg.name}{i}") for reg in regs for i in range(5)]
    late = [0]
    # The other thread is started now and asked for each registration: CPython 3.12
    # refuses to start a thread in an atexit callback ("can't create new thread at
    # interpreter shutdown", python/cpython#104690, allowed again in 3.13), and a daemon
    # thread started before still runs there.
    ask, done = threading.Event(), threading.Event()

    def serve():
        while True:
            ask.wait()
            ask.clear()
            try:
                for reg in regs:
                    reg.track("late", record, name=f"late{late[0]}")
                late[0] += 1
            finally:
                done.set()

    threading.Thread(target=serve, name="late registrations", daemon=True).start()

    def register_from_another_thread():
        done.clear()
        ask.set()
        done.wait()

    from exitsafe import _collection

    def tracer(frame, event, arg):
        # (not exitsafe's garbage-collector callback: no step of the exit, and a thread
        # started inside a collection's callback may wait for that collection to end)
        if not frame.f_code.co_filename.startswith(PKG) or (
            frame.f_code is _collection._on_collection.__code__
        ):
            return None
        if event == "line" and all(r.closed for r in regs) and not _sync.reentered():
            sys.settrace(None)  # (not while the other thread runs exitsafe)
            try:
                register_from_another_thread()
            finally:
                sys.settrace(tracer)
        return tracer

    def trace_the_exit():  # runs before exitsafe's exit teardown (atexit: last in, first out)
        sys.settrace(tracer)

    atexit.register(trace_the_exit)
"""


@pytest.mark.parametrize("core", list(CORES))
def test_the_ledger_files_counts_and_entries_agree_under_registrations_during_the_exit(
    tmp_path, core
):
    run = run_program(BODY, tmp_path, ledger=True, env={"EXITSAFE_PURE_PYTHON": CORES[core]})
    assert_clean(run)
    data = run.ledger()
    by_name = {r["name"]: r for r in data["registries"]}
    busy, capped = by_name["busy"], by_name["capped"]
    assert busy["counts"].get("leaked_after_close", 0) > 1, busy  # the hazard was forced
    # nothing dropped: the counts are the entries
    assert busy["dropped_entries"] == 0
    assert sum(busy["counts"].values()) == len(busy["entries"]), (
        busy["counts"],
        len(busy["entries"]),
    )
    counted = {}
    for entry in busy["entries"]:
        counted[entry["outcome"]] = counted.get(entry["outcome"], 0) + 1
    assert counted == busy["counts"]
    assert busy["counts"]["released_at_exit"] == 5
    # a capped ledger: the counts are the entries kept plus those dropped
    assert len(capped["entries"]) == 3
    assert sum(capped["counts"].values()) == 3 + capped["dropped_entries"], capped
    assert capped["counts"]["released_at_exit"] == 5

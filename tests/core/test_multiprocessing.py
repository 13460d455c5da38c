"""Multiprocessing workers run the teardown of the handles they created when they end
normally, with every start method and every kind of pool; inherited handles stay
``leaked_inherited`` there, and each worker writes its own ledger."""

from __future__ import annotations

import json
import multiprocessing
import sys

import pytest

from ..support import assert_clean, run_program

PROGRAM = """
    import concurrent.futures
    import multiprocessing

    KEEP = []

    def release(raw):
        record(f"{os.getpid()} {raw}")

    def work(i):
        parent = exitsafe.track(f"w{i}-parent", release, name=f"w{i}-parent")
        child = exitsafe.track(f"w{i}-child", release, name=f"w{i}-child", depends_on=[parent])
        KEEP.append(child)  # alive until the worker ends: released by its teardown
        del parent
        return os.getpid()

    if __name__ == "__main__":
        inherited = exitsafe.track("main-handle", release, name="main-handle")
        ctx = multiprocessing.get_context(METHOD)
        if KIND == "Process":
            procs = [ctx.Process(target=work, args=(i,)) for i in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
                record(f"exitcode {p.exitcode}")
        elif KIND == "Pool":
            pool = ctx.Pool(2)
            pool.map(work, range(4), chunksize=1)
            pool.close()
            pool.join()
        else:
            with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
                list(pool.map(work, range(4)))
        record(f"main {os.getpid()}")
"""

METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()
]
KINDS = ["Process", "Pool", "ProcessPoolExecutor"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_workers_tear_down_what_they_created(tmp_path, method, kind):
    body = PROGRAM.replace("METHOD", repr(method)).replace("KIND", repr(kind))
    run = run_program(
        body,
        tmp_path,
        env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json")},
        timeout=120,
    )
    assert_clean(run, allow=("DeprecationWarning",))  # 3.12+: fork with threads
    main = next(x for x in run.order if x.startswith("main ")).split()[1]
    tasks = 2 if kind == "Process" else 4
    releases = [x.split() for x in run.order if x.split()[-1].startswith(("w", "main-"))]
    for i in range(tasks):
        lines = [(pid, raw) for pid, raw in releases if raw.startswith(f"w{i}-")]
        assert [raw for _, raw in lines] == [f"w{i}-child", f"w{i}-parent"], lines
        assert lines[0][0] == lines[1][0] != main, "released in the worker, in order"
    assert [pid for pid, raw in releases if raw == "main-handle"] == [main], "once, by main"
    ledgers = [json.loads(p.read_text()) for p in tmp_path.glob("ledger-*.json")]
    workers = [d for d in ledgers if str(d["pid"]) != main]
    worker_pids = {pid for pid, raw in releases if raw.startswith("w")}
    assert {str(d["pid"]) for d in workers} >= worker_pids, "each worker wrote its ledger"
    for data in workers:
        outcomes = {e["name"]: e["outcome"] for r in data["registries"] for e in r["entries"]}
        mine = {k: v for k, v in outcomes.items() if k.startswith("w")}
        # a pool worker may have run no task: then it released nothing
        assert set(mine.values()) <= {"released_at_exit"}, outcomes
        assert bool(mine) == (str(data["pid"]) in worker_pids), outcomes
        if "main-handle" in outcomes:  # a fork (or a forkserver with exitsafe preloaded)
            assert outcomes["main-handle"] == "leaked_inherited"
    if kind == "Process":
        assert run.order.count("exitcode 0") == 2


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_with_pool_terminates_workers_and_nothing_runs_there(tmp_path):
    # ``with Pool()`` ends with terminate(): SIGTERM, no teardown in the workers.  The
    # documented limit; the parent's own handles are still released by the parent.
    body = PROGRAM.replace("METHOD", repr("fork")).replace("KIND", repr("Pool")).replace(
        """            pool = ctx.Pool(2)
            pool.map(work, range(4), chunksize=1)
            pool.close()
            pool.join()""",
        """            with ctx.Pool(2) as pool:
                pool.map(work, range(4), chunksize=1)""",
    )
    run = run_program(body, tmp_path, timeout=120)
    assert_clean(run, allow=("DeprecationWarning",))
    main = next(x for x in run.order if x.startswith("main ")).split()[1]
    assert [x for x in run.order if x.endswith("main-handle")] == [f"{main} main-handle"]


TERMINATED = """
    import functools
    import multiprocessing
    from exitsafe.signals import teardown_on_signals

    KEEP = []

    def release(raw):
        record(f"{os.getpid()} {raw}")

    def work(i):
        KEEP.append(exitsafe.track(f"w{i}", release, name=f"w{i}"))
        return os.getpid()

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(METHOD)
        # The recipe (docs/fork.md): each worker turns SIGTERM (what terminate() sends)
        # into its teardown; watch=True wakes an idle worker whose lock wait began just
        # after the signal landed (without it, 1 hang seen in a CI run on 3.14).
        init = functools.partial(teardown_on_signals, "SIGTERM", mode="immediate", watch=True)
        with ctx.Pool(2, initializer=init) as pool:  # ends with terminate()
            pids = set(pool.map(work, range(4), chunksize=1))
        record(f"main {sorted(pids)}")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@pytest.mark.parametrize("method", METHODS)
def test_with_pool_terminated_workers_tear_down_with_the_signal_recipe(tmp_path, method):
    run = run_program(TERMINATED.replace("METHOD", repr(method)), tmp_path, timeout=120)
    assert_clean(run, allow=("DeprecationWarning",))
    assert "failed" not in run.stderr
    released = sorted(x.split()[1] for x in run.order if not x.startswith("main "))
    assert released == ["w0", "w1", "w2", "w3"], run.describe()


def test_the_immediate_handler_imports_nothing(tmp_path):
    # A second signal landing while the first one's handler imported the teardown's
    # modules found them half-executed (a terminated pool worker released nothing):
    # installing the handler imports them.
    body = """
    import signal
    from exitsafe.signals import teardown_on_signals

    teardown_on_signals("SIGTERM", mode="immediate")
    imported = []
    sys.addaudithook(lambda event, args: event == "import" and imported.append(args[0]))

    def release(raw):
        record("imported in the handler: " + ",".join(imported))

    h = exitsafe.track("x", release, name="x")
    os.kill(os.getpid(), signal.SIGTERM)
    """
    run = run_program(body, tmp_path)
    assert run.returncode == -15
    assert run.order == ["imported in the handler: "]

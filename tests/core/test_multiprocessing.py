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
    import multiprocessing
    from exitsafe.signals import pool_initializer

    KEEP = []

    def release(raw):
        record(f"{os.getpid()} {raw}")

    def opened(name):
        record(f"{os.getpid()} init {name}")

    def work(i):
        KEEP.append(exitsafe.track(f"w{i}", release, name=f"w{i}"))
        return os.getpid()

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(METHOD)
        # The recipe (docs/fork.md): each worker turns SIGTERM (what terminate() sends)
        # into its teardown, then runs the pool's own initializer with its initargs.
        with ctx.Pool(2, initializer=INITIALIZER, initargs=INITARGS) as pool:  # terminate()
            pids = set(pool.map(work, range(4), chunksize=1))
        record(f"main {sorted(pids)}")
"""

RECIPES = {
    "no-init": ("pool_initializer()", "()"),
    "init": ("pool_initializer(opened)", "('shard',)"),
}


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("method", METHODS)
def test_with_pool_terminated_workers_tear_down_with_the_pool_initializer(
    tmp_path, method, recipe
):
    initializer, initargs = RECIPES[recipe]
    body = (
        TERMINATED.replace("METHOD", repr(method))
        .replace("INITIALIZER", initializer)
        .replace("INITARGS", initargs)
    )
    run = run_program(body, tmp_path, timeout=120)
    assert_clean(run, allow=("DeprecationWarning",))
    assert "failed" not in run.stderr
    released = sorted(x.split()[1] for x in run.order if x.split()[1].startswith("w"))
    assert released == ["w0", "w1", "w2", "w3"], run.describe()
    inits = [x for x in run.order if " init " in x]
    assert bool(inits) == (recipe == "init"), run.describe()
    assert all(x.endswith(" init shard") for x in inits), run.describe()


SIGNALLED_IN_INIT = """
    import multiprocessing
    import signal
    import time
    from exitsafe.signals import pool_initializer

    HELD = []

    def release(raw):
        record(f"{os.getpid()} closed {raw}")

    def init(marker):
        raw = f"shard-{os.getpid()}"
        record(f"{os.getpid()} opened {raw}")
        try:  # (the first worker only: its replacements start normally)
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGTERM)  # between the open and the adoption
            time.sleep(0.2)  # (a handler not held back would run here)
        except FileExistsError:
            pass
        HELD.append(exitsafe.track(raw, release, name=raw))

    def work(i):
        return os.getpid()

    if __name__ == "__main__":
        ctx = multiprocessing.get_context(METHOD)
        marker = os.path.join(os.getcwd(), "signalled")
        pool = ctx.Pool(1, initializer=pool_initializer(init), initargs=(marker,))
        pids = set(pool.map(work, range(4), chunksize=1))
        pool.close()
        pool.join()
        record(f"main {sorted(pids)}")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@pytest.mark.parametrize("method", METHODS)
def test_a_sigterm_during_the_pools_own_initializer_tears_down_after_it(tmp_path, method):
    # The worker sends itself SIGTERM between opening its object and adopting it: the
    # teardown is held back until the initializer returned, so it closes the object,
    # and the worker then dies by SIGTERM (the pool replaces it and carries on).
    body = SIGNALLED_IN_INIT.replace("METHOD", repr(method))
    run = run_program(body, tmp_path, timeout=120)
    assert_clean(run, allow=("DeprecationWarning",))
    opened = [x.split()[2] for x in run.order if " opened " in x]
    closed = [x.split()[2] for x in run.order if " closed " in x]
    assert len(opened) >= 2, run.describe()  # the signalled worker and its replacement
    signalled = opened[0]
    assert signalled in closed, f"the signalled worker's object was never closed\n{run.describe()}"
    main = next(x for x in run.order if x.startswith("main "))
    assert signalled.split("-")[1] not in main, "the signalled worker ran no task"


def test_pool_initializer_refuses_what_is_not_an_initializer():
    from exitsafe.signals import pool_initializer

    with pytest.raises(TypeError, match=r"pool_initializer.*got int"):
        pool_initializer(5)  # type: ignore[arg-type]


def test_pool_initializer_pickles_with_the_pools_initializer():
    import pickle

    from exitsafe.signals import pool_initializer

    wrapped = pickle.loads(pickle.dumps(pool_initializer(json.dumps)))
    assert wrapped.init is json.dumps  # type: ignore[attr-defined]
    assert repr(wrapped) == f"exitsafe.signals.pool_initializer({json.dumps!r})"


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


@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_pool_initializer_in_a_worker_that_inherited_a_wakeup_fd(tmp_path):
    # A parent that set a wakeup fd (an asyncio loop's signal handlers, Twisted, Trio):
    # its forked workers cannot be watched.  The handler goes in without the watcher, with
    # a warning; before, every worker failed its initializer and the pool started new ones
    # for ever.  A terminated worker still tears down.
    body = """
    import multiprocessing, signal
    from exitsafe.signals import pool_initializer

    KEEP = []

    def work(i):
        KEEP.append(exitsafe.track(f"w{i}", lambda raw: record(f"released {raw}"), name=f"w{i}"))
        return i * i

    if __name__ == "__main__":
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        with multiprocessing.get_context("fork").Pool(1, initializer=pool_initializer()) as pool:
            result = pool.map_async(work, range(3))
            record(f"ready {result.wait(30) or result.ready()}")
    """
    run = run_program(body, tmp_path, timeout=60)
    assert_clean(run, allow=("DeprecationWarning",))
    assert "ready True" in run.order, run.describe()
    assert sorted(x for x in run.order if x.startswith("released")) == [
        "released w0", "released w1", "released w2",
    ], run.describe()
    assert "installed without the watcher" in run.stderr


def test_pool_initializer_in_a_thread_pool_runs_the_init_and_says_why_nothing_else(tmp_path):
    body = """
    from multiprocessing.pool import ThreadPool
    from exitsafe.signals import pool_initializer

    pool = ThreadPool(2, initializer=pool_initializer(record), initargs=("init",))
    result = pool.map_async(abs, [-1, -2])
    record(f"ready {result.wait(30) or result.ready()}")
    # close and join, not terminate (the with block's): a ThreadPool's terminate leaves its
    # daemon threads to the exit, and a worker not scheduled yet never runs its initializer
    # (1 init of 2 once in CI under load); join waits for both, each init first
    pool.close()
    pool.join()
    """
    run = run_program(body, tmp_path, timeout=60)
    assert_clean(run)
    assert run.order.count("init") == 2 and "ready True" in run.order, run.describe()
    assert "pool_initializer() ran off the main thread" in run.stderr

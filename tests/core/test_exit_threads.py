"""Threads at a real interpreter exit: the early phase, workers, borrows in flight, parking,
thread-affine handles.  Each program runs in a fresh interpreter with a hard timeout."""

from __future__ import annotations

import sys

import pytest

from ..support import assert_clean, run_program

NATIVE_SLEEP = """
    import ctypes, time
    _libc = ctypes.CDLL(None)
    _libc.usleep.argtypes = (ctypes.c_uint,)

    def native_call(ms):
        _libc.usleep(ms * 1000)  # releases the GIL, like a real native call
"""

EARLY_PHASE = """
    import concurrent.futures, time

    stop = threading.Event()

    def server_loop():  # a non-daemon thread that runs until told to stop
        while not stop.wait(0.01):
            pass
        record("server thread stopped")

    def busy_task():  # an executor task that runs until told to stop
        stop.wait()
        record("executor task stopped")

    threading.Thread(target=server_loop).start()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(busy_task)
    h = exitsafe.track("server-state", record)
    if PROTECT:
        exitsafe.on_early_exit(lambda: (record("early hook"), stop.set()))
    print("main done", flush=True)
"""


def test_early_phase_stops_threads_and_executors_the_interpreter_joins(tmp_path):
    run = run_program(EARLY_PHASE.replace("PROTECT", "True"), tmp_path, ledger=True)
    assert_clean(run)
    assert run.order[0] == "early hook"
    assert sorted(run.order[1:3]) == ["executor task stopped", "server thread stopped"]
    assert run.order[3:] == ["server-state"], "the teardown runs after the joins"
    assert run.outcome_counts() == {"hook_ran": 1, "released_at_exit": 1}


def test_without_an_early_hook_the_same_program_hangs_before_the_teardown(tmp_path):
    run = run_program(EARLY_PHASE.replace("PROTECT", "False"), tmp_path, timeout=5)
    assert run.hung
    assert run.order == [], "the teardown never started"


DAEMON_INFERENCE = """
    session = exitsafe.track("session", lambda raw: record("session released"), name="session")
    running = threading.Event()

    def infer_forever():
        while True:
            with session.borrow():
                running.set()
                record("call start")
                native_call(50)
                record("call end")

    threading.Thread(target=infer_forever, daemon=True).start()
    running.wait()
"""


def test_daemon_inference_recipe_waits_for_the_call_then_parks_the_worker(tmp_path):
    run = run_program(NATIVE_SLEEP + DAEMON_INFERENCE, tmp_path, ledger=True)
    assert_clean(run)
    released = run.order.index("session released")
    assert run.order[released - 1] == "call end", "released only after the call in flight"
    assert run.order[released:] == ["session released"], "no call started after that"
    assert run.outcomes() == {"session": "released_at_exit"}


WORKER_IGNORING_STOP = """
    session = exitsafe.track("session", lambda raw: record("session released"), name="session")
    stop = threading.Event()  # never looked at
    running = threading.Event()

    def stubborn():
        while True:
            with session.borrow():
                running.set()
                native_call(20)
            record("loop")

    thread = threading.Thread(target=stubborn, daemon=True, name="stubborn")
    thread.start()
    exitsafe.worker(thread, stop=stop, uses=[session], timeout=0.3)
    running.wait()
"""


def test_worker_that_ignores_its_stop_request(tmp_path):
    run = run_program(NATIVE_SLEEP + WORKER_IGNORING_STOP, tmp_path, ledger=True)
    assert_clean(run)
    assert "session released" not in run.order, "never released under the running worker"
    got = {e["name"]: e for e in run.ledger()["registries"][0]["entries"]}
    assert got["worker stubborn"]["outcome"] == "hook_timeout"
    assert "still running 0.3 s after it was asked to stop" in got["worker stubborn"]["detail"]
    assert got["session"]["outcome"] == "leaked_dependent"
    assert run.ledger()["registries"][0]["parked_threads"] == 1


NON_DAEMON_WORKER = """
    session = exitsafe.track("session", lambda raw: record("session released"), name="session")
    stop = threading.Event()

    def work():
        while not stop.is_set():
            with session.borrow():
                native_call(5)
        record("worker ended")

    thread = threading.Thread(target=work, name="work")  # non-daemon
    thread.start()
    exitsafe.worker(thread, stop=stop, uses=[session])
"""


def test_non_daemon_worker_is_stopped_in_the_early_phase(tmp_path):
    run = run_program(NATIVE_SLEEP + NON_DAEMON_WORKER, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["worker ended", "session released"]
    assert run.outcomes() == {"worker work": "hook_ran", "session": "released_at_exit"}


AFFINE = """
    where = {}

    def release_on(label):
        return lambda raw: record(f"{label} released on {threading.current_thread().name}")

    def gone_owner():
        where["gone"] = exitsafe.track("g", release_on("gone"), name="gone", affinity="creator")

    t = threading.Thread(target=gone_owner, name="short-lived")
    t.start()
    t.join()
    main_tex = exitsafe.track("m", release_on("main"), name="main-texture", affinity="main")
    box = [main_tex]
    del main_tex
    dropper = threading.Thread(target=box.clear, name="dropper")  # collected elsewhere
    dropper.start()
    dropper.join()
    live = exitsafe.lowlevel.default_registry().live_handles()
    record("queued: " + str(sorted(h.name for h in live)))
"""


def test_thread_affine_handles_at_exit(tmp_path):
    run = run_program(AFFINE, tmp_path, ledger=True)
    assert_clean(run)
    # Dropped on another thread, the main texture waits, queued for its owning thread.
    assert run.order[0] == "queued: ['gone', 'main-texture']"
    assert sorted(run.order[1:]) == [
        "gone released on MainThread",  # its owner is gone: the teardown runs it
        "main released on MainThread",  # its owner runs the teardown: released there
    ]
    assert run.outcomes() == {"main-texture": "released_at_exit", "gone": "released_at_exit"}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX ctypes libc")
def test_cffi_call_borrows_for_the_call_at_exit(tmp_path):
    pytest.importorskip("cffi")
    body = """
        import cffi
        from exitsafe import cffi as es_cffi

        ffi = cffi.FFI()
        ffi.cdef("int usleep(unsigned int);")
        libc = es_cffi.borrowing(ffi.dlopen(None))
        dev = exitsafe.track(7, lambda raw: record("released"), name="dev")
        running = threading.Event()

        def loop():
            while True:
                running.set()
                # the handle goes in as an argument: borrowed for the call
                es_cffi.call(lambda raw, us: (libc.usleep(us), record("call")), dev, 20000)

        threading.Thread(target=loop, daemon=True).start()
        running.wait()
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order[-1] == "released" and run.order[-2] == "call"
    assert run.outcomes() == {"dev": "released_at_exit"}


MANY_DAEMON_BORROWERS = """
    import logging

    parked = []

    class ParkedSignal(logging.Handler):
        def emit(self, rec):
            if "parked at borrow()" in rec.getMessage():
                parked.append(rec.getMessage())

    logging.getLogger("exitsafe").addHandler(ParkedSignal())
    logging.getLogger("exitsafe").setLevel(logging.INFO)

    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    ready = threading.Barrier(9)

    def all_parked():
        # After the session's release, before the ledger is written: every borrower
        # reaches its next borrow and is parked (else the count below depends on when
        # each one got the GIL back; seen on 3.14).
        end = time.monotonic() + 30
        while len(parked) < 8 and time.monotonic() < end:
            time.sleep(0.001)

    exitsafe.on_teardown(all_parked, after=[session], name="all parked")

    def borrower(i):
        ready.wait()
        while True:
            with session.borrow():
                record(f"in {i}")
                native_call(2)
                record(f"out {i}")

    for i in range(8):
        threading.Thread(target=borrower, args=(i,), daemon=True).start()
    ready.wait()
"""


def test_many_daemon_borrowers_at_exit_are_waited_for_then_parked(tmp_path):
    run = run_program(NATIVE_SLEEP + MANY_DAEMON_BORROWERS, tmp_path, ledger=True)
    assert_clean(run)
    released = run.order.index("released")
    before, after = run.order[:released], run.order[released + 1 :]
    # every call that entered before the release had left it; none entered after it
    ins = [x for x in before if x.startswith("in ")]
    outs = [x for x in before if x.startswith("out ")]
    assert len(ins) == len(outs), "no call was in flight when the session was released"
    assert after == [], "no call entered after the release: the threads are parked"
    assert run.outcomes()["session"] == "released_at_exit"
    assert run.ledger()["registries"][0]["parked_threads"] == 8


DAEMON_BORROWS_AFTER_THE_RELEASE = """
    import logging, time

    parked = threading.Event()

    class ParkedSignal(logging.Handler):
        def emit(self, rec):
            if "parked at borrow()" in rec.getMessage():
                parked.set()

    logging.getLogger("exitsafe").addHandler(ParkedSignal())
    logging.getLogger("exitsafe").setLevel(logging.INFO)
    go, done = threading.Event(), threading.Event()

    def runtime_released(raw):
        # Runs after the session's step: the session has ended when the thread borrows.
        go.set()
        end = time.monotonic() + 30
        while not (parked.is_set() or done.is_set()) and time.monotonic() < end:
            time.sleep(0.001)
        record("runtime released")

    runtime = exitsafe.track("runtime", runtime_released, name="runtime")
    session = exitsafe.track(
        "session", lambda raw: record("session released"), depends_on=runtime, name="session"
    )
    old = exitsafe.track("old", lambda raw: None, name="old")
    old.release()  # ended before the exit: a borrow of it is a use after release

    def late_borrower():
        go.wait()
        try:
            with old.borrow():
                record("entered old")
        except exitsafe.HandleClosedError:
            record("old: HandleClosedError")
        try:
            with session.borrow():
                record("entered session")
        finally:
            record("left session")  # an error, or a return, would pass here
            done.set()

    threading.Thread(target=late_borrower, daemon=True).start()
"""


def test_a_daemon_thread_borrowing_a_handle_the_teardown_already_released_is_parked(tmp_path):
    # The CI failure this reproduces: a daemon thread looping over borrows re-entered
    # after the teardown had released the handle, and died with a traceback at exit.
    run = run_program(DAEMON_BORROWS_AFTER_THE_RELEASE, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["session released", "old: HandleClosedError", "runtime released"]
    assert run.ledger()["registries"][0]["parked_threads"] == 1
    assert run.outcomes() == {
        "old": "released",
        "session": "released_at_exit",
        "runtime": "released_at_exit",
    }


DAEMON_READS_RAW_AFTER_THE_RELEASE = DAEMON_BORROWS_AFTER_THE_RELEASE.replace(
    "parked at borrow()", "parked at raw"
).replace(
    "with old.borrow():", "if old.raw is not None:"
).replace(
    "with session.borrow():", "if session.raw is not None:"
)


def test_a_daemon_thread_reading_raw_of_a_handle_the_teardown_released_is_parked(tmp_path):
    # `.raw` then a native call, on a daemon thread, as plain bindings are written: the
    # thread reads a handle the exit's teardown released.  It is parked there (no
    # traceback during the exit); a handle released before the exit still raises.
    assert "session.raw" in DAEMON_READS_RAW_AFTER_THE_RELEASE
    run = run_program(DAEMON_READS_RAW_AFTER_THE_RELEASE, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["session released", "old: HandleClosedError", "runtime released"]
    assert run.ledger()["registries"][0]["parked_threads"] == 1


DAEMON_PARKED_WITHOUT_IMPORTS = """
    import time

    go = threading.Event()

    def parked_thread_frame():
        for ident, frame in sys._current_frames().items():
            if ident != threading.get_ident() and frame.f_code.co_name == "park":
                return frame
        return None

    def runtime_released(raw):
        # Runs after the session's step: the thread borrows the ended session and parks.
        go.set()
        end = time.monotonic() + 30
        while parked_thread_frame() is None and time.monotonic() < end:
            time.sleep(0.001)
        record("parked" if parked_thread_frame() is not None else "not parked")
        record(f"logging imported: {'logging' in sys.modules}")
        record(f"signal imported: {'signal' in sys.modules}")

    runtime = exitsafe.track("runtime", runtime_released, name="runtime")
    session = exitsafe.track(
        "session", lambda raw: None, depends_on=runtime, name="session"
    )

    def late_borrower():
        go.wait()
        with session.borrow():
            record("entered session")

    threading.Thread(target=late_borrower, daemon=True).start()
"""


def test_a_daemon_thread_parked_during_the_exit_imports_nothing(tmp_path):
    # A parked thread may be frozen at any moment of the exit; frozen inside an import it
    # holds the import locks the main thread's finalization takes (S11 hung on 3.15 when
    # park() imported signal and the parking log imported logging). This program imports
    # neither: parking must not either.
    run = run_program(DAEMON_PARKED_WITHOUT_IMPORTS, tmp_path)
    assert_clean(run)
    assert run.order == ["parked", "logging imported: False", "signal imported: False"]


CYCLE_RELEASING_AT_EXIT = """
    import time

    gc.disable()  # collected only by the worker below, not by chance on this thread
    registry = exitsafe.Registry("cycle", step_timeout=0.3)
    parent = registry.track("parent", record, name="parent")

    def slow_release(raw):
        record("child release started")
        time.sleep(1)  # a slow native release, still running when the program exits
        record("child release finished")

    class Wrapper:  # a binding object in a reference cycle
        def __init__(self):
            self.handle = registry.track(
                "child", slow_release, name="child", depends_on=[parent]
            )
            self.me = self

    Wrapper()
    parent.release()  # the child still needs it
    threading.Thread(target=gc.collect, daemon=True).start()  # collected on a worker
    while True:  # until the release runs there
        with open(os.environ["ORDER_LOG"]) as order:
            if "child release started" in order.read():
                break
        time.sleep(0.001)
"""


def test_a_handle_collected_in_a_cycle_and_releasing_at_exit_is_seen_by_the_teardown(
    tmp_path,
):
    # A cyclic collection clears the live table's weak reference before the handle's
    # finalizer runs: the pure-Python core's teardown then did not see the release in
    # progress (the child ended with no outcome) and released its parent under it.  It is
    # waited for, as a release running elsewhere, then leaked with what it depends on.
    run = run_program(CYCLE_RELEASING_AT_EXIT, tmp_path, ledger=True)
    assert_clean(run)
    assert "parent" not in run.order, "released under the child's release"
    assert run.outcomes("cycle") == {"child": "leaked_in_use", "parent": "leaked_dependent"}


DAEMON_BORROWS_AFTER_THE_CLOSE = """
    import atexit, os, sys, threading, time

    _LOG = os.open(os.environ["ORDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(raw):
        os.write(_LOG, (str(raw) + "\\n").encode())

    def parked_threads():
        return sorted(
            t.name
            for t in threading.enumerate()
            if (frame := sys._current_frames().get(t.ident)) is not None
            and frame.f_code.co_name == "park"
        )

    def after_exitsafe():
        # registered before exitsafe was imported: runs after its teardown, the
        # registry closed, while the process is still ending (another library's flush)
        go.set()
        end = time.monotonic() + 30
        while len(parked_threads()) < 2 and time.monotonic() < end:
            time.sleep(0.001)
        record(f"parked: {parked_threads()}")

    atexit.register(after_exitsafe)
    import exitsafe

    go = threading.Event()
    session = exitsafe.track("session", lambda raw: record("session released"), name="session")

    def periodic_worker():
        go.wait()
        with session.borrow():  # the next tick of a periodic worker
            record("entered session")

    def late_creator():
        go.wait()
        mine = exitsafe.track("late", lambda raw: record("late released"), name="late")
        with mine.borrow():  # leaked at once (registered after the close), then borrowed
            record("entered late")

    threading.Thread(target=periodic_worker, name="periodic", daemon=True).start()
    threading.Thread(target=late_creator, name="creator", daemon=True).start()
"""


def test_a_daemon_thread_borrowing_after_the_registry_closed_is_parked(tmp_path):
    # A periodic daemon worker whose next borrow falls after the exit teardown closed
    # the registry (an atexit callback registered before exitsafe still runs) raised
    # HandleClosedError and printed its traceback during the exit; so did a daemon
    # thread borrowing a handle it created after the close.  Both are parked.
    run = run_program(DAEMON_BORROWS_AFTER_THE_CLOSE, tmp_path, prelude=False)
    assert_clean(run)
    assert run.order == ["session released", "parked: ['creator', 'periodic']"]


MAIN_THREAD_FINALIZER_LATE = """
    import gc, os, sys, threading

    _LOG = os.open(os.environ["ORDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(raw):
        os.write(_LOG, (str(raw) + "\\n").encode())

    if sys.argv[1:] == ["off-main"]:  # exitsafe first imported by another thread
        importer = threading.Thread(target=lambda: __import__("exitsafe"))
        importer.start()
        importer.join()
    import exitsafe

    h = exitsafe.track("x", lambda raw: record("released x"), name="x")

    class Wrapper:
        def __init__(self, h):
            self.h, self.me = h, self  # a cycle: freed by the exit's last collections

        def __del__(self):  # on the main thread, late in the exit
            try:
                with self.h.borrow():
                    record("entered")
            except exitsafe.HandleClosedError:
                record("HandleClosedError")

    Wrapper(h)
    gc.disable()
"""


@pytest.mark.parametrize("imported_on", ["main", "off-main"])
def test_the_main_thread_borrowing_late_in_the_exit_is_never_parked(tmp_path, imported_on):
    # A borrow after the close parks a daemon thread; the main thread, running the
    # finalizers late in the exit once threading is cleared, was taken for one (before
    # 3.12, when exitsafe was first imported on another thread): the exit hung.
    run = run_program(
        MAIN_THREAD_FINALIZER_LATE, tmp_path, args=[imported_on], prelude=False, timeout=30
    )
    assert not run.hung, run.describe()
    assert run.returncode == 0, run.describe()
    assert run.order[0] == "released x"
    assert run.order[1:] in ([], ["HandleClosedError"]), run.describe()


BLOCKED_IN_RECV = """
    import socket
    ours, peer = socket.socketpair()
    conn = exitsafe.track(ours, lambda sock: (sock.close(), record("socket closed")), name="conn")

    def serve():  # blocked in a native call no stop event reaches
        while True:
            data = ours.recv(1024)
            if not data:
                record("recv returned: peer closed")
                return

    t = threading.Thread(target=serve, name="server")
    t.start()
    WORKER
    print("main done", flush=True)
"""


def test_a_worker_blocked_in_a_native_call_is_woken_then_joined(tmp_path):
    declare = "exitsafe.worker(t, wake=peer.close, uses=[conn])"
    run = run_program(BLOCKED_IN_RECV.replace("WORKER", declare), tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["recv returned: peer closed", "socket closed"]
    assert run.outcomes() == {"worker server": "hook_ran", "conn": "released_at_exit"}


def test_without_a_wake_action_the_blocked_worker_keeps_the_exit_waiting(tmp_path):
    run = run_program(BLOCKED_IN_RECV.replace("WORKER", ""), tmp_path, timeout=5)
    assert run.hung and "main done" in run.stdout
    assert run.order == []


CALLBACK_INSIDE_A_BORROWED_CALL = """
    import time

    inside, began = threading.Event(), threading.Event()

    def compare(x):
        return x * 10

    cmp = exitsafe.guard(compare, default=-1)  # what the native code calls back
    array = exitsafe.track("array", lambda raw: record("array released"), name="array")
    exitsafe.on_teardown(began.set, before=[array], name="teardown began")

    def native_sort(raw, callback):  # a native call that calls back, as qsort does
        record(f"first call: {callback(1)}")
        inside.set()
        began.wait(30)
        time.sleep(0.05)  # well inside the teardown's wait for this borrow
        record(f"call during the teardown: {callback(2)}")

    def sorter():
        with array.borrow() as raw:
            native_sort(raw, cmp)
        record("borrow ended")

    threading.Thread(target=sorter, daemon=True).start()
    inside.wait(30)
"""


def test_a_callback_made_inside_a_borrowed_call_is_not_silenced_while_the_teardown_waits(
    tmp_path,
):
    # The teardown waits for the borrow in flight; the native call's callbacks are part of
    # it and reach the function (a silenced comparison function left qsort's output
    # unsorted, a silenced read callback truncated a libarchive stream: second adoption).
    # After the teardown, calls get the default again.
    run = run_program(CALLBACK_INSIDE_A_BORROWED_CALL, tmp_path)
    assert_clean(run)
    assert run.order == [
        "first call: 10",
        "call during the teardown: 20",
        "borrow ended",
        "array released",
    ]


BORROWED_CALL_THAT_NEVER_RETURNS = """
    inside = threading.Event()
    runtime = exitsafe.track("runtime", lambda raw: record("runtime released"), name="runtime")
    session = exitsafe.track(
        "session", lambda raw: record("session released"), name="session", depends_on=[runtime]
    )

    def stuck():
        with session.borrow():
            inside.set()
            threading.Event().wait()  # a native call that never returns

    threading.Thread(target=stuck, daemon=True, name="stuck").start()
    inside.wait(30)
"""


def test_a_borrowed_call_that_never_returns_is_leaked_after_the_bound_and_the_exit_goes_on(
    tmp_path,
):
    # The teardown waits for the borrow in flight, bounded by the step timeout; at the
    # bound the handle, and what it depends on, are leaked (never released under the call),
    # the process exits 0, and the ledger says why.
    run = run_program(
        BORROWED_CALL_THAT_NEVER_RETURNS, tmp_path, ledger=True,
        env={"EXITSAFE_STEP_TIMEOUT": "0.3"},
    )
    assert_clean(run)
    assert run.order == []  # nothing released under the running call
    got = {e["name"]: e for e in run.ledger()["registries"][0]["entries"]}
    assert got["session"]["outcome"] == "leaked_in_use"
    assert got["session"]["detail"] == "still borrowed on another thread after 0.3 s"
    assert got["runtime"]["outcome"] == "leaked_dependent"


TEARDOWN_WHILE_ANOTHER_THREAD_IMPORTS_THE_STEP_RUNNER = """
    import importlib.abc, importlib.util

    importing, go = threading.Event(), threading.Event()

    class SlowSteps(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        # exitsafe._steps, loaded slowly: its module stays half-imported until `go`
        def find_spec(self, name, path, target=None):
            if name != "exitsafe._steps":
                return None
            sys.meta_path.remove(self)
            self.real = importlib.util.find_spec(name)
            return importlib.util.spec_from_loader(name, self)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            importing.set()
            go.wait(30)
            module.__file__ = self.real.origin
            self.real.loader.exec_module(module)

    assert "exitsafe._steps" not in sys.modules
    sys.meta_path.insert(0, SlowSteps())
    reg = exitsafe.Registry("shared")
    reg.track("db", lambda raw: record("db released"), name="db")

    def teardown(who):
        try:
            reg.teardown()
            record(f"{who}: teardown returned")
        except Exception as exc:
            record(f"{who}: {type(exc).__name__}: {exc}")

    first = threading.Thread(target=teardown, args=("first",))
    first.start()
    importing.wait(30)  # the first teardown is importing the step runner
    second = threading.Thread(target=teardown, args=("second",))
    second.start()
    second.join(0.5)  # it finds the teardown running on the first thread
    go.set()
    first.join(30)
    second.join(30)
"""


def test_a_teardown_meeting_the_step_runner_half_imported_by_another_thread_waits(tmp_path):
    # Two threads tear down the same registry; the first imports exitsafe._steps, and the
    # second, finding the teardown running there, looked the half-imported module up
    # (AttributeError, seen under load).  It waits for the first instead.
    run = run_program(TEARDOWN_WHILE_ANOTHER_THREAD_IMPORTS_THE_STEP_RUNNER, tmp_path)
    assert_clean(run)
    assert sorted(run.order) == ["db released", "first: teardown returned",
                                 "second: teardown returned"]
    assert run.order.index("db released") < run.order.index("second: teardown returned")

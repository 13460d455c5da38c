"""Subprocess tests of what happens at real interpreter exit."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from exitsafe.lowlevel import CORE

from ..support import Run, assert_clean
from ..support import run_program as _run


def run_program(body: str, tmp_path, **env: str) -> tuple[Run, list[str]]:
    """Run ``body`` after the prelude; the run and its release order."""
    run = _run(body, tmp_path, env=env)
    return run, run.order


def test_globals_and_cycles_are_released_at_exit_in_dependency_order(tmp_path):
    proc, order = run_program(
        """
        lib = exitsafe.pin("lib", close=record)
        inst = exitsafe.track("instance", record, kind="instance", depends_on=[lib])
        dev = exitsafe.track("device", record, kind="device", depends_on=[inst])

        class Session:
            def __init__(self):
                self.me = self   # a reference cycle, collected in arbitrary GC order
                self.h = exitsafe.track("session", record, depends_on=[dev])

        gc.disable()     # keep the cycle for the exit (else an allocation may collect it now,
        s = Session()    # which releases "session" early: correct, but not what this tests)
        del s
        buf = exitsafe.track("buffer", record, kind="buffer", depends_on=[dev])
        exitsafe.on_teardown(lambda: record("hook"), before=[buf])
        print("work done")
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert proc.stdout == "work done\n"
    assert order == ["hook", "buffer", "session", "device", "instance", "lib"]


def test_late_release_from_a_finalizer_does_not_run(tmp_path):
    proc, order = run_program(
        """
        class Wrapper:
            def __init__(self):
                self.h = exitsafe.track("dev", record, exit_policy="leak")
            def __del__(self):
                # the naive binding's finalizer, run during interpreter shutdown
                self.h.release()

        w = Wrapper()            # a module global: finalized after teardown
        """,
        tmp_path,
        EXITSAFE_TRACE="1",
    )
    assert_clean(proc)
    assert order == []
    assert "outcome=leaked_policy" in proc.stderr
    assert 'late-release registry="default" kind="handle" name="handle#1"' in proc.stderr


def test_ledger_json_written_at_exit(tmp_path):
    ledger = tmp_path / "ledger-{pid}.json"
    proc, _ = run_program(
        """
        a = exitsafe.track("a", record, name="a")
        b = exitsafe.track("b", record, name="b", exit_policy="leak")
        c = exitsafe.track("c", record, name="c")
        c.release()
        print(os.getpid())
        """,
        tmp_path,
        EXITSAFE_LEDGER=str(ledger),
    )
    assert_clean(proc)
    data = json.loads((tmp_path / f"ledger-{proc.stdout.strip()}.json").read_text())
    (default,) = [r for r in data["registries"] if r["name"] == "default"]
    outcomes = {e["name"]: e["outcome"] for e in default["entries"]}
    assert outcomes == {"a": "released_at_exit", "b": "leaked_policy", "c": "released"}
    assert default["counts"] == {"released": 1, "released_at_exit": 1, "leaked_policy": 1}


def test_a_program_without_handles_exits_without_importing_more(tmp_path):
    # The exit of a program that imported exitsafe and tracked nothing: no teardown to
    # run, no signal to hold back, so threading and signal (about 7 ms) stay unimported;
    # the ledger asked for is still written (json brings enum, which is why it is not
    # checked here).
    ledger = tmp_path / "ledger.json"
    run = _run(
        """
        import atexit, sys
        # registered before exitsafe's exit hook: runs after it
        atexit.register(
            lambda: print(sorted(m for m in ("threading", "signal") if m in sys.modules))
        )
        import exitsafe
        """,
        tmp_path,
        prelude=False,
        env={"EXITSAFE_LEDGER": str(ledger)},
    )
    assert_clean(run)
    assert run.stdout.split("\n")[0] == "[]"
    assert json.loads(ledger.read_text())["registries"] == []


def test_at_exit_leak_override_never_calls_native_code(tmp_path):
    proc, order = run_program(
        """
        a = exitsafe.track("a", record)
        b = exitsafe.track("b", record, depends_on=[a])
        """,
        tmp_path,
        EXITSAFE_AT_EXIT="leak",
    )
    assert_clean(proc)
    assert order == []


def test_bad_env_value_is_reported_once(tmp_path):
    proc, order = run_program(
        """
        a = exitsafe.track("a", record)
        r = exitsafe.Registry("second")
        b = r.track("b", record)
        """,
        tmp_path,
        EXITSAFE_AT_EXIT="sometimes",
    )
    assert proc.returncode == 0
    assert proc.stderr.count("EXITSAFE_AT_EXIT='sometimes' is not valid") == 1
    assert sorted(order) == ["a", "b"]


def test_registries_tear_down_newest_first(tmp_path):
    proc, order = run_program(
        """
        first = exitsafe.Registry("first")
        second = exitsafe.Registry("second")
        a = first.track("first", record)
        b = second.track("second", record)
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert order == ["second", "first"]


def test_worker_thread_finishing_does_not_tear_down(tmp_path):
    proc, order = run_program(
        """
        box = []
        t = threading.Thread(target=lambda: box.append(exitsafe.track("w", record)))
        t.start(); t.join()
        assert box[0].raw == "w"
        record("after-join")
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert order == ["after-join", "w"]


def test_non_daemon_threads_finish_before_teardown(tmp_path):
    proc, order = run_program(
        """
        import time
        h = exitsafe.track("h", record)
        def worker():
            time.sleep(0.2)
            record("worker-used:" + h.raw)
        threading.Thread(target=worker).start()
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert order == ["worker-used:h", "h"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_never_releases_inherited_handles(tmp_path):
    proc, order = run_program(
        """
        inherited = exitsafe.track("parent-handle", record)
        pid = os.fork()
        if pid == 0:
            own = exitsafe.track("child-handle", record)
            inherited.release()          # explicit: still never released in the child
            sys.exit(0)                  # normal exit: atexit teardown runs in the child
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        record("parent-continues")
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert order == ["child-handle", "parent-continues", "parent-handle"]


def test_daemon_thread_racing_with_exit_never_double_releases(tmp_path):
    proc, order = run_program(
        """
        import time
        started = threading.Event()
        handles = [exitsafe.track(f"h{i}", record) for i in range(200)]

        def churn():
            # keeps retaining and releasing while the main thread exits
            started.set()
            while True:
                for h in handles:
                    try:
                        h.retain()
                        h.release()
                    except exitsafe.HandleClosedError:
                        pass

        threading.Thread(target=churn, daemon=True).start()
        started.wait()
        time.sleep(0.05)
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert sorted(order) == sorted(f"h{i}" for i in range(200)), "each released exactly once"


def test_last_reference_dropped_on_daemon_thread_after_teardown(tmp_path):
    proc, order = run_program(
        """
        box = [exitsafe.track("late", record, exit_policy="leak")]
        inst = exitsafe.track("inst", record)
        go, done = threading.Event(), threading.Event()

        def dropper():
            go.wait()
            box.clear()          # drops the last reference after the registry closed
            record("dropped")
            done.set()

        threading.Thread(target=dropper, daemon=True).start()
        exitsafe.teardown()      # what atexit does; explicit here to control the timing
        go.set()
        done.wait()
        """,
        tmp_path,
        EXITSAFE_TRACE="1",
    )
    assert_clean(proc)
    assert order == ["inst", "dropped"], "the late drop never calls the release function"
    # The collection of a handle the teardown already ended is not a release request.
    assert "late-release" not in proc.stderr


def test_wrappers_in_a_cycle_with_del_are_quiet_at_shutdown(tmp_path):
    proc, order = run_program(
        """
        class Device:
            def __init__(self, parent):
                self.parent = parent
                self.children = []
                parent.children.append(self)      # a cycle: parent <-> child
                self.h = exitsafe.track("device", record, depends_on=[parent.h])
            def __del__(self):
                self.h.release()                  # the naive finalizer

        class Instance:
            def __init__(self):
                self.children = []
                self.h = exitsafe.track("instance", record)
            def __del__(self):
                self.h.release()

        inst = Instance()
        Device(inst)
        Device(inst)
        """,
        tmp_path,
    )
    assert_clean(proc)
    assert order[-1] == "instance" and sorted(order[:-1]) == ["device", "device"]


SHUTDOWN_SEQUENCE = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    LOG = os.environ["ORDER_LOG"]

    def record(what):
        with open(LOG, "a") as fh:
            fh.write(str(what) + "\\n")

    atexit.register(record, "atexit-registered-before-import")
    import exitsafe
    atexit.register(record, "atexit-registered-after-import")
    threading._register_atexit(record, "threading-atexit")   # what concurrent.futures uses

    class ModuleGlobal:
        def __init__(self):
            # module globals, even open(), may be unusable when __del__ runs
            self.fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self.write = os.write

        def __del__(self):
            self.write(self.fd, b"module-finalization\\n")

    GLOBAL = ModuleGlobal()
    h = exitsafe.track("exitsafe-teardown", record)

    def worker():
        time.sleep(0.2)
        record("non-daemon-thread-done")

    threading.Thread(target=worker).start()
    """
)


def test_where_the_teardown_runs_in_the_shutdown_sequence(tmp_path):
    # Pins the same position on every supported CPython (3.9-3.13): after
    # threading's own atexit callbacks ran and the non-daemon threads were joined
    # (threading._shutdown, in that order), among the atexit callbacks in LIFO
    # order (so after those registered later than `import exitsafe`, before those
    # registered earlier), and before module finalization.
    proc = _run(SHUTDOWN_SEQUENCE, tmp_path, prelude=False)
    assert_clean(proc)
    assert proc.order == [
        "threading-atexit",
        "non-daemon-thread-done",
        "atexit-registered-after-import",
        "exitsafe-teardown",
        "atexit-registered-before-import",
        "module-finalization",
    ]


def test_step_timeouts_hold_at_exit_on_every_version(tmp_path):
    # CPython 3.12 refuses to start threads once shutdown began (gh-104690): the
    # workers that bound timed steps are started ahead of time, when a timeout is
    # configured.  Two standby workers: the exit teardown survives one abandoned
    # step on every version; after a second one, 3.12 can start no new worker and
    # leaks the remaining timed steps instead of running them unbounded.
    proc, order = run_program(
        """
        import time
        reg = exitsafe.Registry(name="timed", step_timeout=0.3)
        early = reg.track("early", record, name="early")
        hang1 = reg.track("hang1", lambda raw: time.sleep(30), name="hang1")
        after_one = reg.track("after-one", record, name="after-one")
        hang2 = reg.track("hang2", lambda raw: time.sleep(30), name="hang2")
        """,
        tmp_path,
        EXITSAFE_LEDGER=str(tmp_path / "ledger.json"),
    )
    assert_clean(proc)
    data = json.loads((tmp_path / "ledger.json").read_text())
    (timed,) = [r for r in data["registries"] if r["name"] == "timed"]
    got = {e["name"]: (e["outcome"], e["detail"]) for e in timed["entries"]}
    assert got["hang2"][0] == got["hang1"][0] == "leaked_timeout"
    assert got["after-one"][0] == "released_at_exit"
    if sys.version_info[:2] == (3, 12):
        assert got["early"][0] == "leaked_timeout"
        assert "no thread could be started" in got["early"][1]
        assert order == ["after-one"]
    else:
        assert got["early"][0] == "released_at_exit"
        assert order == ["after-one", "early"]


def test_handles_released_at_exit_leave_the_garbage_collector_when_nothing_can_cycle(tmp_path):
    """At the process's exit, the compiled core takes the handles it released out of the
    garbage collector's lists (the interpreter's last collections would traverse each of
    them several times): only those that can be in no garbage cycle any more (the plain
    handle class, a registry of the plain class, no callable policy, no affinity).  A
    garbage cycle through such a handle is still collected; an explicit teardown while the
    process goes on changes nothing.  The pure-Python core untracks nothing."""
    run = _run(
        """
        import atexit, gc, os, threading

        def after_exit_teardown():  # (registered before exitsafe's: runs after it)
            tracked = {name: gc.is_tracked(h) for name, h in handles.items()}
            os.write(1, (json.dumps(tracked, sort_keys=True) + "\\n").encode())

        atexit.register(after_exit_teardown)
        import json
        import exitsafe

        def release(raw):
            pass

        class MyRegistry(exitsafe.Registry):
            pass

        class Holder:
            def __del__(self):
                os.write(1, b"holder collected\\n")

        gc.disable()  # (the cycle below is left to the collections of the exit)
        closed = exitsafe.Registry("closed-before")
        handles = {
            "plain": exitsafe.track(1, release),
            "named": exitsafe.track(2, release, kind="device", name="dev", timeout=5.0),
            "policy": exitsafe.track(3, release, exit_policy=lambda info: "release"),
            "affinity": exitsafe.track(4, release, affinity="main"),
            "subclass-registry": MyRegistry("mine").track(5, release),
            "closed-before": closed.track(6, release),
        }
        closed.teardown()
        holder = Holder()
        holder.me, holder.handle = holder, exitsafe.track(7, release)
        del holder
        """,
        tmp_path,
        prelude=False,
    )
    assert_clean(run)
    lines = run.stdout.splitlines()
    tracked = json.loads(lines[0])
    compiled = CORE == "compiled"
    assert tracked == {
        "plain": not compiled,
        "named": not compiled,
        "policy": True,
        "affinity": True,
        "subclass-registry": True,
        "closed-before": True,
    }
    assert lines[1:] == ["holder collected"]

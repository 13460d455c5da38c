"""Class 3: fork while exitsafe's lock is held elsewhere, and fork inside the teardown.

A child never hangs on a lock another thread of the parent held at ``fork()``, and a
child never releases an inherited handle, whatever it was doing when it forked (a
release function, a hook).  Each release is logged with the pid that ran it.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from ..support import assert_clean, run_program
from .programs import program

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD_USES_THE_ADAPTERS = """
    import ctypes
    from exitsafe import ctypes as es_ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)

    def child_work():
        # The first adapter call in the child takes exitsafe's lock.
        h = es_ctypes.track(libc.malloc(16), libc.free)
        h.release()
        record(f"child-{os.getpid()}-ok")
        os._exit(0)

    def fork_and_wait():
        pid = os.fork()
        if pid == 0:
            child_work()
        _, status = os.waitpid(pid, 0)
        record(f"child-status-{status}")
"""


def test_lock_held_by_another_thread_at_fork(tmp_path):
    body = """
        import exitsafe._sync as _probe

        holding, done = threading.Event(), threading.Event()

        def hold():
            # Stands for a thread that is inside one of exitsafe's sections at fork():
            # it holds the lock longer than fork() waits for it.
            with _probe.LOCK:
                holding.set()
                done.wait(30)

        threading.Thread(target=hold, daemon=True).start()
        holding.wait()
        fork_and_wait()
        done.set()
    """
    run = run_program(program(CHILD_USES_THE_ADAPTERS, body), tmp_path, timeout=60)
    assert_clean(run, allow=("DeprecationWarning",))
    assert [x for x in run.order if x.startswith("child-status")] == ["child-status-0"]
    assert sum(x.endswith("-ok") for x in run.order) == 1


def test_forks_while_another_thread_uses_exitsafe(tmp_path):
    body = """
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                es_ctypes.track(libc.malloc(16), libc.free).release()

        thread = threading.Thread(target=busy)
        thread.start()
        for _ in range(20):
            fork_and_wait()
        stop.set()
        thread.join()
    """
    run = run_program(program(CHILD_USES_THE_ADAPTERS, body), tmp_path, timeout=120)
    assert_clean(run, allow=("DeprecationWarning",))  # 3.12+: fork with threads
    statuses = [x for x in run.order if x.startswith("child-status")]
    assert statuses == ["child-status-0"] * 20
    assert sum(x.endswith("-ok") for x in run.order) == 20


FORK_DURING_TEARDOWN = """
    def release(raw):
        record(f"{os.getpid()}:{raw}")
        if raw == FORK_AT:
            pid = os.fork()
            if pid:
                record(f"parent:{os.getpid()}")
                os.waitpid(pid, 0)
            else:
                record(f"child:{os.getpid()}")
                # The child goes on with the rest of the parent's teardown loop, then
                # exits normally (its own exit teardown, its own ledger).

    handles = [exitsafe.track(i, release, name=f"h{i}") for i in range(10)]
    if HOOK:
        def forking_hook():
            release(FORK_AT)
        exitsafe.on_teardown(forking_hook, before=[handles[FORK_AT]], name="hook")
    # An explicit teardown (CPython 3.12.0-3.12.2 refuse fork() inside atexit callbacks).
    exitsafe.teardown()
"""


@pytest.mark.parametrize("in_hook", [False, True], ids=["fork-in-release", "fork-in-hook"])
def test_fork_inside_the_teardown_never_releases_twice(tmp_path, in_hook):
    fork_at = 5
    run = run_program(
        program(FORK_DURING_TEARDOWN, FORK_AT=fork_at if not in_hook else -1, HOOK=in_hook),
        tmp_path,
        env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json")},
        timeout=60,
    )
    assert_clean(run, allow=("DeprecationWarning",))
    parent = next(x for x in run.order if x.startswith("parent:")).split(":")[1]
    child = next(x for x in run.order if x.startswith("child:")).split(":")[1]
    releases = [x.split(":") for x in run.order if x.split(":")[0].isdigit()]
    raws = Counter(raw for _pid, raw in releases)
    assert set(raws) == {str(i) for i in range(10)} | ({"-1"} if in_hook else set())
    assert all(n == 1 for raw, n in raws.items() if raw != "-1"), "a handle released twice"
    assert {pid for pid, raw in releases if raw != "-1"} == {parent}, "the child released"
    entries = json.loads((tmp_path / f"ledger-{child}.json").read_text())["registries"][0]
    outcomes = {e["name"]: e["outcome"] for e in entries["entries"]}
    # What the parent had not reached when it forked is inherited in the child.
    not_reached = range(fork_at) if not in_hook else range(10)
    assert {outcomes[f"h{i}"] for i in not_reached} == {"leaked_inherited"}


def test_child_forked_by_another_thread_during_a_teardown(tmp_path):
    body = """
        import signal
        from exitsafe.signals import teardown_on_signals

        teardown_on_signals("SIGTERM")
        in_hook, forked = threading.Event(), threading.Event()
        a = exitsafe.track("a", record, name="a")

        def hook():  # the main thread's teardown has already released "a"
            in_hook.set()
            forked.wait(30)

        exitsafe.on_teardown(hook, after=[a], name="waits")

        def forker():
            in_hook.wait()
            pid = os.fork()
            if pid == 0:
                default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
                record(f"child-sigint-default={default}")
                try:
                    signal.raise_signal(signal.SIGINT)
                    record("child-sigint-ignored")
                except KeyboardInterrupt:
                    record("child-keyboardinterrupt")
                exitsafe.teardown()  # the child's own
                outcomes = sorted((e.name, e.outcome) for e in exitsafe.ledger())
                record(f"child-ledger={outcomes} live={len(exitsafe.lowlevel.default_registry())}")
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            record(f"child-status={os.waitstatus_to_exitcode(status)}")
            forked.set()

        thread = threading.Thread(target=forker)
        thread.start()
        exitsafe.teardown()
        thread.join()
    """
    run = run_program(body, tmp_path, ledger=True, timeout=60)
    assert_clean(run, allow=("DeprecationWarning",))  # 3.12+: fork with threads
    assert run.order == [
        "a",
        "child-sigint-default=True",
        "child-keyboardinterrupt",
        "child-ledger=[('a', 'leaked_inherited'), ('waits', 'leaked_inherited')] live=0",
        "child-status=0",
    ]
    assert run.outcomes() == {"a": "released_at_exit", "waits": "hook_ran"}


def test_child_forked_inside_a_timed_hook_leaves_when_the_hook_returns(tmp_path):
    body = """
        h = exitsafe.track("h", lambda raw: record(f"{os.getpid()}:released"), name="h")

        def hook():
            pid = os.fork()
            if pid == 0:
                record("child-back-from-the-hook")
                return  # the child goes on: there is no teardown thread for it here
            _, status = os.waitpid(pid, 0)
            record(f"child-status={os.waitstatus_to_exitcode(status)}")

        exitsafe.on_teardown(hook, name="forking-hook", timeout=30)
        record(f"parent={os.getpid()}")
        # An explicit teardown: CPython 3.12.0-3.12.x refuse os.fork() once the
        # interpreter is shutting down ("can't fork at interpreter shutdown"), so a hook
        # forking in the exit teardown fails there (hook_failed) before any child exists.
        exitsafe.teardown()
        record("parent-after-teardown")
    """
    run = run_program(
        body, tmp_path, env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json")}, timeout=60
    )
    assert_clean(run, allow=("DeprecationWarning",))
    parent = run.order[0].split("=")[1]
    assert run.order[1:] == [
        "child-back-from-the-hook", "child-status=0", f"{parent}:released", "parent-after-teardown"
    ]
    ledgers = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("ledger-*.json")}
    assert len(ledgers) == 2, "the child wrote its own ledger as it left"
    child = next(d for name, d in ledgers.items() if name != f"ledger-{parent}.json")
    outcomes = {e["name"]: e["outcome"] for e in child["registries"][0]["entries"]}
    assert outcomes == {"h": "leaked_inherited", "forking-hook": "leaked_inherited"}

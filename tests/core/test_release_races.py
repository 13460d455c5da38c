"""Races of a release against a teardown, another release, a fork or the handle's own
release function.  Each test forces one race deterministically and checks what a user
would: the release function ran exactly once (or never, when the program still owns the
object), and the ledger holds exactly one outcome per handle.  Both cores must pass them."""

from __future__ import annotations

import os

import pytest

from ..support import assert_clean, run_program

#: A program's start: a release function that blocks until the teardown's first pause
#: while it waits for a release in flight (``go`` is set there), so that the release
#: finishes while that teardown waits, whatever the timing.
IN_FLIGHT = """
        from exitsafe import _teardown
        registry = exitsafe.Registry("r")
        started, go = threading.Event(), threading.Event()

        def slow_free(raw):
            record(raw)
            started.set()
            go.wait()

        real_sleep = _teardown.sleep
        def first_pause(seconds):  # the teardown waits for the release in flight
            go.set()
            real_sleep(seconds)
        _teardown.sleep = first_pause
"""


def test_a_release_in_flight_when_the_teardown_begins_is_waited_for(tmp_path):
    """The teardown finds the handle claimed by a release running on another thread: it
    waits (its first pause lets the release finish), records nothing itself, and the
    release records ``released``."""
    run = run_program(
        IN_FLIGHT
        + """
        h = registry.track("H", slow_free, name="h")
        t = threading.Thread(target=h.release)
        t.start()
        started.wait()
        registry.teardown()
        t.join()
        print(h.state, registry.ledger_counts())
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.order == ["H"]
    assert run.stdout.split("\n")[0] == "released {'released': 1}", run.describe()


def test_a_release_the_teardown_gave_up_on_records_nothing_when_it_ends(tmp_path):
    """The teardown waits at most the step timeout, records ``leaked_in_use``; the
    release, which goes on, finds it recorded and adds no second outcome."""
    run = run_program(
        """
        registry = exitsafe.Registry("r", step_timeout=0.01)
        started, go = threading.Event(), threading.Event()

        def release(raw):
            record(raw)
            started.set()
            go.wait()

        h = registry.track("H", release, name="h")
        t = threading.Thread(target=h.release)
        t.start()
        started.wait()
        registry.teardown()  # gives up waiting: the release is still blocked
        go.set()
        t.join()
        print(h.state, registry.ledger_counts(), len(registry))
        """,
        tmp_path,
        ledger=True,
    )
    assert_clean(run)
    assert run.order == ["H"]
    assert run.stdout.split("\n")[0] == "leaked {'leaked_in_use': 1} 0", run.describe()
    assert run.outcomes("r") == {"h": "leaked_in_use"}


def test_a_teardown_started_by_the_release_function_does_not_wait_for_it(tmp_path):
    """A release function that tears the registry down (here through ``exitsafe.exit``'s
    building block, ``teardown``) runs on the thread holding the claim: the teardown must
    see that at once rather than wait for itself until its bound."""
    run = run_program(
        """
        registry = exitsafe.Registry("r")

        def release(raw):
            record(raw)
            registry.teardown()

        h = registry.track("H", release, name="h")
        other = registry.track("O", record, name="o")
        h.release()
        print(h.state, sorted(registry.ledger_counts().items()))
        print([e.detail for e in registry.ledger() if e.name == "h"])
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.order == ["H", "O"]
    lines = run.stdout.split("\n")
    assert lines[0] == "leaked [('leaked_in_use', 1), ('released_at_exit', 1)]", run.describe()
    assert lines[1] == "['its release is in progress on the thread running the teardown']"


def test_two_threads_releasing_one_handle_release_it_once(tmp_path):
    """Both threads ask at once, many times over: one claim wins each time; the other
    release is the no-op a second release always is."""
    run = run_program(
        """
        registry = exitsafe.Registry("r")
        count = 2000
        calls = []
        barrier = threading.Barrier(2)
        handles = []

        def worker():
            for h in handles:
                barrier.wait()
                h.release()

        for i in range(count):
            handles.append(registry.track(i, calls.append))
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(calls), len(set(calls)), registry.ledger_counts(), len(registry))
        """,
        tmp_path,
        timeout=120,
    )
    assert_clean(run)
    assert run.stdout.split("\n")[0] == "2000 2000 {'released': 2000} 0", run.describe()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_fork_during_a_release_on_another_thread(tmp_path):
    """The child inherits a handle another thread of the parent was releasing: that
    release never finishes in the child, so the handle is live there again, and the
    child's exit leaks it as inherited; the parent's release ends as usual."""
    run = run_program(
        """
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # (fork with a thread running)
        registry = exitsafe.Registry("r")
        started, go = threading.Event(), threading.Event()

        def release(raw):
            record(f"{raw} in {os.getpid() == PARENT and 'parent' or 'child'}")
            started.set()
            go.wait()

        PARENT = os.getpid()
        h = registry.track("H", release, name="h")
        t = threading.Thread(target=h.release)
        t.start()
        started.wait()
        pid = os.fork()
        if pid == 0:
            print("child", h.state, h.owners)
            registry.teardown()
            print("child", registry.ledger_counts())
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        go.set()
        t.join()
        print("parent", h.state, registry.ledger_counts())
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.order == ["H in parent"], run.describe()
    assert run.stdout.split("\n")[:3] == [
        "child live 0",
        "child {'leaked_inherited': 1}",
        "parent released {'released': 1}",
    ], run.describe()


def test_tracking_options_positionally(tmp_path):
    """``Registry.track``'s options (and ``exitsafe.track``'s) may be given by position,
    in their documented order, with either core."""
    run = run_program(
        """
        registry = exitsafe.Registry("r")
        parent = registry.track("P", record, "device")
        h = registry.track("H", record, "buffer", (parent,), "release", "h1", 2.0, None)
        print(h.kind, h.name, h.depends_on == (parent,))
        h.release()
        parent.release()
        m = exitsafe.track("M", record, "module", (), "release", "m1")
        print(m.kind, m.name)
        m.release()
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.order == ["H", "P", "M"]
    assert run.stdout.split("\n")[:2] == ["buffer h1 True", "module m1"]


def test_a_teardown_run_by_a_release_that_lost_the_claim_waits_for_the_winner(tmp_path):
    """A thread whose release lost the claim to another thread's release takes the locked
    path, which runs the work queued meanwhile: here a teardown.  That teardown must wait
    for the release running on the other thread (it is not this thread's), which then
    records ``released``."""
    run = run_program(
        IN_FLIGHT
        + """
        from exitsafe import _sync
        x = registry.track("X", slow_free, name="x")
        u = threading.Thread(target=x.release)  # claims X, runs slow_free
        u.start()
        started.wait()
        with _sync.LOCK:  # as a finalizer inside a section would: the teardown is queued
            registry.teardown()
        x.release()  # loses the claim; the locked path runs the queued teardown
        u.join()
        print(x.state, [(e.outcome, e.detail) for e in registry.ledger()])
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.order == ["X"]
    assert run.stdout.split("\n")[0] == "released [('released', None)]", run.describe()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_fork_by_queued_work_of_a_release_that_lost_the_claim(tmp_path):
    """The same, with a fork: a release that lost the claim runs a queued release whose
    function forks.  In the child, the handle the other thread of the parent was releasing
    is live again (that release never finishes there) and the child's teardown leaks it as
    inherited at once; in the parent it ends ``released``."""
    run = run_program(
        """
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # (fork with a thread running)
        from exitsafe import _sync
        registry = exitsafe.Registry("r")
        started, go = threading.Event(), threading.Event()
        child = []

        def slow_free(raw):
            started.set()
            go.wait()

        def forking_free(raw):
            if os.fork() == 0:
                child.append(True)

        x = registry.track("X", slow_free, name="x")
        y = registry.track("Y", forking_free, name="y")
        u = threading.Thread(target=x.release)
        u.start()
        started.wait()
        with _sync.LOCK:  # as a finalizer inside a section would: Y's release is queued
            y.release()
        x.release()  # loses the claim; the locked path runs Y's release, which forks
        if child:
            print("child", x.state, x.owners)
            registry.teardown()
            print("child", [(e.name, e.outcome) for e in registry.ledger()])
            sys.stdout.flush()
            os._exit(0)
        os.wait()
        go.set()
        u.join()
        print("parent", [(e.name, e.outcome) for e in registry.ledger()])
        """,
        tmp_path,
    )
    assert_clean(run)
    assert run.stdout.split("\n")[:3] == [
        "child live 0",
        "child [('y', 'released'), ('x', 'leaked_inherited')]",
        "parent [('y', 'released'), ('x', 'released')]",
    ], run.describe()


def test_a_track_undone_by_its_queued_work_leaves_nothing_claimable(tmp_path):
    """Work queued before ``track()`` runs after the registration; when it raises (a
    ``KeyboardInterrupt`` in a queued release), ``track()`` undoes the registration: the
    handle ends ``detached`` and nothing of it stays in the registry."""
    run = run_program(
        """
        from exitsafe import _sync
        registry = exitsafe.Registry("r")

        def interrupted(raw):
            raise KeyboardInterrupt

        queued = registry.track("Q", interrupted, name="q")
        with _sync.LOCK:  # as a finalizer inside a section would: the release is queued
            queued.release()
        try:
            registry.track("H", record, name="h")
        except KeyboardInterrupt:
            print("interrupted")
        registry.teardown()
        print(sorted(registry.ledger_counts().items()), len(registry))
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.describe()
    assert run.order == []
    lines = run.stdout.split("\n")
    assert lines[0] == "interrupted", run.describe()
    assert lines[1] == "[('detached', 1), ('release_failed', 1)] 0", run.describe()

"""The two cores: which one runs, how to choose it, and the compiled core's own pieces
(its lock and its light weak reference).  The semantics of both cores are the rest of the
suite, which CI runs against each (EXITSAFE_PURE_PYTHON=0 and =1)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exitsafe
from exitsafe import _core
from exitsafe.lowlevel import ForeignHandleError

BUILT = importlib.util.find_spec("exitsafe._speedups") is not None
PURE_FORCED = os.environ.get("EXITSAFE_PURE_PYTHON", "") not in ("", "0")
compiled_only = pytest.mark.skipif(
    _core.speedups is None,
    reason="the compiled core is not in use here "
    + ("(EXITSAFE_PURE_PYTHON is set)" if PURE_FORCED else "(exitsafe._speedups not built)"),
)


def _core_of(env_value: str) -> str:
    env = dict(os.environ, EXITSAFE_PURE_PYTHON=env_value)
    out = subprocess.run(
        [sys.executable, "-c", "import exitsafe; print(exitsafe.lowlevel.CORE)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    return out.stdout.strip()


def test_core_in_use_is_the_one_asked_for():
    if PURE_FORCED:
        assert exitsafe.lowlevel.CORE == "python"
    elif os.environ.get("EXITSAFE_EXPECT_COMPILED") == "1":
        # CI builds the extension on every interpreter: a failed build must fail here
        assert BUILT, "exitsafe._speedups was not built by the install"
        assert exitsafe.lowlevel.CORE == "compiled"
    else:
        assert exitsafe.lowlevel.CORE == ("compiled" if BUILT else "python")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_pure_python_is_forced_by_the_environment(value):
    assert _core_of(value) == "python"


@pytest.mark.parametrize("value", ["", "0"])
def test_compiled_core_is_the_default_when_built(value):
    assert _core_of(value) == ("compiled" if BUILT else "python")


@compiled_only
def test_compiled_core_runs_the_hot_path():
    registry = exitsafe.Registry("cores")
    assert type(exitsafe.Registry.__dict__["track"]).__name__ == "method_descriptor"
    released = []
    handle = registry.track(7, released.append, kind="buffer")
    assert handle.owners == 1 and handle.kind == "buffer" and handle.name == "buffer#1"
    assert handle.retain() is handle and handle.owners == 2
    handle.release()
    handle.release()
    assert released == [7] and handle.state == "released"
    assert [(e.name, e.outcome) for e in registry.ledger()] == [("buffer#1", "released")]


# ---------------------------------------------------------------- the compiled lock


@compiled_only
def test_lock_is_reentrant_and_knows_its_owner():
    lock = _core.speedups.Lock()
    assert not lock.locked() and not lock._is_owned()
    assert lock.acquire() and lock.acquire(False)
    assert lock._is_owned() and lock.locked()
    lock.release()
    assert lock._is_owned()
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()


@compiled_only
def test_lock_refuses_bad_arguments():
    lock = _core.speedups.Lock()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(True, -2.0)
    with pytest.raises(TypeError):
        _core.speedups.Lock(1)


@compiled_only
def test_lock_held_by_another_thread():
    lock = _core.speedups.Lock()
    held, done = threading.Event(), threading.Event()

    def holder():
        lock.acquire()
        held.set()
        done.wait(30)
        lock.release()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)
    assert lock.locked() and not lock._is_owned()
    assert lock.acquire(False) is False
    assert lock.acquire(True, 0.05) is False  # bounded: the timeout is kept
    with pytest.raises(RuntimeError):
        lock.release()  # not the owner
    done.set()
    assert lock.acquire(True, 30)  # taken once the holder lets go
    lock.release()
    thread.join(30)


@compiled_only
def test_lock_blocked_main_thread_runs_signal_handlers():
    """A signal handler raising while the main thread waits for the lock ends the wait
    with its exception (as with threading's locks), the lock still held elsewhere."""
    program = textwrap.dedent(
        """
        import signal, threading
        from exitsafe import _core
        lock = _core.speedups.Lock()
        held = threading.Event()
        def holder():
            lock.acquire(); held.set(); threading.Event().wait(5); lock.release()
        threading.Thread(target=holder, daemon=True).start()
        held.wait()
        class Alarm(Exception): pass
        def on_alarm(*_): raise Alarm()
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        try:
            lock.acquire()
        except Alarm:
            print("interrupted", lock._is_owned())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted False"


@compiled_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_lock_is_free_in_a_forked_child_after_reinit():
    """The lock held across fork() is free in the child once reinitialized (in a program of
    its own: the test process has threads, and forking it would warn)."""
    program = textwrap.dedent(
        """
        import os
        from exitsafe import _core
        lock = _core.speedups.Lock()
        lock.acquire()
        pid = os.fork()
        if pid == 0:  # the child: the holder may not exist here; reinit frees it
            lock._at_fork_reinit()
            os._exit(0 if lock.acquire(False) and lock._is_owned() else 1)
        lock.release()
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", program], capture_output=True, text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


# ---------------------------------------------------------------- the live table


def _bare_handles(count):
    """Handles in no table (never released: no owner), numbered 1..count."""
    from exitsafe import _record
    from exitsafe._handle import Handle

    registry = exitsafe.Registry("bare")
    handles = []
    for seq in range(1, count + 1):
        h = _record.new(
            Handle, registry._state, seq, None, "t", None, (), None, None, _record.HANDLE, 0, 0
        )
        _record.drop_all_owners(h)
        _record.number(h, seq)
        handles.append(h)
    return handles


@pytest.mark.parametrize("table_type", ["LiveTable", "PurePythonLiveTable"])
def test_live_table_holds_handles_weakly_and_hooks_strongly(table_type):
    from exitsafe import _live

    table = getattr(_live, table_type)()
    a, b, c = _bare_handles(3)
    table.add(a, False)
    table.add(b, True)
    table.add(c, False)
    assert table.nodes() == [a, b, c] and len(table) == 3  # oldest first
    table.discard(a)
    table.discard(a)  # absent: nothing happens
    assert table.nodes() == [b, c]
    del b, c
    import gc

    gc.collect()
    found = table.nodes()
    assert [h._seq for h in found] == [2], "the owned one stays, the weak one went"
    table.discard(found[0])
    assert table.nodes() == []


@compiled_only
def test_compiled_live_table_refuses_bad_input():
    table = _core.speedups.LiveTable()
    with pytest.raises(TypeError, match="handle records"):
        table.add(object(), False)
    with pytest.raises(TypeError, match="handle records"):
        table.discard(object())
    (h,) = _bare_handles(1)
    table.add(h, False)
    with pytest.raises(ValueError, match="already"):
        table.add(h, False)
    with pytest.raises(TypeError):
        _core.speedups.LiveTable(1)


@compiled_only
def test_handle_in_a_cycle_is_released_once_by_the_collector():
    import gc

    registry = exitsafe.Registry("cycle")
    released = []

    class Wrapper:
        pass

    wrapper = Wrapper()
    wrapper.handle = registry.track(wrapper, lambda raw: released.append("x"))
    del wrapper
    gc.collect()
    assert released == ["x"]
    assert len(registry) == 0
    assert [e.outcome for e in registry.ledger()] == ["released"]


# ---------------------------------------------------------------- one semantics, both cores
# (CI runs these under each core: the compiled one hands every case it does not take
# itself to the Python path, which must answer as the pure-Python core does)


def _noop(raw):
    pass


@pytest.mark.parametrize("shape", ["handle", "tuple", "list"])
def test_depends_on_shapes(shape):
    registry = exitsafe.Registry("shapes")
    parent = registry.track("p", _noop, name="p")
    deps = {"handle": parent, "tuple": (parent,), "list": [parent]}[shape]
    child = registry.track("c", _noop, depends_on=deps)
    assert child.depends_on == (parent,)
    parent.release()
    assert parent.state == "live", "its dependent keeps it"
    child.release()
    assert (parent.state, child.state) == ("released", "released")
    assert [e.name for e in registry.ledger()] == ["handle#2", "p"]


def test_duplicate_parents_count_once():
    registry = exitsafe.Registry("dups")
    parent = registry.track("p", _noop)
    child = registry.track("c", _noop, depends_on=(parent, parent))
    assert child.depends_on == (parent,)
    parent.release()
    child.release()
    assert parent.state == "released"


def test_bad_track_arguments_are_explained():
    registry = exitsafe.Registry("bad")
    other = exitsafe.Registry("other").track("o", _noop, name="o")
    ended = registry.track("e", _noop, name="e")
    ended.release()
    with pytest.raises(TypeError, match="release must be callable"):
        registry.track(1, 2)
    with pytest.raises(TypeError, match="kind must be a str"):
        registry.track(1, _noop, kind=3)
    with pytest.raises(TypeError, match="must contain exitsafe Handles"):
        registry.track(1, _noop, depends_on=[object()])
    with pytest.raises(ForeignHandleError, match="'o' belongs to registry 'other'"):
        registry.track(1, _noop, depends_on=[other])
    with pytest.raises(exitsafe.HandleClosedError, match="'e' was released"):
        registry.track(1, _noop, depends_on=ended)
    with pytest.raises(TypeError):
        registry.track(1)
    with pytest.raises(TypeError):
        registry.track(1, _noop, colour="red")
    assert len(registry) == 0, "nothing registered by a refused call"


def test_release_failure_leaks_the_parents_it_frees():
    registry = exitsafe.Registry("fail")
    parent = registry.track("p", _noop, name="p")

    def broken(raw):
        raise RuntimeError("driver says no")

    child = registry.track("c", broken, name="c", depends_on=[parent])
    parent.release()
    with pytest.raises(RuntimeError, match="driver says no"):
        child.release()
    outcomes = {e.name: e.outcome for e in registry.ledger()}
    assert outcomes == {"c": "release_failed", "p": "leaked_dependent"}


def test_module_track_uses_the_default_registry():
    handle = exitsafe.track("m", _noop, kind="thing", depends_on=[])
    assert handle.registry is exitsafe.lowlevel.default_registry() and handle.kind == "thing"
    handle.release()
    assert handle.state == "released"


def test_failed_release_leaks_its_parents_last_first():
    registry = exitsafe.Registry("order")
    parents = [registry.track(i, _noop, name=f"p{i}") for i in (1, 2, 3)]

    def broken(raw):
        raise ValueError("boom")

    child = registry.track("c", broken, name="c", depends_on=parents)
    for parent in parents:
        parent.release()
    with pytest.raises(ValueError, match="boom"):
        child.release()
    assert [(e.name, e.outcome) for e in registry.ledger()] == [
        ("c", "release_failed"),
        ("p3", "leaked_dependent"),
        ("p2", "leaked_dependent"),
        ("p1", "leaked_dependent"),
    ]


@pytest.mark.parametrize("limit", [2**62, 2**63])
def test_huge_ledger_limit(limit):
    registry = exitsafe.Registry("huge", ledger_limit=limit)
    registry.track(1, _noop).release()
    assert [e.outcome for e in registry.ledger()] == ["released"]


def test_track_interrupted_while_waiting_for_the_lock_owns_nothing():
    """A track() that raises (here a KeyboardInterrupt while it waits for the lock, held by
    another thread) never releases the object: the caller still owns it."""
    program = textwrap.dedent(
        """
        import gc, sys, threading
        import exitsafe
        from exitsafe import _sync
        registry = exitsafe.Registry("k")
        held, done = threading.Event(), threading.Event()
        def holder():
            _sync.LOCK.acquire(); held.set(); done.wait(); _sync.LOCK.release()
        thread = threading.Thread(target=holder)
        thread.start()
        held.wait()
        def tracer(frame, event, arg):  # the wait for the lock is interrupted
            if event == "call" and frame.f_code is _sync.wait.__code__:
                sys.settrace(None)
                raise KeyboardInterrupt
        called = []
        sys.settrace(tracer)
        try:
            # (an option: the pure-Python core's lock-free path never waits for the lock)
            registry.track("RAW", called.append, exit_policy="release")
        except KeyboardInterrupt:
            print("interrupted")
        sys.settrace(None)
        done.set()
        thread.join()
        gc.collect()
        print(called, len(registry.ledger()), len(registry))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["interrupted", "[] 0 0"], out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr


@pytest.mark.parametrize("call", ["release", "track", "retain", "ledger"])
def test_a_ctrl_c_right_after_the_lock_was_taken_leaves_it_free(call):
    """Python may raise a KeyboardInterrupt right after a call that took exitsafe's lock:
    here the Ctrl-C is sent while the main thread waits for the lock another thread
    holds, and Python raises it once the wait succeeded.  The lock must not stay held by
    the main thread (its releases were deferred for ever, other threads hung, and the exit
    teardown deferred itself: no handle was released at exit, none had an outcome)."""
    program = textwrap.dedent(
        f"""
        import signal, sys, threading, time
        import exitsafe
        from exitsafe import _sync
        registry = exitsafe.Registry("k")
        kept = registry.track("KEPT", lambda raw: print("released", raw), name="kept")
        # (an option: the locked path, which waits for the lock; the pure-Python core's
        # lock-free path for handles without options never does)
        h = registry.track(
            "H", lambda raw: print("released", raw), name="h", exit_policy="release"
        )
        main = threading.get_ident()
        def section_elsewhere():
            _sync.enter()  # another thread in a long section
            time.sleep(0.3)
            _sync.release()
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, acted on by the main thread
        threading.Thread(target=section_elsewhere).start()
        time.sleep(0.05)
        calls = {{
            "release": h.release,
            "track": lambda: registry.track(
                "T", lambda raw: None, name="t", exit_policy="release"
            ).release(),
            "retain": h.retain,
            "ledger": registry.ledger,
        }}
        try:
            calls[{call!r}]()
            time.sleep(1)  # (the signal may come after the call returned)
        except KeyboardInterrupt:
            pass
        print("held:", _sync.reentered())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "held: False" in lines, out.stdout + out.stderr
    assert lines.count("released KEPT") == 1 and lines.count("released H") == 1, out.stdout
    assert "Exception ignored" not in out.stderr and "still held" not in out.stderr, out.stderr


@pytest.mark.parametrize("with_parent", [False, True], ids=["leaf", "chain"])
def test_a_ctrl_c_while_waiting_to_record_a_release_loses_no_outcome(with_parent):
    """The release function returned; the release then waits for the lock (another
    thread's section) to record it, and a Ctrl-C arrives: the record is made, the parents
    it frees are released, then the KeyboardInterrupt is raised (the handle stayed
    'releasing' with no outcome, and its parent was leaked at exit)."""
    program = textwrap.dedent(
        f"""
        import signal, threading, time
        import exitsafe
        from exitsafe import _sync
        registry = exitsafe.Registry("k")
        calls, holding = [], threading.Event()
        main = threading.get_ident()
        def section_elsewhere():
            _sync.enter()
            holding.set()
            time.sleep(0.2)  # the release waits for the lock to record itself
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C
            time.sleep(0.2)
            _sync.release()
        def release(raw):
            calls.append(raw)
            threading.Thread(target=section_elsewhere).start()
            holding.wait()
        parents = [registry.track("P", calls.append, name="p")] if {with_parent!r} else []
        # (an option: the pure-Python core's lock-free path records without the lock)
        h = registry.track("X", release, name="x", depends_on=parents, exit_policy="release")
        for parent in parents:
            parent.release()  # waits for x
        try:
            h.release()
        except KeyboardInterrupt:
            print("interrupted")
        print(calls, [(e.name, e.outcome) for e in registry.ledger()])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    expected = (
        "['X', 'P'] [('x', 'released'), ('p', 'released')]" if with_parent
        else "['X'] [('x', 'released')]"
    )
    assert out.stdout.splitlines() == ["interrupted", expected], out.stdout + out.stderr


def test_a_ctrl_c_while_queued_releases_run_is_raised_after_them():
    """Releases queued by finalizers run on the main thread at its next exitsafe call;
    a Ctrl-C arriving meanwhile could land between taking a request off the queue and
    running it (the request was lost).  Signals are held back while the queue runs, and
    the KeyboardInterrupt comes after it: here the first request's release is where the
    Ctrl-C arrives, and the second still runs before it is raised."""
    program = textwrap.dedent(
        """
        import signal
        import exitsafe
        from exitsafe import _sync
        registry = exitsafe.Registry("k")
        ran = []
        def first(raw):
            ran.append(raw)
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, while the queue runs
        handles = [registry.track("A", first), registry.track("B", ran.append)]
        for h in handles:
            _sync.defer(h.release)  # as finalizers that interrupted a section queue them
        try:
            registry.ledger()  # any exitsafe call runs the queue
        except KeyboardInterrupt:
            print("interrupted after", ran)
        print([(e.name, e.outcome) for e in registry.ledger()])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "interrupted after ['A', 'B']",
        "[('handle#1', 'released'), ('handle#2', 'released')]",
    ], out.stdout + out.stderr


def test_a_failed_release_at_the_recursion_limit_does_not_hang():
    """Recording a failed release waits for the lock again after an interrupt; an error
    that comes back at every try (a RecursionError, at the recursion limit) is raised,
    never retried for ever (the process spun at 100% CPU)."""
    program = textwrap.dedent(
        """
        import sys
        import exitsafe
        registry = exitsafe.Registry("deep")
        def deep(n, h):
            if n == 0:
                try:
                    h.release()
                except BaseException as exc:
                    return type(exc).__name__
                return "returned"
            return deep(n - 1, h)
        sys.setrecursionlimit(200)
        depth, frame = 0, sys._getframe()
        while frame:
            depth, frame = depth + 1, frame.f_back
        for below in range(3, 9):  # int("x") raises in C: the release adds no frame
            print(below, deep(200 - depth - below, registry.track("x", int)), flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 6, out.stdout + out.stderr


def test_an_interrupt_in_the_affine_queue_run_by_track_owns_nothing(monkeypatch):
    """track() runs this thread's queued thread-affine releases after the registration;
    an interrupt there is raised by track(), which then owns nothing (the pure core
    released the object the caller was told it still owned)."""
    import gc

    from exitsafe import _releases

    registry = exitsafe.Registry("cores-affine-undo")
    released: list[object] = []
    affine = registry.track("AFFINE", released.append, affinity="creator", name="affine")
    other = threading.Thread(target=affine.release)  # due on another thread: queued here
    other.start()
    other.join()
    real = _releases._run_mine

    def interrupted() -> None:
        monkeypatch.setattr(_releases, "_run_mine", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(_releases, "_run_mine", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.track("RAW", released.append)
    gc.collect()
    assert "RAW" not in released
    assert ("handle#2", "detached") in [(e.name, e.outcome) for e in registry.ledger()]
    registry.teardown()
    assert released == ["AFFINE"]


def test_an_interrupt_while_a_failed_release_records_itself_ends_the_chain_first(monkeypatch):
    """A parent's release failed and a Ctrl-C came while it waited to record that: the
    other parents the chain freed are still released, then the interrupt is raised (the
    compiled core abandoned them: leaked at exit)."""
    from exitsafe import _releases

    registry = exitsafe.Registry("cores-chain-interrupt")
    calls: list[object] = []

    def failing(raw: object) -> None:
        calls.append(raw)
        raise OSError("close failed")

    p1 = registry.track("P1", calls.append, name="p1")
    p2 = registry.track("P2", failing, name="p2")
    child = registry.track("C", calls.append, name="c", depends_on=[p1, p2])
    p1.release()
    p2.release()
    record_once = _releases._record_once
    interrupted = []

    def interrupted_while_waiting(node, outcome, *args):  # (before it holds the lock)
        if outcome == "release_failed" and not interrupted:
            interrupted.append(node)
            raise KeyboardInterrupt
        return record_once(node, outcome, *args)

    monkeypatch.setattr(_releases, "_record_once", interrupted_while_waiting)
    with pytest.raises(KeyboardInterrupt):
        child.release()
    monkeypatch.undo()
    assert sorted(calls) == ["C", "P1", "P2"]
    assert {e.name: e.outcome for e in registry.ledger()} == {
        "c": "released", "p1": "released", "p2": "release_failed",
    }


@pytest.mark.parametrize("with_parent", [False, True], ids=["no-parent", "one-parent"])
def test_track_raising_after_its_registration_owns_nothing(with_parent):
    """Queued work runs right after a registration; when it raises (a KeyboardInterrupt in a
    release queued by a finalizer), track() raises it, and the object it never handed over
    stays the caller's: detached, never released, even once the handle is collected."""
    import gc

    from exitsafe import _sync

    registry = exitsafe.Registry("cores-undo")
    parent = registry.track("PARENT", _noop, name="parent")
    released: list[object] = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    _sync.defer(interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.track("RAW", released.append, depends_on=[parent] if with_parent else ())
    gc.collect()
    assert released == []
    assert [(e.name, e.outcome) for e in registry.ledger()] == [("handle#2", "detached")]
    assert parent.state == "live"
    parent.release()  # no dependent is left
    assert parent.state == "released"
    registry.teardown()
    assert released == []


@compiled_only
def test_a_compiled_handle_fits_in_200_bytes():
    # The bar of the performance issue: <= 200 B per live handle.  The record is one
    # object (no int object for its creation number, no slots for the fields most handles
    # leave None); pymalloc rounds it to 16 B, and the garbage collector adds its header.
    registry = exitsafe.Registry("cores-size")
    handle = registry.track(object(), lambda raw: None)
    assert sys.getsizeof(handle) <= 200
    handle.release()


@compiled_only
def test_rarely_set_fields_read_none_until_set_and_keep_what_is_set():
    registry = exitsafe.Registry("cores-extra")
    parent = registry.track("p", lambda raw: None, name="parent", timeout=2.5)
    child = registry.track(
        "c", lambda raw: None, depends_on=parent, exit_policy="leak", affinity="creator"
    )
    plain = registry.track("x", lambda raw: None)
    assert (plain.name, plain._policy, plain._timeout, plain._affinity) == (
        "handle#3", None, None, None
    )
    assert (parent.name, parent._timeout) == ("parent", 2.5)
    assert (child._policy, child._affinity, child._name) == ("leak", threading.main_thread(), None)
    child._policy = None  # back to the registry's default
    assert child._policy is None
    for handle in (child, plain, parent):
        handle.release()
    # the ledger's records name them as before (the creation number made an int on demand)
    assert [(e.name, e.outcome) for e in registry.ledger()] == [
        ("handle#2", "released"),
        ("handle#3", "released"),
        ("parent", "released"),
    ]
    assert [e.seq for e in registry.ledger()] == [2, 3, 1]
    with pytest.raises(AttributeError):
        del plain._name


@compiled_only
def test_a_cycle_through_a_rarely_set_field_is_collected():
    # The fields kept outside the handle are still visited by the garbage collector.
    # (Through the exit policy: a handle's name would stay referenced by its ledger record.)
    import gc
    import weakref

    registry = exitsafe.Registry("cores-extra-gc")
    released = []

    class Policy:
        handle = None

        def __call__(self, info):
            return "release"

    policy = Policy()
    handle = registry.track("raw", released.append, exit_policy=policy)
    policy.handle = handle  # a cycle: handle -> its policy -> handle
    alive = weakref.ref(policy)
    del handle, policy
    gc.collect()
    assert alive() is None
    assert released == ["raw"]


@compiled_only
def test_a_release_failing_amid_the_compiled_steps_leaks_its_parents_only():
    registry = exitsafe.Registry("cores-steps")
    order = []
    parent = registry.track("parent", order.append, name="parent")
    other = registry.track("other", order.append, name="other")

    def failing(raw):
        order.append(raw)
        raise OSError("device lost")

    child = registry.track("child", failing, depends_on=parent, name="child")
    last = registry.track("last", order.append, name="last")
    registry.teardown()
    assert (parent.state, other.state, child.state, last.state) == (
        "leaked", "released", "leaked", "released"
    )
    outcomes = {e.name: e.outcome for e in registry.ledger()}
    assert outcomes == {
        "last": "released_at_exit",
        "child": "release_failed",
        "other": "released_at_exit",
        "parent": "leaked_dependent",
    }
    assert order == ["last", "child", "other"]
    records = registry._state.records
    assert ("released_at_exit" in {r[3] for r in records}) and all(len(r) == 6 for r in records)
    assert tuple(records[0]) == (4, "handle", "last", "released_at_exit", None, True)
    assert records[0] == (4, "handle", "last", "released_at_exit", None, True)


@compiled_only
def test_compiled_teardown_helpers_refuse_bad_arguments():
    from exitsafe._core import speedups

    with pytest.raises(TypeError):
        speedups.release_steps([], 0, {}, "release", set())
    with pytest.raises(TypeError):
        speedups.release_steps((), 0, {}, "release", set(), ("released_at_exit", None))
    with pytest.raises(TypeError):
        speedups.record_exit_outcomes(None, [object()], 0, 1, set(), print, [])
    # plain objects in the order stop the compiled steps at once: the Python step decides
    assert speedups.release_steps([object()], 0, {}, "release", set(), ("r", None)) == (0, None)


@compiled_only
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    roles=st.lists(st.sampled_from(["handle", "library", "hook"]), min_size=0, max_size=24),
    edges=st.lists(st.tuples(st.integers(0, 23), st.integers(0, 23)), max_size=40),
    drop=st.sets(st.integers(0, 23), max_size=4),
)
def test_compiled_planner_orders_as_the_python_one(roles, edges, drop):
    # Random graphs of handles, libraries and hooks (edges from newer to older nodes, so no
    # cycle), some nodes left out of the set to order: the same order, element by element.
    from exitsafe import _graph
    from exitsafe._core import speedups

    registry = exitsafe.Registry("cores-planner")
    nodes = []
    for i, role in enumerate(roles):
        parents = sorted({p for c, p in edges if c == i and p < i})
        deps = [nodes[p] for p in parents if nodes[p]._role != 0]  # hooks are not parents
        if role == "hook":
            nodes.append(registry.on_teardown(lambda: None, before=deps[:1]))
        elif role == "library":
            nodes.append(registry.pin(object(), name=f"lib{i}"))
        else:
            nodes.append(registry.track(i, lambda raw: None, depends_on=deps))
    subset = [n for i, n in enumerate(nodes) if i not in drop]
    assert speedups.teardown_order(subset) == _graph.python_teardown_order(subset)
    registry.teardown()


@compiled_only
def test_compiled_planner_leaves_other_inputs_to_python():
    from exitsafe._core import speedups

    registry = exitsafe.Registry("cores-planner-other")
    h = registry.track(1, lambda raw: None)
    child = registry.track(2, lambda raw: None, depends_on=[h])
    assert speedups.teardown_order([h, child, h]) is None  # a parent given twice
    assert speedups.teardown_order([h, object()]) is None  # not a handle
    assert speedups.teardown_order([]) == []
    with pytest.raises(TypeError):
        speedups.teardown_order(42)
    child.release()
    h.release()


@compiled_only
def test_compiled_planner_hands_an_odd_record_to_python_without_an_error():
    from exitsafe._core import speedups

    registry = exitsafe.Registry("cores-planner-odd")
    h = registry.track(1, lambda raw: None)
    role = h._role
    h._role = 2**70  # private misuse: not a C long
    try:
        assert speedups.teardown_order([h]) is None  # and no exception left set
    finally:
        h._role = role
    h.release()


# ------------------------------------------------------- one process, several interpreters

SUBINTERPRETER = textwrap.dedent(
    """
    import gc, sys
    import exitsafe, exitsafe.ctypes

    def legacy_interpreter():
        # a subinterpreter sharing the main one's GIL, where ctypes can be imported
        try:
            import _interpreters as api  # 3.13+
            return api, api.create("legacy")
        except ImportError:
            import _xxsubinterpreters as api  # 3.9-3.12
            try:
                return api, api.create(isolated=False)  # 3.12
            except TypeError:
                return api, api.create()  # 3.9-3.11: never isolated

    api, sub = legacy_interpreter()
    print("main", exitsafe.lowlevel.CORE, flush=True)
    api.run_string(sub, '''
    import exitsafe, exitsafe.ctypes
    h = exitsafe.ctypes.track(0x4000, lambda raw: print("sub released", flush=True))
    print("sub", exitsafe.lowlevel.CORE, flush=True)
    h.release()
    ''')
    api.destroy(sub)
    gc.collect()
    # the main interpreter's exitsafe still works, with its own core
    h = exitsafe.ctypes.track(0x5000, lambda raw: print("main released", flush=True))
    h.release()
    for i in range(1, 1001):
        exitsafe.track(i, lambda raw: None).release()
    print("main", exitsafe.lowlevel.CORE, len(exitsafe.lowlevel.default_registry()), flush=True)
    """
)


def test_a_subinterpreter_runs_the_pure_python_core_and_leaves_the_main_one_working(tmp_path):
    # The compiled core keeps its state in process-wide C variables: a subinterpreter that
    # set them up would leave the main interpreter calling into its destroyed objects.
    script = tmp_path / "sub.py"
    script.write_text(SUBINTERPRETER)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
    )
    if "ImportError" in run.stderr and "interpreters" in run.stderr:
        pytest.skip(f"no private API for a legacy subinterpreter here: {run.stderr[-300:]}")
    assert run.returncode == 0, run.stderr
    core = exitsafe.lowlevel.CORE
    assert run.stdout.split("\n")[:5] == [
        f"main {core}", "sub python", "sub released", "main released", f"main {core} 0",
    ], run.stdout + run.stderr


@compiled_only
def test_the_compiled_core_is_set_up_once():
    import exitsafe.cffi
    import exitsafe.ctypes  # noqa: F401  (both set up at import: a second call is refused)
    from exitsafe._core import speedups

    assert speedups is not None and speedups.main_interpreter()
    with pytest.raises(RuntimeError, match="already set up"):
        speedups.setup_ctypes(print, {}, object, object, object)
    with pytest.raises(RuntimeError, match="already set up"):
        speedups.setup_pointers({}, object(), print)
    with pytest.raises(RuntimeError, match="already set up"):
        speedups.setup_cffi(print, {}, set(), set())
    with pytest.raises(RuntimeError, match="already set up"):
        speedups.setup()


def test_a_collected_handle_whose_release_raises_an_interrupt_is_logged_like_any_failure():
    """The garbage collection of a handle runs its release where no caller can receive an
    exception: a release function raising ``KeyboardInterrupt`` or ``SystemExit`` there is
    logged, like any other failure, by both cores (the pure-Python core re-sent the
    KeyboardInterrupt to the main thread, where it landed inside the finalizer itself: an
    "Exception ignored" traceback, and the interrupt lost all the same; a SystemExit left
    no trace at all)."""
    program = textwrap.dedent(
        """
        import exitsafe

        registry = exitsafe.Registry("k")

        def release(raw):
            raise raw(f"from {raw.__name__}")

        for error in (KeyboardInterrupt, SystemExit, OSError):
            h = registry.track(error, release, name=error.__name__)
            del h  # collected: released, and the error logged
            print("went on after", error.__name__, flush=True)
        print(sorted((e.name, e.outcome) for e in registry.ledger()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "went on after KeyboardInterrupt",
        "went on after SystemExit",
        "went on after OSError",
        "[('KeyboardInterrupt', 'release_failed'), ('OSError', 'release_failed'),"
        " ('SystemExit', 'release_failed')]",
    ], out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    for error in ("KeyboardInterrupt", "SystemExit", "OSError"):
        line = (
            f"release of handle {error!r} failed after its last reference was dropped: "
            f"{error}('from {error}')"
        )
        assert line in out.stderr, out.stderr


def test_a_failed_release_collected_inside_an_import_is_reported_without_importing():
    """A collection can run at any allocation, so inside an import of the program: the
    failure of a collected handle's release, logged from there, imported ``logging``, which
    found the ``threading`` being imported half-executed ("Exception ignored", nothing
    logged).  With ``logging`` not (fully) imported, the line goes to stderr as logging's
    last resort would print it.  The collection is forced inside ``import threading``."""
    program = textwrap.dedent(
        """
        import gc, sys
        import exitsafe

        assert "threading" not in sys.modules and "logging" not in sys.modules

        class Box:
            pass

        def release(raw):
            raise OSError("device lost")

        box = Box()
        box.h = exitsafe.track(box, release, name="cyclic")  # a cycle: only gc frees it
        del box
        gc.disable()

        def tracer(frame, event, arg):
            if frame.f_code.co_filename.endswith("threading.py"):
                def line(frame, event, arg):
                    if event == "line" and frame.f_lineno > 30:
                        sys.settrace(None)
                        frame.f_trace = None
                        gc.collect()  # as an automatic collection at an allocation here
                    return line
                return line
            return None

        sys.settrace(tracer)
        import threading
        sys.settrace(None)
        print([(e.name, e.outcome) for e in exitsafe.ledger()])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[('cyclic', 'release_failed')]"], out.stdout
    assert "Exception ignored" not in out.stderr, out.stderr
    assert out.stderr.splitlines() == [
        "release of handle 'cyclic' failed after its last reference was dropped: "
        "OSError('device lost')"
    ], out.stderr


def test_an_interrupt_after_any_call_in_a_section_never_leaves_the_lock_held():
    """CPython acts on a signal right after a call returns (and on entering a function):
    a ``KeyboardInterrupt`` can land there, anywhere in exitsafe's Python code.  It is
    raised here, by a tracer, after each call in turn that the hot operations make in
    exitsafe's modules, and the lock must be free afterwards every time.  (A section
    ended with ``if reentered(): release()``: an interrupt right after ``reentered()``
    returned skipped the release, and the lock stayed held for good: other threads hung,
    this one's releases were deferred for ever.)  After ``release()`` and ``retain()`` the
    handle ends with exactly one outcome (none if ``track()`` itself was interrupted: the
    caller still owns the object), never left "releasing" (an interrupt as the claim's
    section ended left it so, ``leaked_in_use`` at the teardown, and one right after the
    release recorded nothing).  Not yet for a borrow or a finalizer: an interrupt on
    entering their Python code drops the borrow's end or the collection's request."""
    program = textwrap.dedent(
        """
        import dis, gc, os, sys
        import exitsafe
        from exitsafe import _sync

        DIR = os.path.dirname(exitsafe.__file__)
        CALLS = {"CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW",
                 "CALL_FUNCTION_EX", "CALL_KW", "CALL_NO_KW"}
        after_calls = {}

        def points(code):  # offsets where CPython may act on a signal: after each call
            if code not in after_calls:
                found, previous = set(), None
                for ins in dis.get_instructions(code):
                    if previous is not None and previous.opname in CALLS:
                        found.add(ins.offset)
                    previous = ins
                after_calls[code] = found
            return after_calls[code]

        class Inject:
            def __init__(self, at):
                self.at, self.seen, self.fired = at, 0, False

            def at_instruction(self, code, offset):
                if offset in points(code):
                    self.seen += 1
                    if self.seen == self.at:
                        self.fired = True
                        raise KeyboardInterrupt

            # CPython 3.12+: sys.monitoring's instruction events (opcode tracing is not
            # delivered on every version there); before: sys.settrace's opcode events
            def start(self):
                if MONITORING is None:
                    sys.settrace(self.tracer)
                else:
                    CURRENT[0] = self
                    MONITORING.set_events(TOOL, MONITORING.events.INSTRUCTION)

            def stop(self):
                if MONITORING is None:
                    sys.settrace(None)
                else:
                    MONITORING.set_events(TOOL, 0)

            def tracer(self, frame, event, arg):
                if not frame.f_code.co_filename.startswith(DIR):
                    return None
                frame.f_trace_opcodes = True
                return self.local

            def local(self, frame, event, arg):
                if event == "opcode":
                    self.at_instruction(frame.f_code, frame.f_lasti)
                return self.local

        MONITORING, TOOL, CURRENT = getattr(sys, "monitoring", None), None, [None]
        if MONITORING is not None:
            for TOOL in (4, 3):
                try:
                    MONITORING.use_tool_id(TOOL, "interrupt injection")
                    break
                except ValueError:  # (taken)
                    continue

            def on_instruction(code, offset):
                if not code.co_filename.startswith(DIR):
                    return MONITORING.DISABLE  # (never of interest: not asked again)
                CURRENT[0].at_instruction(code, offset)

            MONITORING.register_callback(TOOL, MONITORING.events.INSTRUCTION, on_instruction)

        def scenario(kind, at):
            registry = exitsafe.Registry("k", step_timeout=0.5)  # (a dropped borrow's wait)
            inject = Inject(at)
            inject.start()
            tracked = False
            try:
                h = registry.track("raw", lambda raw: None)
                tracked = True
                if kind == "release":
                    h.release()
                elif kind == "retain":
                    h.retain()
                elif kind == "borrow":
                    with h.borrow():
                        pass
                elif kind == "gc":
                    del h
                    gc.collect()
            except KeyboardInterrupt:
                pass
            finally:
                inject.stop()
            held = _sync.reentered()
            while _sync.reentered():
                _sync.release()
            h = None
            gc.collect()
            registry.teardown()
            counts = registry.ledger_counts()
            ended = (
                sum(counts.values()) == 1 and not counts.get("leaked_in_use")
                if tracked
                else sum(counts.values()) == counts.get("detached", 0) <= 1
            )
            return inject.fired, held, ended

        old_hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
        for kind in ("release", "retain", "borrow", "gc"):
            at, held_at, unended_at = 1, [], []
            while True:
                fired, held, ended = scenario(kind, at)
                if not fired:
                    break
                if held:
                    held_at.append(at)
                if not ended and kind in ("release", "retain"):
                    unended_at.append(at)
                at += 1
            print(kind, at - 1, "points, lock left held at", held_at, "unended at", unended_at)
        sys.unraisablehook = old_hook
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4, out.stdout + out.stderr
    for line in lines:
        assert line.endswith("lock left held at [] unended at []"), out.stdout
    # the interrupts did land (the compiled core runs most of these in C: no Python there)
    assert sum(int(line.split()[1]) for line in lines) > 10, out.stdout


def test_a_logging_module_another_thread_is_importing_is_not_used(monkeypatch, capsys):
    """``logging`` half-imported by another thread (its names not defined yet) is taken
    for absent by what logs without importing: a daemon thread parking at exit while
    another thread imported ``logging`` died on "partially initialized module 'logging'
    has no attribute 'getLogger'"."""
    import importlib.machinery
    import types

    from exitsafe import _report

    half = types.ModuleType("logging")
    half.__spec__ = importlib.machinery.ModuleSpec("logging", None)
    half.__spec__._initializing = True  # (what importlib sets while the module runs)
    monkeypatch.setitem(sys.modules, "logging", half)
    assert _report.log_if_loaded() is None
    _report.error_from_finalizer("release of %s failed: %s", "x", "OSError()")
    assert capsys.readouterr().err == "release of x failed: OSError()\n"


def test_a_ctrl_c_while_waiting_for_another_threads_teardown_ends_the_wait():
    """``teardown()`` on the main thread waits (bounded) for a teardown running on another
    thread; a Ctrl-C meanwhile is raised at once.  (Signals were held back for the whole
    call, so the wait went on until that teardown was over.)  Here that teardown ends only
    once the main thread got its KeyboardInterrupt."""
    program = textwrap.dedent(
        """
        import os, signal, threading
        import exitsafe
        registry = exitsafe.Registry("k", teardown_timeout=60)
        started, interrupted = threading.Event(), threading.Event()
        def slow(raw):
            started.set()
            print("other teardown finished:", interrupted.wait(30), flush=True)
        keep = registry.track("x", slow, name="x")
        other = threading.Thread(target=registry.teardown)
        other.start()
        started.wait()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            registry.teardown()  # waits for the other thread's teardown
            print("returned")
        except KeyboardInterrupt:
            print("interrupted while waiting", flush=True)
            interrupted.set()
        other.join()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "interrupted while waiting", "other teardown finished: True"
    ], out.stdout + out.stderr


def test_an_interrupt_while_a_release_records_itself_keeps_nothing_of_its_caller():
    """A Ctrl-C landing while a release waits for the lock to record itself is raised to
    the caller once the record is made; no frame of exitsafe may keep it (its traceback
    reaches the caller's frame: a cycle kept the caller's objects alive until a
    collection)."""
    program = textwrap.dedent(
        """
        import gc, signal, threading, time, weakref
        import exitsafe
        from exitsafe import _sync

        class Thing:
            pass

        registry = exitsafe.Registry("c")
        holding = threading.Event()

        def hold_lock():
            _sync.acquire()
            holding.set()
            time.sleep(0.5)
            _sync.release()

        def release(raw):  # another thread holds the lock when this returns: a wait
            threading.Thread(target=hold_lock).start()
            holding.wait()
            signal.setitimer(signal.ITIMER_REAL, 0.1)  # a Ctrl-C during that wait

        def on_alarm(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, on_alarm)

        def caller():
            thing = Thing()
            # (an option: the pure-Python core's lock-free path records without the lock)
            h = registry.track("raw", release, name="h", exit_policy="release")
            try:
                h.release()
            except KeyboardInterrupt:
                print("interrupted")
            return weakref.ref(thing)

        gc.disable()
        ref = caller()
        time.sleep(0.6)
        print("caller's object alive:", ref() is not None)
        print([(e.name, e.outcome) for e in registry.ledger()])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "interrupted", "caller's object alive: False", "[('h', 'released')]"
    ], out.stdout + out.stderr

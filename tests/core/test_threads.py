"""Thread-safety of the lifetime core: concurrent owners, GC on other threads, teardown races.

Every test synchronizes with Events and Barriers; nothing asserts on speed.  The only
sleeps are the core's own step and teardown timeouts, kept small (0.2-0.3 s).
"""

from __future__ import annotations

import gc
import logging
import queue
import sys
import threading
import weakref
from collections import Counter

import pytest

import exitsafe
from exitsafe import HandleClosedError, Outcome, Registry, policies

ENV_VARS = (
    "EXITSAFE_AT_EXIT",
    "EXITSAFE_TRACE",
    "EXITSAFE_LEDGER",
    "EXITSAFE_STEP_TIMEOUT",
    "EXITSAFE_TEARDOWN_TIMEOUT",
)

#: Generous bound for joins and waits that must never be reached: a hang fails the
#: test instead of blocking the suite.
LONG = 30.0


@pytest.fixture(autouse=True)
def _env_and_interleaving(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    logger = logging.getLogger("exitsafe")
    monkeypatch.setattr(logger, "propagate", False)
    null = logging.NullHandler()
    logger.addHandler(null)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings
    yield
    sys.setswitchinterval(old)
    logger.removeHandler(null)


class Recorder:
    """Release functions that log ``(raw, thread ident)``; appends are atomic."""

    def __init__(self) -> None:
        self.log: list[tuple[object, int]] = []
        self.violations: list[str] = []

    def __call__(self, raw: object) -> None:
        self.log.append((raw, threading.get_ident()))

    @property
    def raws(self) -> list[object]:
        return [raw for raw, _ in self.log]


def outcomes(reg: Registry) -> dict[str, str]:
    entries = reg.ledger()
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), f"a handle ended twice: {Counter(names).most_common(3)}"
    return {e.name: e.outcome for e in entries}


def start(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def join(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(LONG)
        assert not t.is_alive(), f"{t.name} hung"


def check_one_outcome_per_call(reg: Registry, rec: Recorder) -> None:
    counts = reg.ledger_counts()
    natively = counts.get(Outcome.RELEASED, 0) + counts.get(Outcome.RELEASED_AT_EXIT, 0)
    assert len(rec.log) == natively + counts.get(Outcome.RELEASE_FAILED, 0)
    calls = Counter(rec.raws)
    assert all(v == 1 for v in calls.values()), calls.most_common(3)


# ---------------------------------------------------------------- owners on many threads


def test_concurrent_track_retain_release_no_lost_update():
    reg = Registry(name="threads-owners", ledger_limit=None)
    rec = Recorder()
    released: set[object] = set()
    N, M = 8, 300

    def release(raw):
        # a parent is released only after every child that depends on it
        if raw == "root":
            missing = [t for t in range(N) if ("keeper", t) not in released]
            if missing:
                rec.violations.append(f"root before keepers {missing}")
        elif isinstance(raw, tuple) and raw[0] == "parent":
            t = raw[1]
            missing = [i for i in range(0, M, 4) if (t, i) not in released]
            if missing:
                rec.violations.append(f"parent {t} before children {missing[:5]}")
        rec(raw)
        released.add(raw)

    root = reg.pin("root", close=release, name="root")
    keepers = [
        reg.track(("keeper", t), release, depends_on=[root], name=f"keeper{t}") for t in range(N)
    ]
    root.release()  # pending: the keepers depend on it
    assert rec.log == [] and root.state == "live"
    with pytest.raises(HandleClosedError):
        root.retain()

    handoff = [queue.SimpleQueue() for _ in range(N)]
    go = threading.Barrier(N)
    produced = threading.Barrier(N)

    def worker(t: int) -> None:
        go.wait()
        parent = reg.track(("parent", t), release, kind="device", name=f"parent{t}")
        for i in range(M):
            deps = [parent] if i % 4 == 0 else ()
            h = reg.track((t, i), release, depends_on=deps, name=f"h{t}.{i}")
            h.retain().retain()
            handoff[(t + 1) % N].put(h)  # the next thread drops one owner
            h.release()
            h.release()
            try:
                handoff[t].get_nowait().release()
            except queue.Empty:
                pass
        del h
        produced.wait()
        while True:
            try:
                handoff[t].get_nowait().release()
            except queue.Empty:
                break
        parent.release()  # deferred while a child lives anywhere
        keepers[t].release()

    threads = [start(worker, t) for t in range(N)]
    join(*threads)
    keepers.clear()
    gc.collect()

    assert rec.violations == []
    total = N * M + N + N + 1
    calls = Counter(rec.raws)
    assert len(calls) == total and set(calls.values()) == {1}
    assert reg.ledger_counts() == {Outcome.RELEASED: total}
    assert len(set(outcomes(reg))) == total
    assert reg.live_handles() == []
    assert reg.late_requests == 0
    reg.teardown()
    assert reg.ledger_counts() == {Outcome.RELEASED: total}


def test_release_on_a_thread_other_than_the_creator():
    reg = Registry(name="threads-foreign", exit_policy=policies.leak_if_foreign_thread)
    rec = Recorder()
    made: dict[str, exitsafe.Handle] = {}

    def create():
        made["worker"] = reg.track("worker-made", rec, name="worker-made")
        made["worker-kept"] = reg.track("worker-kept", rec, name="worker-kept")

    join(start(create))
    made["main"] = reg.track("main-made", rec, name="main-made")
    made["main-kept"] = reg.track("main-kept", rec, name="main-kept")
    assert not made["worker"].created_on_main_thread
    assert made["main"].created_on_main_thread
    assert made["worker"].thread_id != threading.get_ident()

    # created on a worker (which has ended), released on the main thread
    made["worker"].release()
    assert rec.log == [("worker-made", threading.get_ident())]
    # created on the main thread, released on a worker
    worker = start(made["main"].release)
    join(worker)
    assert rec.log[1] == ("main-made", worker.ident)

    # at exit the foreign-thread policy leaks what a worker created
    reg.teardown()
    got = outcomes(reg)
    assert got["worker-kept"] == Outcome.LEAKED_POLICY
    assert got["main-kept"] == Outcome.RELEASED_AT_EXIT
    assert [raw for raw, _ in rec.log] == ["worker-made", "main-made", "main-kept"]


class Box:
    """A raw object that refers back to its handle: handle and raw form a reference cycle."""

    __slots__ = ("__weakref__", "handle")


def test_gc_of_handles_on_other_threads():
    reg = Registry(name="threads-gc", ledger_limit=None)
    rec = Recorder()
    released: set[str] = set()
    N, M = 6, 200

    def release(raw):
        name = raw if isinstance(raw, str) else raw.handle_name
        if name.startswith("parent"):
            t = name[len("parent") :]
            missing = [i for i in range(M) if f"c{t}.{i}" not in released]
            if missing:
                rec.violations.append(f"{name} released before {missing[:5]}")
        rec(name)
        released.add(name)

    class CycleBox(Box):
        __slots__ = ("handle_name",)

    go = threading.Barrier(N)

    def worker(t: int) -> None:
        go.wait()
        parent = reg.track(f"parent{t}", release, name=f"parent{t}")
        for i in range(M):
            name = f"c{t}.{i}"
            if i % 3 == 0:
                box = CycleBox()
                box.handle_name = name
                box.handle = reg.track(box, release, depends_on=[parent], name=name)
                del box  # only the garbage collector can free this one
            else:
                h = reg.track(name, release, depends_on=[parent], name=name)
                del h  # reference counting frees it here, on this thread
            if i % 50 == 0:
                gc.collect()
        del parent  # the children keep it alive; it goes with the last of them
        gc.collect()

    threads = [start(worker, t) for t in range(N)]
    join(*threads)
    gc.collect()

    assert rec.violations == []
    total = N * (M + 1)
    calls = Counter(rec.raws)
    assert len(calls) == total and set(calls.values()) == {1}
    assert reg.ledger_counts() == {Outcome.RELEASED: total}
    assert reg.live_handles() == []
    workers = {t.ident for t in threads}
    assert {ident for _, ident in rec.log} - {threading.get_ident()} <= workers
    assert any(ident in workers for _, ident in rec.log), "GC released on the workers"


# ---------------------------------------------------------------- teardown racing other threads


@pytest.mark.parametrize("round_", range(12))
def test_teardown_racing_releases_on_other_threads(round_):
    reg = Registry(name=f"threads-race-{round_}", ledger_limit=None)
    rec = Recorder()
    released: set[str] = set()
    closed = threading.Event()
    N, K = 6, 40
    children: dict[str, list[str]] = {}

    halfway = threading.Event()
    threshold = (round_ % 4 + 1) * N * K // 6  # start the teardown part-way through

    def release(raw):
        if closed.is_set():
            rec.violations.append(f"{raw} released after teardown returned")
        for child in children.get(raw, ()):
            if child not in released:
                rec.violations.append(f"{raw} released before its dependent {child}")
        rec(raw)
        released.add(raw)
        if len(released) >= threshold:
            halfway.set()

    lib = reg.pin("lib", close=release, name="lib")
    parents = []
    kids: list[list[exitsafe.Handle]] = []
    for t in range(N):
        p = reg.track(f"p{t}", release, depends_on=[lib], name=f"p{t}")
        parents.append(p)
        row = [reg.track(f"c{t}.{i}", release, depends_on=[p], name=f"c{t}.{i}") for i in range(K)]
        kids.append(row)
        children[f"p{t}"] = [f"c{t}.{i}" for i in range(K)]
    children["lib"] = [f"p{t}" for t in range(N)]
    lib.release()
    everything = {"lib"} | set(children) | {c for row in children.values() for c in row}

    go = threading.Barrier(N + 2)

    def worker(t: int) -> None:
        go.wait()
        row = kids[t]
        if t % 2:
            parents[t].release()  # parent first: deferred behind its children
        if t % 3 == 2:
            while row:  # drop the last references: garbage collection releases them
                row.pop()
        for i, h in enumerate(row):
            if i % 5 == 0:
                try:
                    h.retain()
                    h.release()
                except HandleClosedError:
                    pass  # teardown claimed it already
            h.release()
            h.release()  # beyond the last owner: a no-op
        parents[t].release()

    def teardown(reason: str) -> None:
        reg.teardown(reason=reason)

    def second_teardown() -> None:
        go.wait()
        halfway.wait(LONG)
        teardown("racing")

    threads = [start(worker, t) for t in range(N)] + [start(second_teardown)]
    go.wait()
    assert halfway.wait(LONG)
    teardown("main")
    closed.set()
    assert reg.closed
    join(*threads)
    kids.clear()
    parents.clear()
    gc.collect()

    assert rec.violations == []
    got = outcomes(reg)
    assert set(got) == everything, "every handle ends in exactly one outcome"
    check_one_outcome_per_call(reg, rec)
    for name, outcome in got.items():
        assert (name in released) == (outcome in (Outcome.RELEASED, Outcome.RELEASED_AT_EXIT))
        if outcome == Outcome.RELEASED:
            assert all(e.at_exit is False for e in reg.ledger() if e.name == name)
    assert all(o in (Outcome.RELEASED, Outcome.RELEASED_AT_EXIT) for o in got.values())


def test_teardown_waits_for_a_release_running_on_another_thread():
    reg = Registry(name="threads-wait", ledger_limit=None)
    rec = Recorder()
    started, gate = threading.Event(), threading.Event()

    def slow(raw):
        started.set()
        assert gate.wait(LONG)
        rec(raw)

    parent = reg.track("parent", rec, name="parent")
    child = reg.track("child", slow, name="child", depends_on=[parent])
    parent.release()
    releaser = start(child.release)
    assert started.wait(LONG)
    # Hooks run first: this one lets the child's release finish while the teardown
    # is already under way, so the teardown waits for it and then releases the parent.
    reg.on_teardown(gate.set, name="open-gate")
    reg.teardown()
    join(releaser)
    got = outcomes(reg)
    assert got == {
        "child": Outcome.RELEASED,
        "parent": Outcome.RELEASED_AT_EXIT,
        "open-gate": Outcome.HOOK_RAN,
    }
    assert rec.log == [("child", releaser.ident), ("parent", threading.get_ident())]


def test_teardown_leaks_what_a_stuck_release_elsewhere_depends_on():
    reg = Registry(name="threads-stuck-elsewhere", step_timeout=0.2, ledger_limit=None)
    rec = Recorder()
    started, gate = threading.Event(), threading.Event()

    def stuck(raw):
        started.set()
        assert gate.wait(LONG)
        rec(raw)

    lib = reg.pin("lib", close=rec, name="lib")
    parent = reg.track("parent", rec, name="parent", depends_on=[lib])
    child = reg.track("child", stuck, name="child", depends_on=[parent])
    other = reg.track("other", rec, name="other")
    lib.release()
    parent.release()
    releaser = start(child.release)
    assert started.wait(LONG)
    reg.teardown()  # waits step_timeout for the child, then leaks what it depends on
    got = outcomes(reg)
    assert got == {
        "child": Outcome.LEAKED_IN_USE,  # recorded when the wait ran out, with the reason
        "parent": Outcome.LEAKED_DEPENDENT,
        "lib": Outcome.LEAKED_DEPENDENT,
        "other": Outcome.RELEASED_AT_EXIT,
    }
    child_entry = next(e for e in reg.ledger() if e.name == "child")
    assert "still being released on another thread" in child_entry.detail
    gate.set()
    join(releaser)
    # The release finished later on its own thread: the first outcome stands, once.
    assert outcomes(reg) == got
    assert len(reg.ledger()) == 4
    assert rec.raws == ["other", "child"]  # parent and lib never released
    assert other is not None


def test_borrow_on_one_thread_while_teardown_runs_on_another():
    reg = Registry(name="threads-borrow", ledger_limit=None)
    rec = Recorder()
    lib = reg.pin("lib", close=rec, name="lib")
    parent = reg.track("parent", rec, name="parent", depends_on=[lib])
    busy = reg.track("busy", rec, name="busy", depends_on=[parent])
    idle = reg.track("idle", rec, name="idle", depends_on=[lib])  # held: live at teardown
    inside, done = threading.Event(), threading.Event()
    seen = []

    def use():
        with busy.borrow() as raw:
            seen.append(raw)
            inside.set()
            assert done.wait(LONG)
            busy.release()  # during/after teardown: a recorded no-op, never native

    user = start(use)
    assert inside.wait(LONG)
    tearer = start(reg.teardown)
    join(tearer)
    got = outcomes(reg)
    assert got["busy"] == Outcome.LEAKED_IN_USE
    assert got["parent"] == Outcome.LEAKED_DEPENDENT
    assert got["lib"] == Outcome.LEAKED_DEPENDENT  # the borrowed handle still needs it
    assert got["idle"] == Outcome.RELEASED_AT_EXIT
    assert idle.state == "released"
    done.set()
    join(user)
    assert seen == ["busy"]
    assert rec.raws == ["idle"]
    assert outcomes(reg) == got
    assert reg.late_requests == 1
    with pytest.raises(HandleClosedError):
        busy.borrow().__enter__()


def test_borrow_refused_once_teardown_claimed_the_handle():
    reg = Registry(name="threads-borrow-late", ledger_limit=None)
    rec = Recorder()
    in_hook, resume = threading.Event(), threading.Event()
    h = reg.track("h", rec, name="h")

    def hook():
        in_hook.set()
        assert resume.wait(LONG)

    reg.on_teardown(hook, before=[h], name="hook")
    tearer = start(reg.teardown)
    assert in_hook.wait(LONG)
    # Teardown is under way on another thread and will release h after the hook.  A
    # borrow now is either refused, or it wins and h is then leaked, never released
    # under the running call.
    cm = h.borrow()
    try:
        cm.__enter__()
    except HandleClosedError:
        borrowed = False
    else:
        borrowed = True
    resume.set()
    join(tearer)
    if borrowed:
        assert rec.raws == []
        cm.__exit__(None, None, None)
    got = outcomes(reg)
    assert got["hook"] == Outcome.HOOK_RAN
    if borrowed:
        assert got["h"] == Outcome.LEAKED_IN_USE
        assert rec.raws == []
    else:
        assert got["h"] == Outcome.RELEASED_AT_EXIT
        assert rec.raws == ["h"]


def test_guard_returns_default_once_teardown_began():
    reg = Registry(name="threads-guard")
    calls = []
    g = exitsafe.guard(lambda x: calls.append(x) or x + 1, default="quiet", registry=reg)
    assert g(1) == 2 and g.active

    in_hook, resume = threading.Event(), threading.Event()
    from_threads: list[object] = []

    def hook():
        in_hook.set()
        assert resume.wait(LONG)

    reg.on_teardown(hook, name="blocking-hook")
    tearer = start(reg.teardown)
    assert in_hook.wait(LONG)
    assert reg.tearing_down and not reg.closed
    # a native thread calling back now gets the default, on any thread
    callers = [start(lambda: from_threads.append(g(5))) for _ in range(4)]
    join(*callers)
    assert from_threads == ["quiet"] * 4
    assert g(6) == "quiet" and not g.active

    # a second teardown() on another thread waits for the running one to finish
    after_wait = []
    waiter = start(lambda: (reg.teardown(), after_wait.append(reg.closed)))
    resume.set()
    join(tearer, waiter)
    assert after_wait == [True]
    assert g(7) == "quiet"
    assert calls == [1]


# ---------------------------------------------------------------- step and teardown timeouts


def test_step_timeout_leaks_a_blocked_release_and_what_it_depends_on():
    reg = Registry(name="threads-step-timeout", step_timeout=0.2, ledger_limit=None)
    rec = Recorder()
    started, gate, finished = threading.Event(), threading.Event(), threading.Event()

    def blocked(raw):
        started.set()
        gate.wait(LONG)
        finished.set()

    lib = reg.pin("lib", close=rec, name="lib")
    parent = reg.track("parent", rec, name="parent", depends_on=[lib])
    stuck = reg.track("stuck", blocked, name="stuck", depends_on=[parent])
    bystander = reg.track("bystander", rec, name="bystander")
    for h in (lib, parent):
        h.release()
    try:
        reg.teardown()
        assert started.is_set() and not finished.is_set()
        got = outcomes(reg)
        assert got == {
            "stuck": Outcome.LEAKED_TIMEOUT,
            "parent": Outcome.LEAKED_DEPENDENT,
            "lib": Outcome.LEAKED_DEPENDENT,
            "bystander": Outcome.RELEASED_AT_EXIT,
        }
        assert stuck.state == "leaked" and parent.state == "leaked"
        assert rec.raws == ["bystander"]
        assert reg.closed
    finally:
        gate.set()
    assert finished.wait(LONG)  # the abandoned step ends later: nothing more is recorded
    assert outcomes(reg) == got
    assert reg.ledger_counts()[Outcome.LEAKED_TIMEOUT] == 1
    assert bystander.state == "released"


def test_per_handle_timeout_without_a_registry_step_timeout():
    reg = Registry(name="threads-handle-timeout", ledger_limit=None)
    rec = Recorder()
    gate = threading.Event()
    parent = reg.track("parent", rec, name="parent")
    slow = reg.track(
        "slow", lambda raw: gate.wait(LONG), name="slow", depends_on=[parent], timeout=0.2
    )
    fast = reg.track("fast", rec, name="fast", depends_on=[parent])
    parent.release()
    try:
        reg.teardown()
    finally:
        gate.set()
    got = outcomes(reg)
    assert got["slow"] == Outcome.LEAKED_TIMEOUT
    assert got["fast"] == Outcome.RELEASED_AT_EXIT
    assert got["parent"] == Outcome.LEAKED_DEPENDENT
    assert rec.raws == ["fast"]
    assert fast.state == "released" and slow.state == "leaked"


def test_hook_timeout_leaks_what_it_runs_before():
    reg = Registry(name="threads-hook-timeout", ledger_limit=None)
    rec = Recorder()
    gate = threading.Event()
    buf = reg.track("buf", rec, name="buf")
    free = reg.track("free", rec, name="free")
    reg.on_teardown(lambda: gate.wait(LONG), before=[buf], name="flush", timeout=0.2)
    try:
        reg.teardown()
    finally:
        gate.set()
    got = outcomes(reg)
    assert got == {
        "flush": Outcome.HOOK_TIMEOUT,
        "buf": Outcome.LEAKED_DEPENDENT,  # the abandoned flush may still touch it
        "free": Outcome.RELEASED_AT_EXIT,
    }
    assert rec.raws == ["free"]
    assert buf.state == "leaked" and free.state == "released"


def test_teardown_timeout_is_a_total_deadline():
    reg = Registry(name="threads-total", teardown_timeout=0.3, ledger_limit=None)
    rec = Recorder()
    started, gate = threading.Event(), threading.Event()

    def blocked(raw):
        started.set()
        gate.wait(LONG)

    keep = [reg.track(f"old{i}", rec, name=f"old{i}") for i in range(3)]
    lib = reg.pin("lib", close=rec, name="lib")
    keep.append(lib)
    # newest handle goes first among ready handles: it uses up the whole budget
    keep.append(reg.track("blocker", blocked, name="blocker"))
    reg.on_teardown(lambda: rec("hook"), name="hook")  # hooks go before everything
    try:
        reg.teardown()
    finally:
        gate.set()
    assert started.is_set()
    entries = {e.name: e for e in reg.ledger()}
    assert entries["hook"].outcome == Outcome.HOOK_RAN
    assert entries["blocker"].outcome == Outcome.LEAKED_TIMEOUT
    for name in ("old0", "old1", "old2", "lib"):
        assert entries[name].outcome == Outcome.LEAKED_TIMEOUT
        assert "deadline" in entries[name].detail
    assert rec.raws == ["hook"]
    assert reg.closed
    assert all(h.state == "leaked" for h in keep)


def test_timeouts_longer_than_a_lock_can_wait_wait_as_long_as_it_can():
    """A step or teardown timeout beyond `threading.TIMEOUT_MAX` (some 292 years: in
    effect, no limit) made the wait for the step raise OverflowError: the teardown
    failed, recording a release that ran as leaked, and the step's worker thread later
    died on "release unlocked lock"; a second thread's wait for the teardown failed the
    same way.  Both now wait as long as a lock can."""
    huge = threading.TIMEOUT_MAX * 10
    reg = Registry(
        name="threads-huge", step_timeout=huge, teardown_timeout=huge, ledger_limit=None
    )
    rec = Recorder()
    main = threading.get_ident()
    started, waiting = threading.Event(), threading.Event()

    def waits_for_the_second_teardown(raw):
        started.set()
        # until the main thread waits for this teardown to finish (its stack says so)
        while not any(
            f.f_code.co_name == "_wait_for_teardown"
            for f in _frames_of(sys._current_frames().get(main))
        ):
            threading.Event().wait(0.001)
        waiting.set()
        rec(raw)

    keep = [reg.track("a", rec, name="a", timeout=huge)]
    keep.append(reg.track("b", waits_for_the_second_teardown, name="b"))
    first = threading.Thread(target=reg.teardown)
    first.start()
    started.wait()
    reg.teardown()  # the main thread: waits for the first one
    first.join()
    assert waiting.is_set()
    assert sorted(rec.raws) == ["a", "b"]
    assert outcomes(reg) == {"a": Outcome.RELEASED_AT_EXIT, "b": Outcome.RELEASED_AT_EXIT}
    # the worker that ran the steps runs the next one
    again = Registry(name="threads-huge-again", step_timeout=huge)
    again.track("c", rec, name="c")
    again.teardown()
    assert rec.raws[-1] == "c"


def _frames_of(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


# ---------------------------------------------------------------- core bugs


def test_cyclic_gc_on_another_thread_racing_teardown_loses_no_handle():
    # A collection on another thread is held in the middle of collecting a tracked handle's
    # reference cycle (a weakref callback on the garbage blocks) while the teardown runs.
    # What the teardown can still see of that handle depends on the collector: up to 3.14,
    # weak references to the garbage (the registry's included) are cleared before any
    # callback runs, so the teardown misses the handle and its finalizer finds the registry
    # closed: leaked, never released.  From 3.15 (gh-135552) plain weak references to the
    # garbage may still be alive while callbacks run, so the teardown finds the handle and
    # releases it; the finalizer that follows must then do nothing.  Either order is the
    # collector's right; the invariant is the same: one native release at most, made before
    # the registry closed, and exactly one ledger outcome that says which.
    reg = Registry(name="threads-gc-vs-teardown", ledger_limit=None)
    events: list[str] = []
    box = Box()
    box.handle = reg.track(box, lambda raw: events.append("released cyclic"), name="cyclic")
    keep = reg.track("kept", lambda raw: events.append("released kept"), name="kept")

    in_callback, resume = threading.Event(), threading.Event()

    def callback(_ref):
        # Runs inside the collection, before the garbage is freed.
        in_callback.set()
        resume.wait(LONG)

    witness = weakref.ref(box, callback)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del box
        collector = start(gc.collect)
        assert in_callback.wait(LONG)  # the collector is held inside the collection
        reg.teardown()  # e.g. the exit teardown while a daemon thread collects
        events.append("closed")
        resume.set()
        join(collector)
    finally:
        resume.set()
        if was_enabled:
            gc.enable()
    gc.collect()
    assert witness() is None  # the cycle was collected
    got = outcomes(reg)  # (asserts that no handle ended twice)
    assert got["kept"] == Outcome.RELEASED_AT_EXIT and keep.state == "released"
    # The cyclic handle ended with exactly one outcome, whichever the collector allowed.
    assert "cyclic" in got, f"no outcome for the cyclic handle: {got}"
    assert got["cyclic"] in (Outcome.RELEASED_AT_EXIT, Outcome.LEAKED_AFTER_CLOSE), got
    # Native code ran once at most, and never after the registry closed.
    released = events.count("released cyclic")
    assert released == (1 if got["cyclic"] == Outcome.RELEASED_AT_EXIT else 0), events
    assert events.index("closed") > max(
        (i for i, e in enumerate(events) if e.startswith("released")), default=-1
    ), events


def test_teardown_order_reads_each_nodes_edges_once():
    # A release finishing on another thread clears the handle's parents while the
    # teardown plans (the end-to-end race is in test_teardown_racing_releases_on_
    # other_threads).  The planner must count and walk the same edges: it reads each
    # node's parents once.  Duck-typed nodes make the interleaving deterministic.
    from exitsafe._graph import teardown_order
    from exitsafe._record import HANDLE

    class Node:
        def __init__(self, name: str, *parents: Node) -> None:
            self.name, self._role, self.reads = name, HANDLE, 0
            self._edges = parents

        @property
        def _parents(self) -> tuple[Node, ...]:
            self.reads += 1
            # the first read sees the edges; later ones see a finished release
            return self._edges if self.reads == 1 else ()

    parent = Node("parent")
    children = [Node(f"child{i}", parent) for i in range(4)]
    others = [Node(f"other{i}") for i in range(50)]
    order = teardown_order([parent, *children, *others])
    assert len(order) == 55
    assert order.index(parent) > max(order.index(c) for c in children)
    assert all(n.reads == 1 for n in [parent, *children, *others])


def test_hot_path_waits_for_a_long_held_lock():
    # track / retain / release yield to the lock's holder first, then block: a long
    # critical section elsewhere (a big teardown recording its outcomes) only delays them.
    reg = Registry(name="threads-long-hold", ledger_limit=None)
    rec = Recorder()
    h = reg.track("h", rec, name="h")
    done = threading.Event()
    results: list[str] = []

    def worker() -> None:
        other = reg.track("other", rec, name="other")
        h.retain()
        h.release()
        other.release()
        results.append("done")
        done.set()

    from exitsafe import _sync

    _sync.LOCK.acquire()
    try:
        thread = start(worker)
        # longer than the yields take: the worker has to block on the lock
        assert not done.wait(0.2)
    finally:
        _sync.LOCK.release()
    join(thread)
    assert results == ["done"]
    assert rec.raws == ["other"]
    assert h.owners == 1


def test_a_worker_timeout_longer_than_a_lock_can_wait_joins_as_long_as_it_can():
    # thread.join(timeout) raised OverflowError beyond TIMEOUT_MAX: the hook failed.
    reg = Registry(name="threads-huge-worker", ledger_limit=None)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    reg.worker(worker, stop=stop, timeout=threading.TIMEOUT_MAX * 10, name="w")
    reg.teardown()
    assert not worker.is_alive()
    assert outcomes(reg) == {"w": Outcome.HOOK_RAN}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU time: Linux")
def test_cpu_watch_tells_a_computing_thread_from_a_waiting_one():
    import hashlib
    import time

    from exitsafe._threads import CpuWatch

    stop = threading.Event()

    def compute():
        while not stop.is_set():
            # (one long C call, the GIL released, as the hazard has it: short calls would
            # hand the GIL back and forth, and a look could find the thread waiting for it,
            # which a 20,000-round version did once in CI on a loaded 3.15)
            hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 1_000_000)

    computing = threading.Thread(target=compute, daemon=True)
    waiting = threading.Thread(target=stop.wait, daemon=True)
    computing.start()
    waiting.start()
    try:
        watch = CpuWatch()
        assert watch.computing(computing.ident) is True  # (one look: cannot tell yet)
        assert watch.computing(waiting.ident) is True
        deadline = time.monotonic() + 5
        seen: dict[str, bool | None] = {}
        while time.monotonic() < deadline and len(seen) < 2:
            time.sleep(CpuWatch.LOOK)
            for name, thread in (("computing", computing), ("waiting", waiting)):
                if name not in seen:
                    answer = watch.computing(thread.ident)
                    if name == "waiting" and answer is True:
                        continue  # (its start, before the wait, may fall in the first look)
                    seen[name] = answer
        assert seen == {"computing": True, "waiting": False}
        assert watch.computing(12345) is None, "a thread threading does not know"
    finally:
        stop.set()
        computing.join()
        waiting.join()


@pytest.mark.parametrize(("state", "runnable"), [("R", True), ("S", False)])
@pytest.mark.parametrize(
    ("ran_share", "slices", "computes"),
    [(0.0, 0, True), (0.25, 1, True), (0.05, 30, False)],
    ids=["starved-all-look", "starved-at-end", "a-poller-in-a-wake-up"],
)
def test_cpu_watch_takes_a_thread_starved_of_a_cpu_for_computing(
    monkeypatch: pytest.MonkeyPatch, state: str, runnable: bool, ran_share: float,
    slices: int, computes: bool,
) -> None:
    """The kernel adds a thread's wait for a CPU to its statistics only once it gets one:
    a thread starved of a CPU (a hash on a loaded machine) for the whole look shows no
    change, as an asleep one does, and one starved for the look's end shows only the
    part it ran.  Its state tells them apart (a hash thread judged idle, and released
    under, twice in CI: once under a load of 6 on 2 cores, once in a nox lane); a waiting
    thread caught runnable in one of its wake-ups (a poller: 30 short slices) is not
    computing (a review: such threads read "computing" in about half the looks, and one
    at the bound would have left every handle leaked)."""
    import time

    from exitsafe import _threads

    ran = int(ran_share * _threads.CpuWatch.LOOK * 1e9)
    looks = iter([(1_000_000, 0, 7), (1_000_000 + ran, 0, 7 + slices)])
    monkeypatch.setattr(_threads, "schedstat", lambda ident: next(looks))
    monkeypatch.setattr(_threads, "state", lambda ident: state)
    watch = _threads.CpuWatch()
    assert watch.computing(1) is True  # (one look: cannot tell yet)
    time.sleep(_threads.CpuWatch.LOOK)
    assert watch.computing(1) is (runnable and computes)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task: Linux")
def test_thread_state_of_a_blocked_thread_is_asleep() -> None:
    import time

    from exitsafe import _threads

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10  # (a bound for a broken run: it blocks at once)
        while _threads.state(thread.ident) != "S" and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _threads.state(thread.ident) == "S"
        assert _threads.state(threading.get_ident()) == "R"  # (this one, reading)
        assert _threads.state(12345) is None, "a thread threading does not know"
    finally:
        stop.set()
        thread.join()

"""Threads at teardown (in process): borrows are waited for, later borrows refused or
parked, workers stopped and joined, thread-affine releases queued for their owner,
automatic borrows around native calls."""

from __future__ import annotations

import gc
import threading

import pytest

import exitsafe
from exitsafe import HandleClosedError, Outcome, Registry

LONG = 30.0


@pytest.fixture
def reg() -> Registry:
    return Registry("quiesce", ledger_limit=None, step_timeout=LONG)


def outcomes(registry: Registry) -> dict[str, str]:
    return {e.name: e.outcome for e in registry.ledger()}


def start(fn, daemon: bool = False) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=daemon)
    thread.start()
    return thread


def test_teardown_waits_for_a_borrow_in_flight_then_releases(reg):
    log: list[str] = []
    h = reg.track("session", lambda raw: log.append(f"release {raw}"), name="session")
    inside, go = threading.Event(), threading.Event()

    def native_call() -> None:
        with h.borrow() as raw:
            inside.set()
            assert go.wait(LONG)  # "running" until the teardown's hook lets it finish
            log.append(f"call on {raw} done")

    # The hook runs first (hooks go first), while the call is in flight; the
    # teardown then waits at the session's step until the borrow ends.
    reg.on_teardown(go.set, name="let the call finish")
    worker = start(native_call)
    assert inside.wait(LONG)
    reg.teardown()
    worker.join(LONG)
    assert log == ["call on session done", "release session"]
    assert outcomes(reg)["session"] == Outcome.RELEASED_AT_EXIT


def test_a_borrow_the_wait_cannot_outlast_is_leaked_with_the_reason():
    reg = Registry("quiesce-stuck", ledger_limit=None, step_timeout=0.2)
    log: list[str] = []
    parent = reg.track("env", log.append, name="env")
    h = reg.track("session", log.append, name="session", depends_on=[parent])
    inside, go = threading.Event(), threading.Event()

    def stuck_call() -> None:
        with h.borrow():
            inside.set()
            go.wait(LONG)

    worker = start(stuck_call)
    assert inside.wait(LONG)
    reg.teardown()
    go.set()
    worker.join(LONG)
    assert log == []  # nothing released under the running call
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["session"] == (
        Outcome.LEAKED_IN_USE,
        "still borrowed on another thread after 0.2 s",
    )
    assert got["env"][0] == Outcome.LEAKED_DEPENDENT


def test_a_borrow_held_by_the_teardown_thread_is_never_waited_for(reg):
    h = reg.track("session", print, name="session")
    with h.borrow():
        reg.teardown()  # e.g. from inside a native callback: must not wait for itself
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["session"] == (Outcome.LEAKED_IN_USE, "borrowed by the thread running the teardown")


def test_non_daemon_thread_borrowing_after_teardown_began_gets_an_error(reg):
    h = reg.track("session", print, name="session")
    seen: list[BaseException] = []
    go, done = threading.Event(), threading.Event()

    def late_borrow() -> None:
        go.wait(LONG)
        try:
            with h.borrow():
                seen.append(AssertionError("entered"))
        except HandleClosedError as exc:
            seen.append(exc)
        done.set()

    def hook() -> None:  # the teardown has begun: the gate is closed
        go.set()
        assert done.wait(LONG)

    reg.on_teardown(hook)
    thread = start(late_borrow)
    reg.teardown()
    thread.join(LONG)
    assert len(seen) == 1 and isinstance(seen[0], HandleClosedError)
    assert "teardown of registry 'quiesce' began" in str(seen[0])


def test_daemon_thread_borrowing_a_handle_of_a_registry_closed_mid_program_gets_an_error(reg):
    # Parking a daemon thread for a handle that already ended is for a process that is
    # ending (see test_exit_threads); a registry torn down while the program goes on
    # answers a late borrow with the error, as any use after release.
    h = reg.track("session", lambda raw: None, name="session")
    reg.teardown()
    seen: list[BaseException] = []

    def late_borrow() -> None:
        try:
            with h.borrow():
                seen.append(AssertionError("entered"))
        except HandleClosedError as exc:
            seen.append(exc)

    thread = threading.Thread(target=late_borrow, daemon=True)
    thread.start()
    thread.join(LONG)
    assert not thread.is_alive(), "the daemon thread was parked"
    assert len(seen) == 1 and isinstance(seen[0], HandleClosedError)


def test_hooks_and_the_teardown_thread_can_still_borrow(reg):
    log: list[str] = []
    h = reg.track("queue", lambda raw: log.append("released"), name="queue")

    def flush() -> None:
        with h.borrow() as raw:
            log.append(f"flushed {raw}")

    reg.on_teardown(flush, before=[h], name="flush")
    reg.teardown()
    assert log == ["flushed queue", "released"]
    assert outcomes(reg) == {"flush": Outcome.HOOK_RAN, "queue": Outcome.RELEASED_AT_EXIT}


def test_a_hook_running_on_a_step_worker_can_borrow():
    reg = Registry("quiesce-timed", ledger_limit=None, step_timeout=LONG)
    log: list[str] = []
    h = reg.track("queue", lambda raw: log.append("released"), name="queue")

    def flush() -> None:  # runs on a step worker thread (a timeout applies)
        assert threading.current_thread().name == "exitsafe-teardown-step"
        with h.borrow() as raw:
            log.append(f"flushed {raw}")

    reg.on_teardown(flush, before=[h], name="flush", timeout=LONG)
    reg.teardown()
    assert log == ["flushed queue", "released"]


def test_worker_is_stopped_and_joined_before_what_it_uses_is_released(reg):
    log: list[str] = []
    h = reg.track("session", lambda raw: log.append("released"), name="session")
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with h.borrow():
                stop.wait(0.001)
        log.append("worker ended")

    thread = start(loop, daemon=True)
    reg.worker(thread, stop=stop, uses=[h])
    reg.teardown()
    assert log == ["worker ended", "released"]
    assert outcomes(reg) == {
        f"worker {thread.name}": Outcome.HOOK_RAN,
        "session": Outcome.RELEASED_AT_EXIT,
    }


def test_worker_stop_may_be_a_callable(reg):
    h = reg.track("session", print, name="session")
    stop = threading.Event()
    thread = start(lambda: stop.wait(LONG), daemon=True)
    calls: list[str] = []
    reg.worker(thread, stop=lambda: (calls.append("stop"), stop.set()), uses=[h], name="w")
    reg.teardown()
    assert calls == ["stop"] and not thread.is_alive()
    assert outcomes(reg)["w"] == Outcome.HOOK_RAN


def test_worker_arguments_are_checked(reg):
    with pytest.raises(TypeError, match=r"thread must be a threading\.Thread"):
        reg.worker("thread", stop=threading.Event())
    with pytest.raises(TypeError, match=r"stop must be a threading\.Event or a callable"):
        reg.worker(threading.Thread(target=print), stop=5)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        reg.worker(threading.Thread(target=print), stop=threading.Event(), timeout=-1)
    with pytest.raises(TypeError, match=r"^uses must contain exitsafe Handles"):
        reg.worker(threading.Thread(target=print), stop=threading.Event(), uses=["session"])


class QtLikeThread:
    """A thread with Qt's QThread interface: wait(ms) -> bool, isRunning(), quit()."""

    def __init__(self, body) -> None:
        self.quitting = threading.Event()
        self.waited = threading.Event()
        self.waited_ms: list[int] = []
        self._thread = threading.Thread(target=body, args=(self.quitting,), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def quit(self) -> None:
        self.quitting.set()

    def isRunning(self) -> bool:
        return self._thread.is_alive()

    def wait(self, ms: int) -> bool:
        self.waited_ms.append(ms)
        self.waited.set()
        self._thread.join(ms / 1000)
        return not self._thread.is_alive()

    def objectName(self) -> str:
        return "render"


def test_a_worker_may_be_a_qthread_like_object(reg):
    log: list[str] = []
    h = reg.track("gl", lambda raw: log.append("released"), name="gl")

    def body(quitting: threading.Event) -> None:
        quitting.wait(LONG)
        thread.waited.wait(LONG)  # (runs until waited for: the wait is observed)
        log.append("thread ended")

    thread = QtLikeThread(body)
    thread.start()
    reg.worker(thread, stop=thread.quit, uses=[h], timeout=LONG)
    reg.teardown()
    assert log == ["thread ended", "released"]
    assert thread.waited_ms == [int(LONG * 1000)]
    assert outcomes(reg) == {"worker render": Outcome.HOOK_RAN, "gl": Outcome.RELEASED_AT_EXIT}


def test_a_qthread_like_worker_that_does_not_end_leaves_its_handles_leaked(reg):
    h = reg.track("gl", print, name="gl")
    never = threading.Event()
    thread = QtLikeThread(lambda quitting: never.wait(LONG))
    thread.start()
    reg.worker(thread, stop=thread.quit, uses=[h], timeout=0.05, name="render")
    reg.teardown()
    never.set()
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["render"][0] == Outcome.HOOK_TIMEOUT
    assert "worker 'render' still running 0.05 s after it was asked to stop" in got["render"][1]
    assert got["gl"][0] == Outcome.LEAKED_DEPENDENT


def test_a_process_like_worker_is_joined(reg):
    class ProcessLike:  # multiprocessing.Process's interface: join(timeout), is_alive()
        name = "exporter"

        def __init__(self) -> None:
            self.joined: list[float] = []
            self.alive = True

        def join(self, timeout: float) -> None:
            self.joined.append(timeout)
            self.alive = False

        def is_alive(self) -> bool:
            return self.alive

    worker = ProcessLike()
    reg.worker(worker, stop=lambda: None, timeout=2.0)
    reg.teardown()
    assert worker.joined == [2.0]
    assert outcomes(reg) == {"worker exporter": Outcome.HOOK_RAN}


def test_wake_runs_once_after_the_stop_request_and_before_the_join(reg):
    log: list[str] = []
    h = reg.track("socket", lambda raw: log.append("released"), name="socket")
    woken = threading.Event()

    def blocked_in_a_call() -> None:  # a call only the wake action ends
        woken.wait(LONG)
        log.append("call returned")

    thread = start(blocked_in_a_call, daemon=True)
    stop = threading.Event()
    reg.worker(thread, stop=lambda: (log.append("stop"), stop.set()),
               wake=lambda: (log.append("wake"), woken.set()), uses=[h])
    reg.teardown()
    assert log == ["stop", "wake", "call returned", "released"]


def test_wake_alone_is_enough_and_its_failure_is_recorded(reg):
    h = reg.track("socket", print, name="socket")
    done = threading.Event()
    thread = start(lambda: done.wait(LONG), daemon=True)
    reg.worker(thread, wake=lambda: (done.set(), 1 / 0), uses=[h], name="w")
    reg.teardown()
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["w"][0] == Outcome.HOOK_FAILED and "ZeroDivisionError" in got["w"][1]


def test_worker_kinds_and_actions_are_checked(reg):
    with pytest.raises(TypeError, match=r"or wait\(ms\) and isRunning\(\) \(a QThread\); got str"):
        reg.worker("thread", stop=threading.Event())
    with pytest.raises(TypeError, match=r"needs stop= \(an Event or a callable\) or wake="):
        reg.worker(threading.Thread(target=print))
    with pytest.raises(TypeError, match="wake must be a callable, got int"):
        reg.worker(threading.Thread(target=print), wake=5)


def test_a_wrapper_given_where_the_core_takes_handles_is_refused_with_a_hint(reg):
    # The core's track, on_teardown and worker take handles; the error says to pass the
    # wrapper's .handle (the adapters' depends_on take wrappers themselves).
    class Session(exitsafe.NativeObject, release=print):
        pass

    wrapper = Session(raw="session", registry=reg)
    hint = "got Session; pass its .handle$"
    with pytest.raises(TypeError, match="^depends_on must contain exitsafe Handles.*" + hint):
        reg.track("buffer", print, depends_on=[wrapper])
    with pytest.raises(TypeError, match="^before must contain exitsafe Handles.*" + hint):
        reg.on_teardown(print, before=[wrapper])
    with pytest.raises(TypeError, match="^uses must contain exitsafe Handles.*" + hint):
        reg.worker(threading.Thread(target=print), stop=threading.Event(), uses=[wrapper])
    assert reg.track("buffer", print, depends_on=[wrapper.handle]).depends_on == (wrapper.handle,)


def test_early_hooks_run_once_before_the_teardown(reg):
    log: list[str] = []
    h = reg.track("server", lambda raw: log.append("released"), name="server")
    reg.on_early_exit(lambda: log.append("early 1"), name="first")
    reg.on_early_exit(lambda: log.append("early 2"), name="second")
    cancelled = reg.on_early_exit(lambda: log.append("cancelled"), name="cancelled")
    cancelled.release()
    reg.teardown()
    reg.teardown()
    assert log == ["early 2", "early 1", "released"]  # newest first, once
    assert outcomes(reg) == {
        "cancelled": Outcome.HOOK_CANCELLED,
        "second": Outcome.HOOK_RAN,
        "first": Outcome.HOOK_RAN,
        "server": Outcome.RELEASED_AT_EXIT,
    }
    assert h.state == "released"


def test_early_hook_failure_is_recorded_and_the_teardown_goes_on(reg):
    reg.on_early_exit(lambda: 1 / 0, name="broken")
    h = reg.track("x", print, name="x")
    reg.teardown()
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["broken"][0] == Outcome.HOOK_FAILED and "ZeroDivisionError" in got["broken"][1]
    assert h.state == "released"


# ---------------------------------------------------------------------- thread affinity


def test_affine_release_due_on_another_thread_runs_on_the_owner(reg):
    where: list[str] = []
    h = reg.track(
        "texture", lambda raw: where.append(threading.current_thread().name),
        name="texture", affinity="creator",
    )
    box = [h]
    del h
    start(box.clear).join(LONG)  # the last reference goes on another thread
    gc.collect()
    assert where == []  # queued for the owner
    exitsafe.lowlevel.run_pending()
    assert where == [threading.current_thread().name]
    assert outcomes(reg) == {"texture": Outcome.RELEASED}


def test_affine_release_runs_at_the_owners_next_exitsafe_call(reg):
    where: list[str] = []
    h = reg.track("t", lambda raw: where.append("released"), name="t", affinity="creator")
    start(h.release).join(LONG)
    assert where == []
    reg.track("other", print).release()  # any exitsafe call of the owner runs it
    assert where == ["released"]


@pytest.mark.parametrize("step_timeout", [None, LONG], ids=["common-step", "timed-step"])
def test_teardown_leaks_affine_handles_of_a_live_owner_and_runs_those_of_a_gone_one(
    step_timeout,
):
    # Without a step timeout the teardown takes its common step (in C with the compiled
    # core): it must leave an affine handle to the general step too (a review finding).
    reg = Registry("quiesce-affinity", ledger_limit=None, step_timeout=step_timeout)
    log: list[str] = []
    owner_ready, finish = threading.Event(), threading.Event()
    made: dict[str, exitsafe.Handle] = {}

    def live_owner() -> None:
        made["alive"] = reg.track("a", log.append, name="alive", affinity="creator")
        owner_ready.set()
        finish.wait(LONG)

    def gone_owner() -> None:
        made["gone"] = reg.track("g", log.append, name="gone", affinity="creator")

    start(gone_owner).join(LONG)
    owner = start(live_owner)
    assert owner_ready.wait(LONG)
    reg.teardown()
    finish.set()
    owner.join(LONG)
    assert log == ["g"]
    got = {e.name: (e.outcome, e.detail) for e in reg.ledger()}
    assert got["gone"] == (Outcome.RELEASED_AT_EXIT, None)
    assert got["alive"][0] == Outcome.LEAKED_AFFINITY
    assert "still running" in got["alive"][1]


def test_affinity_argument_is_checked(reg):
    with pytest.raises(ValueError, match="affinity must be"):
        reg.track("x", print, affinity="gpu")
    with pytest.raises(TypeError, match="affinity must be"):
        reg.track("x", print, affinity=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- automatic borrow


def test_call_borrows_handle_arguments_for_the_call(reg):
    from exitsafe import ctypes as es_ctypes

    h = reg.track("dev", print, name="dev")
    seen: list[object] = []

    def native(dev: object, n: int) -> int:
        seen.append((dev, n, h.borrowed))
        return n * 2

    assert es_ctypes.call(native, h, 21) == 42
    assert seen == [("dev", 21, True)] and not h.borrowed
    lib = es_ctypes.borrowing(type("Lib", (), {"run": staticmethod(native), "K": 3})())
    assert lib.run(h, 1) == 2 and lib.K == 3
    h.release()
    with pytest.raises(HandleClosedError):
        es_ctypes.call(native, h, 1)
    assert len(seen) == 2


def test_borrows_racing_the_teardown_from_many_threads():
    # Eight non-daemon threads borrow in a loop while the teardown runs: the native
    # release never runs while any borrow is in flight, and every thread ends with
    # HandleClosedError once the gate closed (non-daemon threads are not parked).
    reg = Registry("quiesce-race", ledger_limit=None, step_timeout=LONG)
    inside = [0]
    overlaps: list[int] = []
    lock = threading.Lock()

    def release(raw: object) -> None:
        with lock:
            overlaps.append(inside[0])

    h = reg.track("shared", release, name="shared")
    started = threading.Barrier(9)
    ended: list[str] = []

    def borrower() -> None:
        started.wait()
        try:
            while True:
                with h.borrow():
                    with lock:
                        inside[0] += 1
                    with lock:
                        inside[0] -= 1
        except HandleClosedError:
            ended.append("closed")

    threads = [start(borrower) for _ in range(8)]
    started.wait()
    reg.teardown()
    for thread in threads:
        thread.join(LONG)
    assert overlaps == [0], "released once, with no borrow in flight"
    assert ended == ["closed"] * 8
    assert outcomes(reg) == {"shared": Outcome.RELEASED_AT_EXIT}

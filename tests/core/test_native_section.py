"""``exitsafe.native(name)``: a gate with no object around calls into a stateless native
library; the exit teardown waits for sections in flight and parks later entries."""

from __future__ import annotations

import threading
import time

import pytest

import exitsafe
from exitsafe import HandleClosedError, Registry

from ..support import assert_clean, run_program

LONG = 30.0


def test_a_section_is_one_gate_per_name_and_registry_recorded_at_teardown():
    reg = Registry("sections", ledger_limit=None)
    with exitsafe.native("cv2", registry=reg):
        with exitsafe.native("cv2", registry=reg):  # sections nest
            pass
    with exitsafe.native("codec", registry=reg) as inside:
        assert inside is None
    reg.teardown()
    got = {e.name: (e.kind, e.outcome) for e in reg.ledger()}
    assert got == {
        "native sections": ("hook", "hook_ran"),  # (the wait for sections in flight)
        "native cv2": ("native section", "released_at_exit"),
        "native codec": ("native section", "released_at_exit"),
    }
    with pytest.raises(HandleClosedError):
        with exitsafe.native("cv2", registry=reg):
            pass


def test_the_teardown_waits_for_a_section_in_flight():
    reg = Registry("sections-wait", ledger_limit=None, step_timeout=LONG)
    log: list[str] = []
    inside, go = threading.Event(), threading.Event()

    def native_work() -> None:
        with exitsafe.native("cv2", registry=reg):
            inside.set()
            go.wait(LONG)
            log.append("section ended")

    def let_it_finish() -> None:  # once the teardown began (its gates closed)
        while not reg.tearing_down:
            time.sleep(0.001)
        go.set()

    thread = threading.Thread(target=native_work)
    thread.start()
    assert inside.wait(LONG)
    threading.Thread(target=let_it_finish).start()
    reg.teardown()
    log.append("teardown done")
    thread.join(LONG)
    assert log == ["section ended", "teardown done"]
    assert {e.name: e.outcome for e in reg.ledger()}["native sections"] == "hook_ran"


def test_an_explicit_teardown_that_found_a_section_in_flight_leaks_only_its_own():
    stuck = Registry("sections-stuck", ledger_limit=None, step_timeout=0.2)
    h = stuck.track("ctx", print, name="ctx")
    inside, go = threading.Event(), threading.Event()

    def native_work() -> None:
        with exitsafe.native("cv2", registry=stuck):
            inside.set()
            go.wait(LONG)

    thread = threading.Thread(target=native_work)
    thread.start()
    assert inside.wait(LONG)
    stuck.teardown()
    go.set()
    thread.join(LONG)
    assert h.state == "leaked"
    assert {e.name: e.outcome for e in stuck.ledger()}["ctx"] == "leaked_in_use"
    later = Registry("sections-later", ledger_limit=None)
    assert later.track("x", print).release() is None
    y = later.track("y", print, name="y")
    later.teardown()  # the program goes on: a later teardown releases
    assert y.state == "released"
    assert {e.name: e.outcome for e in later.ledger()}["y"] == "released_at_exit"


def test_threads_racing_to_make_the_same_gate_share_one():
    reg = Registry("sections-race", ledger_limit=None)
    barrier = threading.Barrier(8)

    def enter() -> None:
        barrier.wait()
        with exitsafe.native("lib", registry=reg):
            pass

    threads = [threading.Thread(target=enter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)
    reg.teardown()
    entries = [e for e in reg.ledger() if e.name == "native lib"]
    assert sorted(e.outcome for e in entries)[-1] == "released_at_exit"
    assert sum(e.outcome == "released_at_exit" for e in entries) == 1


@pytest.mark.parametrize("bad", [None, "", 5, b"cv2"])
def test_a_name_is_required(bad):
    with pytest.raises(TypeError, match="native\\(\\) needs a library name"):
        exitsafe.native(bad)  # type: ignore[arg-type]


DAEMON_IN_LIBRARY = """
    import ctypes
    _libc = ctypes.CDLL(None)
    _libc.usleep.argtypes = (ctypes.c_uint,)
    inside = [0]

    def library_call():  # a stateless native function (no object to borrow)
        inside[0] += 1
        _libc.usleep(2000)
        inside[0] -= 1

    def finalize_library(raw):  # what must never run under a thread inside the library
        record(f"library finalized with {inside[0]} thread(s) inside it")

    context = exitsafe.track("lib", finalize_library, kind="library", name="lib context")
    running = threading.Event()

    def loop():
        while True:
            with exitsafe.native("lib"):
                library_call()
            running.set()

    threading.Thread(target=loop, daemon=True).start()
    running.wait()
"""


def test_at_exit_a_daemon_thread_is_parked_outside_the_library(tmp_path):
    run = run_program(DAEMON_IN_LIBRARY, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["library finalized with 0 thread(s) inside it"]
    outcomes = run.outcomes()
    assert outcomes["native sections"] == "hook_ran"
    assert outcomes["native lib"] == "released_at_exit"
    assert outcomes["lib context"] == "released_at_exit"


def test_a_section_still_in_flight_after_the_bound_leaves_everything_leaked(tmp_path):
    stuck = DAEMON_IN_LIBRARY.replace(
        "_libc.usleep(2000)", "_libc.usleep(2000 if first else 10**8)"
    )
    stuck = stuck.replace("def library_call():", "first = True\n\n    def library_call():")
    stuck = stuck.replace("running.set()", "running.set()\n            globals()['first'] = False")
    run = run_program(stuck, tmp_path, ledger=True, env={"EXITSAFE_STEP_TIMEOUT": "0.3"})
    assert run.returncode == 0, run.describe()
    assert run.order == [], "nothing released under the thread"
    ledger = {e["name"]: e for e in run.ledger()["registries"][0]["entries"]}
    assert ledger["native sections"]["outcome"] in ("hook_failed", "hook_timeout")
    assert "still inside native section(s) native lib after 0.24 s" in ledger[
        "native sections"
    ]["detail"]
    assert ledger["lib context"]["outcome"] == "leaked_in_use"

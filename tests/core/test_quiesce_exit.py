"""``exitsafe.quiesce()``: at a real interpreter exit, the threads left are parked at
their next safe point before anything is released.  Each program runs in a fresh
interpreter with a hard timeout (a thread waited for too long is a hang, not a slow
test)."""

from __future__ import annotations

import os
import sys
import textwrap
import threading

import pytest

import exitsafe

from ..support import assert_clean, run_program

#: A "native call" of the program's own: a C function that releases the GIL.
NATIVE_SLEEP = """
    import ctypes, time
    _libc = ctypes.CDLL(None)
    _libc.usleep.argtypes = (ctypes.c_uint,)

    def native_call(ms):
        _libc.usleep(ms * 1000)
"""

#: A third-party package (found under a ``site-packages`` directory) that takes its own
#: lock around its native calls and takes it again in its own exit handler: a thread
#: stopped inside it for good would hang the exit (h5py's ``phil``, for one).
FAKELIB = '''
import atexit, ctypes, threading

_libc = ctypes.CDLL(None)
_libc.usleep.argtypes = (ctypes.c_uint,)
_lock = threading.Lock()
inside = threading.Event()


def locked_call(ms, then=None):
    with _lock:
        inside.set()
        _libc.usleep(ms * 1000)
        _step()
        _libc.usleep(ms * 1000)
        if then is not None:
            then()


def _step():
    return len([1, 2, 3])


def forever():  # (not under the lock: the exit handler must not wait for it)
    inside.set()
    while True:
        _libc.usleep(1000)


def _fails():
    raise KeyError("expected")


def busy_with_errors(n):  # calls that end by exceptions, inside the library
    for _ in range(n):
        try:
            _fails()
        except KeyError:
            pass
        _libc.usleep(100)


@atexit.register
def _close():
    with _lock:
        print("fakelib closed", flush=True)
'''


def trace_fields(stderr: str, event: str) -> dict[str, str]:
    from exitsafe._ledger import parse_trace_line

    for line in stderr.splitlines():
        parsed = parse_trace_line(line)
        if parsed is not None and parsed[0] == event:
            return parsed[1]
    raise AssertionError(f"no {event!r} trace line in\n{stderr}")


def fake_site_packages(tmp_path) -> dict[str, str]:
    package = tmp_path / "site-packages" / "fakelib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKELIB)
    path = [str(tmp_path / "site-packages"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


DAEMON_USER = """
    inside = [0]  # how many threads are inside the C function (no call marks it)

    def release(raw):
        record(f"released with {inside[0]} thread(s) inside the native call")

    session = exitsafe.track("session", release, name="session")
    running = threading.Event()

    def use_forever():
        while True:
            record("call")
            inside[0] += 1
            _libc.usleep(2000)
            inside[0] -= 1
            running.set()

    threading.Thread(target=use_forever, daemon=True, name="user").start()
    running.wait()
    QUIESCE
"""


def test_a_daemon_thread_is_parked_outside_its_native_calls_before_the_release(tmp_path):
    body = NATIVE_SLEEP + DAEMON_USER.replace("QUIESCE", "exitsafe.quiesce()")
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    assert_clean(run)
    assert run.order[-1] == "released with 0 thread(s) inside the native call"
    assert run.outcomes() == {"session": "released_at_exit"}
    assert trace_fields(run.stderr, "quiesce")["parked"] == "1"


RELEASE_THAT_WAITS = """
    used = threading.Event()
    releasing = []

    def release(raw):  # gives the GIL away: a thread still running uses the session
        record("released")
        releasing.append(True)
        used.wait(WAIT)
        record("after release")

    session = exitsafe.track("session", release, name="session")
    running = threading.Event()

    def use_forever():
        while True:
            native_call(1)
            if releasing and not used.is_set():  # (once: the release may take longer
                record("used after release")  # than a native call to go on, under load)
                used.set()
                return  # (once is enough to show it)
            running.set()

    threading.Thread(target=use_forever, daemon=True).start()
    running.wait()
"""


def test_without_quiesce_the_thread_uses_the_session_while_it_is_released(tmp_path):
    body = NATIVE_SLEEP + RELEASE_THAT_WAITS.replace("WAIT", "30")
    run = run_program(body, tmp_path)
    released = run.order.index("released")
    assert run.order[released:] == ["released", "used after release", "after release"]


def test_with_quiesce_the_thread_never_runs_again_once_the_release_began(tmp_path):
    body = NATIVE_SLEEP + RELEASE_THAT_WAITS.replace("WAIT", "0.5") + "    exitsafe.quiesce()\n"
    run = run_program(body, tmp_path)
    assert_clean(run)
    released = run.order.index("released")
    assert run.order[released:] == ["released", "after release"]


def test_a_thread_is_never_parked_inside_a_library(tmp_path):
    # The thread spends its time inside fakelib's lock; parked there, fakelib's exit
    # handler would wait for the lock for ever.  It parks between two calls instead.
    body = """
    import fakelib

    def loop():
        while True:
            fakelib.locked_call(1)
            record("between")

    threading.Thread(target=loop, daemon=True).start()
    fakelib.inside.wait()
    exitsafe.quiesce()
    """
    run = run_program(body, tmp_path, env=fake_site_packages(tmp_path), timeout=30)
    assert_clean(run)
    assert "fakelib closed" in run.stdout


def test_a_thread_called_back_from_a_library_is_not_parked_in_the_callback(tmp_path):
    # The program's own callback runs inside fakelib's lock: the stack holds a library
    # frame, so the thread does not park there either.
    body = """
    import fakelib

    def loop():
        while True:
            fakelib.locked_call(1, then=lambda: record("callback"))

    threading.Thread(target=loop, daemon=True).start()
    fakelib.inside.wait()
    exitsafe.quiesce()
    """
    run = run_program(body, tmp_path, env=fake_site_packages(tmp_path), timeout=30)
    assert_clean(run)
    assert "fakelib closed" in run.stdout


def test_idle_threads_are_not_waited_for(tmp_path):
    # Blocked in queue.get(), Event.wait() and time.sleep(): harmless, and the exit does
    # not wait for them (a bound of 60 s would outlast the run's 30 s).
    body = """
    import queue, time
    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    q = queue.Queue()
    ev = threading.Event()
    threading.Thread(target=q.get, daemon=True).start()
    threading.Thread(target=ev.wait, daemon=True).start()

    def sleeper():
        time.sleep(1000)

    threading.Thread(target=sleeper, daemon=True).start()
    time.sleep(0.2)
    exitsafe.quiesce(timeout=60)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    assert_clean(run)
    assert run.outcomes() == {"session": "released_at_exit"}
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["threads"], fields["running"]) == ("3", "0")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU time: Linux")
def test_a_thread_computing_in_the_standard_library_is_not_taken_for_idle(tmp_path):
    # Inside a long hash (C code of the standard library, the GIL released), the thread's
    # stack looks like a wait.  Its next step reads what the release changes through no
    # call (a subscript), where it cannot park: the exit must wait until it has parked
    # (at its next call), not release under it.  Without the CPU-time check the release
    # ran first and the thread stepped on it: "used after release: 1", 3 runs of 3.
    body = """
    import hashlib, time
    state = {"open": True}
    seen = bytearray(1)

    def release(raw):
        state["open"] = False
        record("released")
        time.sleep(0.6)  # (a thread released under would step on it meanwhile)
        record(f"used after release: {seen[0]}")

    session = exitsafe.track("session", release, name="session")
    started = threading.Event()

    def hash_forever():
        while True:
            started.set()
            digest = hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 1_000_000)  # ~0.2 s
            seen[0] |= not state["open"]  # (no call: no place to park)

    threading.Thread(target=hash_forever, daemon=True, name="hasher").start()
    started.wait(30)
    time.sleep(0.05)  # (inside the hash)
    exitsafe.quiesce(timeout=10)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=60)
    assert_clean(run)
    assert run.order == ["released", "used after release: 0"], run.describe()
    assert run.outcomes() == {"session": "released_at_exit"}
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["threads"], fields["parked"], fields["running"]) == ("1", "1", "0")


@pytest.mark.parametrize("bound", [0.01, 0.015, 2.0])
def test_a_waiting_thread_is_idle_whatever_the_bound(tmp_path, bound):
    # The CPU-time look takes 20 ms: with a shorter bound, the last look decides on what
    # it has (before: a thread blocked in queue.get() was never idle in time, and every
    # handle was leaked).
    _assert_released_with_the_thread_quiesced(tmp_path, f"""
    import queue
    jobs = queue.Queue()
    thread = threading.Thread(target=lambda: jobs.get(), daemon=True)
    thread.start()
    while sys._current_frames()[thread.ident].f_code.co_name != "wait":
        time.sleep(0.001)
    exitsafe.quiesce(thread, timeout={bound})
    """)


def test_an_event_loop_polling_every_half_millisecond_is_idle(tmp_path):
    # Its stack is in the standard library (selectors), and it is runnable only for its
    # wake-ups: a wait, not a computation.
    _assert_released_with_the_thread_quiesced(tmp_path, """
    import asyncio

    async def poll():
        while True:
            await asyncio.sleep(0.0005)

    thread = threading.Thread(target=lambda: asyncio.run(poll()), daemon=True)
    thread.start()
    time.sleep(0.2)
    exitsafe.quiesce(thread, timeout=2.0)
    """)


def _assert_released_with_the_thread_quiesced(tmp_path, thread_code):
    """``thread_code`` starts a thread and quiesces it: the session it does not use is
    released at exit (the thread was found idle, not still running)."""
    body = """
    import time
    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    """ + thread_code
    run = run_program(body, tmp_path, ledger=True, timeout=30)
    assert_clean(run)
    assert run.outcomes() == {"session": "released_at_exit"}, run.describe()


def test_a_thread_still_inside_a_library_leaves_every_handle_leaked_in_use(tmp_path):
    body = """
    import fakelib
    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    exitsafe.on_teardown(lambda: record("hook"), name="hook")
    threading.Thread(target=fakelib.forever, daemon=True, name="stuck").start()
    fakelib.inside.wait()
    exitsafe.quiesce(timeout=0.3)
    """
    env = {**fake_site_packages(tmp_path), "EXITSAFE_TRACE": "1"}
    run = run_program(body, tmp_path, ledger=True, env=env, timeout=30)
    assert run.order == ["hook"], "the hooks run; nothing is released"
    ledger = {e["name"]: e for e in run.ledger()["registries"][0]["entries"]}
    assert ledger["session"]["outcome"] == "leaked_in_use"
    assert "still running after quiescing the threads: stuck at forever" in ledger["session"][
        "detail"
    ]
    assert ledger["hook"]["outcome"] == "hook_ran"
    assert trace_fields(run.stderr, "quiesce")["running"] == "1"
    assert "1 thread(s) still running at exit" in run.stderr


def test_an_adopted_object_is_not_neutralized_while_a_thread_is_still_running(tmp_path):
    # A thread the quiescing could not park may use anything: the adopted object is
    # leaked as it is, its attribute not set to None under that thread.
    body = """
    import fakelib

    class Session:
        @property
        def handle(self):
            return "native"

        @handle.setter
        def handle(self, value):
            record(f"handle set to {value}")

    session = Session()
    exitsafe.adopt(session, close=None, neutralize="handle", name="session")
    threading.Thread(target=fakelib.forever, daemon=True, name="stuck").start()
    fakelib.inside.wait()
    exitsafe.quiesce(timeout=0.3)
    """
    run = run_program(body, tmp_path, ledger=True, env=fake_site_packages(tmp_path), timeout=30)
    assert run.outcomes()["session"] == "leaked_in_use"
    assert run.order == []


def test_only_the_threads_named_are_quiesced(tmp_path):
    body = """
    import time

    def loop(tag):
        while True:
            record(tag)
            native_call(1)

    first = threading.Thread(target=loop, args=("first",), daemon=True)
    second = threading.Thread(target=loop, args=("second",), daemon=True)
    first.start(); second.start()
    time.sleep(0.05)
    exitsafe.quiesce(first)
    exitsafe.quiesce(second.ident)  # calls add up
    """
    run = run_program(NATIVE_SLEEP + body, tmp_path, env={"EXITSAFE_TRACE": "1"})
    assert_clean(run)
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["threads"], fields["parked"], fields["running"]) == ("2", "2", "0")


def test_a_thread_not_named_is_not_quiesced(tmp_path):
    body = """
    import time
    session = exitsafe.track("session", lambda raw: record("released"), name="session")

    def loop(tag):
        while True:
            native_call(1)

    first = threading.Thread(target=loop, args=("first",), daemon=True)
    second = threading.Thread(target=loop, args=("second",), daemon=True)
    first.start(); second.start()
    time.sleep(0.05)
    exitsafe.quiesce(first)
    """
    run = run_program(NATIVE_SLEEP + body, tmp_path, env={"EXITSAFE_TRACE": "1"})
    assert_clean(run)
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["threads"], fields["parked"]) == ("1", "1")


def test_a_parked_threads_borrow_ends_as_it_parks(tmp_path):
    # Parked inside `with session.borrow():` between two native calls: the borrow ends
    # (the thread never resumes), so the teardown releases instead of waiting.
    body = """
    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    running = threading.Event()

    def use_forever():
        with session.borrow():
            while True:
                native_call(1)
                running.set()

    threading.Thread(target=use_forever, daemon=True).start()
    running.wait()
    exitsafe.quiesce(timeout=30)
    """
    run = run_program(NATIVE_SLEEP + body, tmp_path, ledger=True, timeout=20)
    assert_clean(run)
    assert run.order == ["released"]
    assert run.outcomes() == {"session": "released_at_exit"}


def test_non_daemon_threads_are_joined_first_and_quiesce_waits_for_nothing(tmp_path):
    body = """
    import time
    def short():
        time.sleep(0.05)
        record("joined")
    threading.Thread(target=short).start()
    s = exitsafe.track("s", lambda raw: record("released"))
    exitsafe.quiesce()
    """
    run = run_program(body, tmp_path, env={"EXITSAFE_TRACE": "1"})
    assert_clean(run)
    assert run.order == ["joined", "released"]
    with pytest.raises(AssertionError, match="no 'quiesce' trace line"):
        trace_fields(run.stderr, "quiesce")  # (no thread was left to quiesce)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_quiesces_its_own_threads_only(tmp_path):
    body = NATIVE_SLEEP + """
    def loop():
        while True:
            native_call(1)

    threading.Thread(target=loop, daemon=True).start()
    exitsafe.quiesce(timeout=30)
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # (fork with threads: on purpose)
    pid = os.fork()
    if pid == 0:
        record("child")
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    record(f"child exited {os.waitstatus_to_exitcode(status)}")
    """
    run = run_program(body, tmp_path, timeout=20)
    assert_clean(run)
    assert run.order == ["child", "child exited 0"]


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (("thread",), {}, TypeError, "quiesce() takes threading.Thread objects"),
        ((threading.Thread(target=print),), {}, TypeError, "(not started)"),
        ((True,), {}, TypeError, "got bool"),
        ((), {"timeout": "5"}, TypeError, "timeout must be a number of seconds, got str"),
        ((), {"timeout": True}, TypeError, "timeout must be a number of seconds, got bool"),
        ((), {"timeout": 0}, ValueError, "positive, finite"),
        ((), {"timeout": -1.0}, ValueError, "positive, finite"),
        ((), {"timeout": float("inf")}, ValueError, "positive, finite"),
        ((), {"timeout": float("nan")}, ValueError, "positive, finite"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_installed(args, kwargs, error, message):
    from exitsafe import _quiesce

    with pytest.raises(error) as info:
        exitsafe.quiesce(*args, **kwargs)
    assert message in str(info.value)
    assert not _quiesce.requested()


def test_the_lab_s_scenario_programs_are_program_code_wherever_exitsafe_is(monkeypatch):
    """``exitsafe demo``'s programs (``exitsafe/lab/scenarios/``) are programs: a thread
    running their code parks there, as in any program, although the files are inside
    exitsafe (never a place to park otherwise) and, once installed, inside site-packages."""
    from exitsafe import _stacks

    here = os.path.dirname(os.path.abspath(_stacks.__file__))
    scenario = os.path.join(here, "lab", "scenarios", "s12_protected.py")
    assert _stacks.kind_of_file(scenario) == _stacks.OWN
    assert _stacks.kind_of_file(os.path.join(here, "lab", "runner.py")) == _stacks.STDLIB
    assert _stacks.kind_of_file(os.path.join(here, "_registry.py")) == _stacks.STDLIB
    installed = "/venv/lib/python3.12/site-packages/exitsafe/"
    monkeypatch.setattr(_stacks, "_paths", [((), installed)])
    assert _stacks.kind_of_file(installed + "lab/scenarios/s12_protected.py") == _stacks.OWN
    assert _stacks.kind_of_file(installed + "lab/runner.py") == _stacks.PACKAGE
    assert _stacks.kind_of_file(installed + "_registry.py") == _stacks.PACKAGE


def test_exitsafe_quiesce_variable_quiesces_with_no_line_of_code(tmp_path):
    body = NATIVE_SLEEP + DAEMON_USER.replace("QUIESCE", "")
    env = {"EXITSAFE_QUIESCE": "1", "EXITSAFE_TRACE": "1"}
    run = run_program(body, tmp_path, ledger=True, env=env)
    assert_clean(run)
    assert run.order[-1] == "released with 0 thread(s) inside the native call"
    assert trace_fields(run.stderr, "quiesce")["parked"] == "1"


@pytest.mark.parametrize("value", ["maybe", "-1", "inf"])
def test_a_bad_exitsafe_quiesce_value_is_reported_and_ignored(tmp_path, value):
    body = "print(exitsafe._quiesce.requested())\n"
    run = run_program(body, tmp_path, env={"EXITSAFE_QUIESCE": value})
    assert_clean(run)
    assert run.stdout == "False\n"
    assert f"EXITSAFE_QUIESCE={value!r} is not valid" in run.stderr


def test_under_exitsafe_run_a_program_that_never_imports_exitsafe_is_quiesced(tmp_path):
    from exitsafe.testing import run

    program = """
import atexit, ctypes, threading
_libc = ctypes.CDLL(None)
_libc.usleep.argtypes = (ctypes.c_uint,)
inside = [0]

@atexit.register
def library_exit():  # a library's own exit cleanup, under a thread still inside it
    print(f"library exit with {inside[0]} thread(s) inside", flush=True)

running = threading.Event()

def loop():
    while True:
        inside[0] += 1
        _libc.usleep(2000)
        inside[0] -= 1
        running.set()

threading.Thread(target=loop, daemon=True).start()
running.wait()
"""
    result = run(program, env={"EXITSAFE_QUIESCE": "1"}, cwd=tmp_path, timeout=60)
    assert result.clean, result.report()
    assert "library exit with 0 thread(s) inside" in result.stdout


def test_a_thread_never_parks_inside_a_finalizer():
    # A __del__ may run inside a garbage collection (allocation-triggered, on any
    # thread): parked there for good, that collection would never end.
    import sys as _sys

    from exitsafe import _quiesce

    def plain():
        return _quiesce._own_stack(_sys._getframe())

    class Finalized:
        def __del__(self):
            seen.append(_quiesce._own_stack(_sys._getframe()))

    seen: list[bool] = []

    def in_a_thread():  # (a thread's stack: only its starter's frames below ours)
        seen.append(plain())
        Finalized()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [True, False]


def test_a_thread_in_a_ctypes_call_is_not_taken_for_idle(tmp_path):
    # ctypes' foreign functions raise no profile event: a loop of them never parks, and
    # a thread inside one is inside a native library (not idle in the standard library):
    # nothing is released under it.
    body = NATIVE_SLEEP + """
    session = exitsafe.track("session", lambda raw: record("released"), name="session")

    def foreign_only():
        while True:
            _libc.usleep(1000)

    threading.Thread(target=foreign_only, daemon=True, name="foreign").start()
    time.sleep(0.05)
    exitsafe.quiesce(timeout=0.3)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    assert run.returncode == 0, run.describe()
    assert run.order == [], "released under a thread inside a native call"
    assert run.outcomes() == {"session": "leaked_in_use"}
    assert trace_fields(run.stderr, "quiesce")["running"] == "1"


def test_a_thread_whose_calls_end_by_exceptions_parks_quietly(tmp_path):
    # A "return" by an exception gives the profile function no value (NULL): on CPython
    # 3.9-3.11 the C-level profile function must not try to make an object of it (ctypes
    # printed a ValueError per event, and the thread died of a SystemError).
    body = """
    import fakelib
    running = threading.Event()

    def loop():
        while True:
            fakelib.busy_with_errors(20)
            running.set()

    threading.Thread(target=loop, daemon=True).start()
    running.wait()
    exitsafe.quiesce()
    """
    env = {**fake_site_packages(tmp_path), "EXITSAFE_TRACE": "1"}
    run = run_program(body, tmp_path, env=env, timeout=30)
    assert_clean(run)
    assert "Error" not in run.stderr, run.describe()
    assert trace_fields(run.stderr, "quiesce")["parked"] == "1"


def test_a_call_the_caller_did_not_make_is_no_safe_point():
    # A weakref callback run by a deallocation (as h5py's object registry's, under h5py's
    # lock) is entered from a frame that is not at a call instruction.
    import sys as _sys
    import weakref

    from exitsafe import _quiesce

    _quiesce._prepare()
    seen: list[bool] = []

    class Target:
        pass

    def callback(_ref):
        seen.append(_quiesce._at_a_call(_sys._getframe(1)))

    def called():
        seen.append(_quiesce._at_a_call(_sys._getframe(1)))

    def body():
        called()  # a call instruction
        target = Target()
        ref = weakref.ref(target, callback)
        target = None  # the callback runs from a store, not a call
        assert ref() is None

    body()
    assert seen == [True, False]


#: A thread blocked in a native call that only a write to its pipe ends (``read(2)``
#: through ctypes: not the standard library's, so the thread is not idle, it is inside
#: native code), and the handle it uses.
BLOCKED_READER = """
    import ctypes, os
    _libc = ctypes.CDLL(None)
    r, w = os.pipe()
    session = exitsafe.track("session", lambda raw: record("released"), name="session")
    started = threading.Event()

    def reader():
        buf = ctypes.create_string_buffer(1)
        started.set()
        while True:
            _libc.read(r, buf, 1)  # blocked in native code, the GIL released
            record("read returned")

    threading.Thread(target=reader, daemon=True, name="reader").start()
    started.wait()
    time.sleep(0.05)
"""


def test_wake_gets_a_thread_out_of_its_native_call_and_it_parks_as_the_call_returns(
    tmp_path,
):
    body = "import time\n" + textwrap.dedent(BLOCKED_READER) + textwrap.dedent("""
    exitsafe.quiesce(wake=lambda: os.write(w, b"x"), timeout=10)
    """)
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    assert_clean(run)
    assert run.order == ["released"]  # the read returned, and the thread never ran on
    assert run.outcomes() == {"session": "released_at_exit"}
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["threads"], fields["parked"], fields["running"]) == ("1", "1", "0")


def test_without_wake_the_blocked_thread_is_still_running_and_nothing_is_released(tmp_path):
    body = "import time\n" + textwrap.dedent(BLOCKED_READER) + textwrap.dedent("""
    exitsafe.quiesce(timeout=0.3)
    """)
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    assert_clean(run)
    assert run.order == []
    assert run.outcomes() == {"session": "leaked_in_use"}
    assert trace_fields(run.stderr, "quiesce")["running"] == "1"


def test_a_wake_action_that_fails_is_logged_and_the_others_still_run(tmp_path):
    body = "import time\n" + textwrap.dedent(BLOCKED_READER) + textwrap.dedent("""
    def broken():
        raise RuntimeError("cannot wake")

    exitsafe.quiesce(wake=[broken, lambda: os.write(w, b"x")], timeout=10)
    """)
    run = run_program(body, tmp_path, ledger=True, timeout=30)
    assert_clean(run, allow=["cannot wake"])
    assert "quiesce wake action" in run.stderr and "cannot wake" in run.stderr
    assert run.outcomes() == {"session": "released_at_exit"}


@pytest.mark.parametrize("wake", [5, [print, "x"], object()])
def test_wake_must_be_callables(wake):
    with pytest.raises(TypeError, match="wake must be a callable"):
        exitsafe.quiesce(wake=wake)


@pytest.mark.skipif(
    (3, 12, 0) <= sys.version_info[:3] <= (3, 12, 2),
    reason="CPython 3.12.0-3.12.2 start no thread at shutdown: wake actions run unbounded",
)
def test_a_wake_action_that_blocks_is_bounded_and_the_exit_goes_on(tmp_path):
    body = "import time\n" + textwrap.dedent(BLOCKED_READER) + textwrap.dedent("""
    def blocks():
        threading.Event().wait()  # never returns

    exitsafe.quiesce(wake=[blocks], timeout=0.5)
    """)
    run = run_program(body, tmp_path, ledger=True, timeout=30)
    assert not run.hung
    assert "wake actions still running" in run.stderr
    assert run.outcomes() == {"session": "leaked_in_use"}  # the reader was never woken


def test_a_wake_that_came_too_early_is_run_again_while_the_thread_still_runs(tmp_path):
    # The first wake ends nothing (an interrupt sent before the query it was meant for
    # began); the thread is still in its native call, so the wake runs again.
    body = "import time\n" + textwrap.dedent(BLOCKED_READER) + textwrap.dedent("""
    calls = []

    def wake():
        calls.append(1)
        if len(calls) >= 2:
            os.write(w, b"x")

    exitsafe.quiesce(wake=wake, timeout=10)
    """)
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    assert_clean(run)
    assert run.outcomes() == {"session": "released_at_exit"}
    fields = trace_fields(run.stderr, "quiesce")
    assert (fields["parked"], fields["running"]) == ("1", "0")


def test_a_thread_inside_the_profile_function_is_never_taken_for_idle(monkeypatch):
    """The wait looks at each thread's stack; a thread caught inside the profile function
    (exitsafe's own code, which otherwise reads as idle) may return from it without
    parking and go on into a library: it counts as running until a later look."""
    from exitsafe import _quiesce

    seen = []

    def reentered():
        seen.append(_quiesce._idle(sys._getframe(1)))
        return True  # (and _on_event returns: nothing parks in this test)

    go = threading.Event()

    def program_code():  # a thread of the program's own code, no library below it
        go.wait()
        _quiesce._on_event(sys._getframe(), "c_call", None)

    thread = threading.Thread(target=program_code)
    monkeypatch.setattr(_quiesce._sync, "reentered", reentered)
    monkeypatch.setattr(_quiesce, "_targets", {})
    thread.start()  # (its ident is known only once started)
    _quiesce._targets[thread.ident] = False
    go.set()
    thread.join()
    assert seen == [False]

"""Class 2 and 4: signals at each phase, and teardowns interrupted by them.

A handler never waits for exitsafe's lock (its own thread may hold it); a signal
handled while its thread is inside a release never makes the teardown wait for
itself; a signal that arrives during a teardown is honoured after it, and every
handle the teardown claimed ends with exactly one outcome.
"""

from __future__ import annotations

import os
import signal

import pytest

from ..support import NOISE, run_program
from .programs import FORCE_IN_SECTIONS, program

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

GRAPH = """
    import signal, time
    from exitsafe.signals import teardown_on_signals

    inst = exitsafe.track("instance", record, name="instance")
    dev = exitsafe.track("device", record, name="device", depends_on=[inst])
"""


def assert_died_by(run, signum: int) -> None:
    assert not run.hung, f"the process never died\n{run.describe()}"
    assert run.returncode == -signum, run.describe()
    for word in NOISE:
        assert word not in run.stderr, run.describe()


def test_immediate_handler_inside_a_critical_section_does_not_wait_for_itself(tmp_path):
    body = """
        teardown_on_signals("SIGTERM", mode="immediate")
        fired = []

        def fire():
            if not fired:
                fired.append(True)
                record("signal-sent-inside-a-section")
                signal.raise_signal(signal.SIGTERM)  # handled while the lock is held

        force_in_sections(fire)
        while True:
            exitsafe.lowlevel.default_registry().live_handles()
    """
    run = run_program(program(FORCE_IN_SECTIONS, GRAPH, body), tmp_path, ledger=True, timeout=30)
    assert_died_by(run, signal.SIGTERM)
    assert run.order == ["signal-sent-inside-a-section", "device", "instance"]
    assert run.outcomes() == {"device": "released_at_exit", "instance": "released_at_exit"}


def test_signal_inside_a_release_on_the_same_thread_is_not_waited_for(tmp_path):
    body = """
        teardown_on_signals(["SIGTERM"], mode="immediate")

        def slow_release(raw):
            record("release-started")
            os.kill(os.getpid(), signal.SIGTERM)  # handled inside this release
            time.sleep(30)  # never reached: the handler ends the process

        buf = exitsafe.track("buffer", slow_release, name="buffer", depends_on=[dev])
        buf.release()
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=20)
    assert_died_by(run, signal.SIGTERM)
    assert run.order == ["release-started"], "nothing released from under the buffer"
    outcomes = run.outcomes()
    assert outcomes == {
        "buffer": "leaked_in_use",
        "device": "leaked_dependent",
        "instance": "leaked_dependent",
    }
    entry = next(
        e for e in run.ledger()["registries"][0]["entries"] if e["name"] == "buffer"
    )
    assert "thread running the teardown" in entry["detail"]


HANDLES = 100_000

INTERRUPT_EXIT_TEARDOWN = """
    import functools, signal
    from exitsafe.signals import teardown_on_signals

    if MODE != "default":
        teardown_on_signals(SIGNAL, mode=MODE)
    count = [0]

    def release(raw):
        count[0] += 1

    signum = getattr(signal, SIGNAL)
    # The middle handle's release is os.kill itself, C code with no Python bytecode:
    # the handler runs at the next bytecode of the teardown loop, between two steps.
    kill = functools.partial(os.kill, os.getpid())
    keep = [
        exitsafe.track(signum, kill) if i == HANDLES // 2 else exitsafe.track(i, release)
        for i in range(HANDLES)
    ]

    def report():
        record(f"releases={count[0]}")

    exitsafe.on_teardown(report, after=[keep[0]])  # runs after the last release
"""


@pytest.mark.parametrize(
    ("signame", "mode"),
    [("SIGINT", "default"), ("SIGTERM", "exit"), ("SIGTERM", "immediate")],
    ids=["sigint-keyboardinterrupt", "sigterm-exit-mode", "sigterm-immediate-mode"],
)
def test_signal_during_the_exit_teardown_of_many_handles(tmp_path, signame, mode):
    run = run_program(
        program(INTERRUPT_EXIT_TEARDOWN, HANDLES=HANDLES, SIGNAL=signame, MODE=mode),
        tmp_path,
        ledger=True,
        timeout=120,
    )
    assert_died_by(run, getattr(signal, signame))  # honoured, after the teardown
    assert run.order == [f"releases={HANDLES - 1}"], "the teardown went on to the end"
    counts = run.outcome_counts()
    assert counts == {"released_at_exit": HANDLES, "hook_ran": 1}, "one outcome per handle"


# A signal landing in a section is acted on by the main thread, never by the thread or
# the finalizer that next calls exitsafe, and never lost.  Whether the main thread gets
# it back before it reaches its exit (SystemExit: 143) or the exit teardown acts on it
# (the process ends by the signal: -15), the program ends by SIGTERM.
SIGNAL_IN_A_SECTION = """
    import signal
    from exitsafe.signals import teardown_on_signals

    teardown_on_signals("SIGTERM", mode=MODE)
    fired = []

    def fire():
        if not fired:
            fired.append(True)
            record("signal-sent-inside-a-section")
            signal.raise_signal(signal.SIGTERM)

    go, done = threading.Event(), threading.Event()
    # Every exit path lets the worker make its call, and waits for it (a non-daemon thread,
    # joined before the exit teardown): the signal may end the main thread before the
    # worker was ever scheduled, which is not what this test is about.
    threading._register_atexit(go.set)

    def worker():
        go.wait()
        try:
            exitsafe.track("w", lambda raw: None).release()  # an exitsafe call right after
        except BaseException as exc:  # the signal acted on this thread: what must not be
            record(f"worker-got-{type(exc).__name__}")
            raise
        else:
            record("worker-went-on")
        finally:
            done.set()

    threading.Thread(target=worker).start()
    spare = [exitsafe.track("spare", lambda raw: None)]

    def parent_release(raw):
        if VARIANT == "finalizer":
            spare.clear()  # drops a handle: its finalizer calls exitsafe
        else:
            go.set()
            done.wait(10)
        record("parent-released")

    parent = exitsafe.track("parent", parent_release, name="parent")
    # affinity="creator" (the main thread creates and releases it) keeps the release on
    # exitsafe's Python path, whose sections run Python lines the tracer stops in; the
    # compiled core's sections run Python code only by exception (a ledger trim, a
    # collection before CPython 3.12), which a tracer cannot force.
    child = exitsafe.track(
        "child", lambda raw: None, name="child", depends_on=[parent], affinity="creator"
    )
    parent.release()
    force_in_sections(fire)
    try:
        child.release()
    finally:
        stop_forcing()
    for _ in range(10**6):  # Python code of the program's own, until the signal acts
        pass
    record("main-went-on")
"""


@pytest.mark.parametrize("variant", ["thread", "finalizer"])
def test_signal_in_a_section_is_acted_on_by_the_main_thread(tmp_path, variant):
    run = run_program(
        program(FORCE_IN_SECTIONS, SIGNAL_IN_A_SECTION, MODE="exit", VARIANT=variant),
        tmp_path,
        timeout=60,
    )
    assert not run.hung, run.describe()
    assert run.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), run.describe()
    for word in NOISE:
        assert word not in run.stderr, run.describe()
    assert run.order[0] == "signal-sent-inside-a-section"
    if variant == "thread":
        assert "worker-went-on" in run.order, "the worker thread was not ended by it"


def test_immediate_signal_in_a_section_tears_down_on_the_main_thread(tmp_path):
    body = """
        record(f"main={threading.get_ident()}")

        def release(raw):
            record(f"released {raw} on {threading.get_ident()}")

        h = exitsafe.track("h", release, name="h")
    """
    run = run_program(
        program(FORCE_IN_SECTIONS, body, SIGNAL_IN_A_SECTION, MODE="immediate", VARIANT="thread"),
        tmp_path,
        ledger=True,
        timeout=60,
    )
    assert_died_by(run, signal.SIGTERM)
    main = run.order[0].split("=")[1]
    assert f"released h on {main}" in run.order
    assert run.outcomes()["h"] == "released_at_exit"


def test_signal_in_the_section_of_a_borrow_leaves_no_borrow_open(tmp_path):
    body = """
        import signal
        from exitsafe.signals import teardown_on_signals

        teardown_on_signals("SIGTERM")
        dev = exitsafe.track("device", record, name="device")
        buf = exitsafe.track("buffer", record, name="buffer", depends_on=[dev])
        fired = []

        def fire():
            if not fired:
                fired.append(True)
                signal.raise_signal(signal.SIGTERM)

        force_in_sections(fire)
        try:
            with buf.borrow():
                record("using")
                for _ in range(10**6):
                    pass
        finally:
            stop_forcing()
            record(f"borrowed={buf.borrowed}")
    """
    run = run_program(program(FORCE_IN_SECTIONS, body), tmp_path, ledger=True, timeout=60)
    assert not run.hung, run.describe()
    assert run.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), run.describe()
    assert "borrowed=False" in run.order
    assert run.order[-2:] == ["buffer", "device"]
    assert run.outcomes() == {"buffer": "released_at_exit", "device": "released_at_exit"}


def test_second_signal_during_the_immediate_teardown_loses_no_outcome(tmp_path):
    body = """
        from exitsafe.signals import teardown_on_signals

        teardown_on_signals("SIGTERM", mode="immediate")
        h = exitsafe.track("h", record, name="h")
        exitsafe.on_teardown(lambda: os.kill(os.getpid(), signal.SIGTERM), name="second")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # never reached: the handler ends the process
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=60)
    assert_died_by(run, signal.SIGTERM)
    assert run.order == ["h", "device", "instance"]
    assert run.outcomes() == {
        "second": "hook_ran",
        "h": "released_at_exit",
        "device": "released_at_exit",
        "instance": "released_at_exit",
    }


def test_sigint_during_the_exit_teardown_lets_the_other_atexit_callbacks_run(tmp_path):
    code = """
        import atexit, logging, logging.handlers, os, signal

        log = os.open(os.environ["ORDER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)

        def record(text):
            os.write(log, (str(text) + "\\n").encode())

        # Registered before exitsafe's: they run after its exit teardown.
        atexit.register(record, "earlier atexit callback")
        target = logging.FileHandler(os.environ["ORDER_LOG"])
        buffered = logging.handlers.MemoryHandler(100, target=target)  # flushed at exit
        app = logging.getLogger("app")
        app.addHandler(buffered)
        app.setLevel(logging.INFO)
        app.info("buffered log record")

        import exitsafe

        h = exitsafe.track("h", record, name="h")
        exitsafe.on_teardown(lambda: os.kill(os.getpid(), signal.SIGINT), name="ctrl-c")
    """
    run = run_program(code, tmp_path, ledger=True, timeout=60, prelude=False)
    assert_died_by(run, signal.SIGINT)
    assert run.order == ["h", "earlier atexit callback", "buffered log record"]
    assert run.outcomes() == {"ctrl-c": "hook_ran", "h": "released_at_exit"}


def test_immediate_signal_during_the_first_import_of_the_teardowns_modules(tmp_path):
    # The teardown imports some of its modules on first use (import exitsafe stays cheap).
    # A signal whose handler tears down can land while the main thread's own teardown is
    # executing such an import for the first time: the handler's teardown must not find
    # that module half-executed (it used to fail on an ImportError, releasing nothing).
    # The signal is sent at the first Python code of exitsafe._steps this process runs,
    # inside the explicit teardown below.
    body = """
        teardown_on_signals("SIGTERM", mode="immediate")
        sent = []

        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.endswith("_steps.py") and not sent:
                sent.append(True)
                record("signal-sent")
                os.kill(os.getpid(), signal.SIGTERM)

        sys.settrace(tracer)
        exitsafe.lowlevel.default_registry().teardown(reason="explicit")
        time.sleep(30)  # never reached: the handler ends the process
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=30)
    assert_died_by(run, signal.SIGTERM)
    assert "failed" not in run.stderr, run.describe()
    assert run.order == ["signal-sent", "device", "instance"]
    assert run.outcomes() == {"device": "released_at_exit", "instance": "released_at_exit"}


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_during_an_early_hook_at_exit_ends_the_process_after_the_exit(
    tmp_path, signame
):
    # An early-exit hook (a server's graceful stop) was cut by the signal's exception,
    # recorded as the hook's own failure, and the process exited 0: the signal was lost.
    # It is held back like one during the teardown: the hook finishes, the teardown
    # runs, and the process ends by the signal.
    body = f"""
        teardown_on_signals()  # SIGTERM: SystemExit(143); SIGINT: KeyboardInterrupt

        def stop_server():
            os.kill(os.getpid(), signal.{signame})  # arrives while the hook runs
            record("server stopped")

        exitsafe.on_early_exit(stop_server, name="stop server")
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=30)
    assert_died_by(run, getattr(signal, signame))
    assert run.order == ["server stopped", "device", "instance"]
    assert run.outcomes() == {
        "stop server": "hook_ran",
        "device": "released_at_exit",
        "instance": "released_at_exit",
    }


def test_a_signal_during_the_early_hooks_of_an_explicit_teardown_is_raised_after_it(tmp_path):
    body = """
        teardown_on_signals()

        def stop_server():
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the hook runs
            record("server stopped")

        exitsafe.on_early_exit(stop_server, name="stop server")
        try:
            exitsafe.teardown(reason="explicit")
        except SystemExit as exc:
            record(f"SystemExit({exc.code}) after the teardown")
            raise
        record("teardown returned: the signal was lost")
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=30)
    assert run.returncode == 128 + signal.SIGTERM, run.describe()
    assert run.order == [
        "server stopped", "device", "instance", "SystemExit(143) after the teardown"
    ]
    assert run.outcomes() == {
        "stop server": "hook_ran",
        "device": "released_at_exit",
        "instance": "released_at_exit",
    }


def test_immediate_signal_a_few_frames_from_the_recursion_limit_still_ends_by_it(tmp_path):
    # The immediate mode's teardown runs on the stack the signal interrupted: ten frames
    # from the recursion limit, its imports and the ledger's write raised RecursionError,
    # and the process exited 1, not by the signal.
    body = """
        teardown_on_signals("SIGTERM", mode="immediate")

        def deep(n):  # a recursive parser, a tree walk
            if n:
                return deep(n - 1) + 0
            os.kill(os.getpid(), signal.SIGTERM)
            return 0

        deep(sys.getrecursionlimit() - 10)
    """
    run = run_program(program(GRAPH, body), tmp_path, ledger=True, timeout=30)
    assert_died_by(run, signal.SIGTERM)
    assert run.order == ["device", "instance"]
    assert run.outcomes() == {"device": "released_at_exit", "instance": "released_at_exit"}

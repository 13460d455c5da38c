"""`exitsafe.signals.deferred()`: no teardown between opening a native object and declaring
it, whichever thread the kernel gives the signal to.

The hazard, forced on every run: the main thread blocks SIGTERM (the recipe the docs gave
before), but a thread started earlier does not, so the kernel hands it the signal; Python
then runs the handler on the main thread anyway, at its next bytecode, between the open and
the adoption (a spawned pool worker with numpy has such a thread: OpenBLAS's).
"""

from __future__ import annotations

import sys

import pytest

from ..support import run_program

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

PROGRAM = """
    import contextlib
    import signal
    from exitsafe.signals import deferred, teardown_on_signals

    teardown_on_signals("SIGTERM", mode=MODE)
    go, sent = threading.Event(), threading.Event()

    def other_thread():  # started before the block below: SIGTERM is not blocked here
        go.wait()
        os.kill(os.getpid(), signal.SIGTERM)
        sent.set()

    threading.Thread(target=other_thread, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with CONTEXT:
        record("opened")
        go.set()
        sent.wait()
        for _ in range(10000):  # bytecodes: where the handler runs, unless deferred
            pass
        shard = exitsafe.track("shard", lambda raw: record("closed"), name="shard")
        record("adopted")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    record("went on")  # never: the signal is acted on when the block ends
"""

STATUS = {"exit": 128 + 15, "immediate": -15}


@pytest.mark.parametrize("mode", sorted(STATUS))
def test_the_signal_is_acted_on_after_the_block(tmp_path, mode):
    body = PROGRAM.replace("MODE", repr(mode)).replace("CONTEXT", "deferred()")
    run = run_program(body, tmp_path)
    assert run.returncode == STATUS[mode], run.describe()
    assert run.order == ["opened", "adopted", "closed"], run.describe()
    assert "Traceback" not in run.stderr, run.describe()


@pytest.mark.parametrize("mode", sorted(STATUS))
def test_without_it_the_teardown_runs_between_the_open_and_the_adoption(tmp_path, mode):
    # blocking SIGTERM on the main thread alone does not keep the handler out
    body = PROGRAM.replace("MODE", repr(mode)).replace("CONTEXT", "contextlib.nullcontext()")
    run = run_program(body, tmp_path)
    assert run.returncode == STATUS[mode], run.describe()
    assert run.order == ["opened"], run.describe()


def test_blocks_nest_and_each_signal_is_acted_on_once_at_the_outermost_end(tmp_path):
    body = """
    import signal
    from exitsafe.signals import deferred

    def handler(signum, frame):
        record("handled")

    # a handler of the program's own is never held back: SIGUSR1 runs at once
    signal.signal(signal.SIGUSR1, handler)
    with deferred():
        with deferred():
            os.kill(os.getpid(), signal.SIGUSR1)
            record("sent SIGUSR1")
            try:
                os.kill(os.getpid(), signal.SIGINT)  # Python's default handler: held back
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                record("interrupted inside")
            record("inner end")
        record("outer end")
    """
    run = run_program(body, tmp_path)
    assert run.order == ["handled", "sent SIGUSR1", "inner end", "outer end"], run.describe()
    # an uncaught KeyboardInterrupt ends the process by SIGINT (as CPython does)
    assert run.returncode == -2 and "KeyboardInterrupt" in run.stderr, run.describe()
    assert run.stderr.count("KeyboardInterrupt") == 1, run.describe()


def test_off_the_main_thread_it_holds_nothing_back(tmp_path):
    body = """
    import signal
    from exitsafe.signals import deferred

    def worker():
        with deferred() as held:
            record(f"entered on a worker thread: {held is not None}")

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    try:
        with deferred():
            pass
        os.kill(os.getpid(), signal.SIGINT)  # the default handler is back
    except KeyboardInterrupt:
        record("interrupted at once")
    """
    run = run_program(body, tmp_path)
    assert run.returncode == 0, run.describe()
    assert run.order == ["entered on a worker thread: True", "interrupted at once"]


def test_a_handler_that_raises_does_not_keep_the_next_signal_from_its_handler(tmp_path):
    body = """
    import signal
    from exitsafe.signals import deferred, teardown_on_signals

    teardown_on_signals("SIGTERM")  # the exit mode: SystemExit(143)
    try:
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)  # acted on first: KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            record("in the block")
    except KeyboardInterrupt:  # (the SIGTERM's SystemExit comes right after, or in place)
        pass
    for _ in range(10000):  # bytecodes: where the SIGTERM's handler runs
        pass
    record("went on")  # never: the SIGTERM was not lost (it was, before)
    """
    run = run_program(body, tmp_path)
    assert run.order == ["in the block"], run.describe()
    assert run.returncode == 143, run.describe()


def test_exitsafe_exit_inside_a_block_ends_by_the_signal_held_back(tmp_path):
    body = """
    import signal
    from exitsafe.signals import deferred, teardown_on_signals

    teardown_on_signals("SIGTERM")

    def release(raw):
        os.kill(os.getpid(), signal.SIGTERM)  # held back: by the block, and the teardown
        record("released")

    h = exitsafe.track("h", release, name="h")
    with deferred():
        exitsafe.exit(3)
    """
    run = run_program(body, tmp_path)
    assert run.order == ["released"], run.describe()
    assert run.returncode == -15, run.describe()


def test_exitsafe_exit_called_by_a_teardown_step_ends_by_the_signal_held_back(tmp_path):
    body = """
    import signal
    from exitsafe.signals import teardown_on_signals

    teardown_on_signals("SIGTERM")

    def release(raw):
        os.kill(os.getpid(), signal.SIGTERM)  # held back by the exit teardown
        record("released")
        exitsafe.exit(3)

    h = exitsafe.track("h", release, name="h")
    """
    run = run_program(body, tmp_path)
    assert run.order == ["released"], run.describe()
    assert run.returncode == -15, run.describe()


def test_a_child_forked_inside_a_block_does_not_hold_its_signals(tmp_path):
    body = """
    import multiprocessing
    import time
    from exitsafe.signals import deferred, teardown_on_signals

    def child(ready):
        ready.send("up")
        while True:
            time.sleep(0.05)

    if __name__ == "__main__":
        teardown_on_signals("SIGTERM")
        context = multiprocessing.get_context("fork")
        reader, writer = context.Pipe(duplex=False)
        with deferred():
            process = context.Process(target=child, args=(writer,))
            process.start()  # forked by the thread holding the block
        reader.recv()
        process.terminate()
        process.join(30)
        record(f"exitcode {process.exitcode}")
        if process.exitcode is None:
            process.kill()
    """
    run = run_program(body, tmp_path, timeout=60)
    assert run.returncode == 0, run.describe()
    assert run.order == ["exitcode 143"], run.describe()  # its SystemExit(143), at once


def test_handlers_installed_inside_a_block_are_held_back_too(tmp_path):
    body = """
    import signal
    from exitsafe.signals import deferred, teardown_on_signals

    with deferred():
        taken = teardown_on_signals(("SIGTERM", "SIGINT"))
        record(f"took {sorted(signal.Signals(s).name for s in taken)}")
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):
            pass
        h = exitsafe.track("shard", lambda raw: record("closed"), name="shard")
        record("adopted")
    record("went on")  # never
    """
    run = run_program(body, tmp_path)
    assert run.order == ["took ['SIGINT', 'SIGTERM']", "adopted", "closed"], run.describe()
    assert run.returncode == 143, run.describe()

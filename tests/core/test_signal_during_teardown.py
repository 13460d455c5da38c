"""A signal that lands while exitsafe tears a process down waits for the whole teardown
(every registry, then the ledger) and is acted on after it, in a multiprocessing worker's
end and in `exitsafe.exit` as at exit.

Each registry's teardown held signals back, but nothing held them between two registries
or while the ledger's path was worked out: there the handler ran its own teardown nested
in the first (a worker ended by ``Pool.terminate()`` hung for ever on an import lock its
own thread held) or its ``SystemExit`` cut the teardown short, leaving the older
registries' handles to the interpreter.  The signal here is sent by a release of the
newest registry, so it lands there on every run.
"""

from __future__ import annotations

import json
import sys

import pytest

from ..support import run_program

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and POSIX signals")

PROGRAM = """
    import multiprocessing
    import signal
    from exitsafe.signals import teardown_on_signals

    KEEP = []

    def release(raw):
        record(f"released {raw}")
        if raw == "newer":
            os.kill(os.getpid(), signal.SIGTERM)  # held back: delivered after the teardown
            record("the release went on")

    def work():
        teardown_on_signals("SIGTERM", mode=MODE)
        older = exitsafe.Registry("older")
        newer = exitsafe.Registry("newer")  # torn down first
        KEEP.append(older.track("older", release, name="older"))
        KEEP.append(newer.track("newer", release, name="newer"))
        if END == "exitsafe.exit":
            exitsafe.exit(0)

    if __name__ == "__main__":
        worker = multiprocessing.get_context("fork").Process(target=work)
        worker.start()
        worker.join()
        record(f"exitcode {worker.exitcode} pid {worker.pid}")
"""

#: How the worker ends, by the way it ends and the signal's mode: by the signal, once its
#: teardown is done, as a process whose exit teardown a signal lands in.
EXITCODES = {
    (end, mode): -15
    for end in ("worker end", "exitsafe.exit")
    for mode in ("exit", "immediate")
}


@pytest.mark.parametrize(("end", "mode"), sorted(EXITCODES))
def test_a_signal_during_the_teardown_waits_for_all_of_it(tmp_path, end, mode):
    body = PROGRAM.replace("MODE", repr(mode)).replace("END", repr(end))
    run = run_program(
        body, tmp_path, env={"EXITSAFE_LEDGER": str(tmp_path / "ledger-{pid}.json")}
    )
    assert run.returncode == 0, run.describe()
    *releases, ending = run.order
    assert releases == ["released newer", "the release went on", "released older"], (
        run.describe()
    )
    _, code, _, pid = ending.split()
    assert int(code) == EXITCODES[end, mode], run.describe()
    ledger = json.loads((tmp_path / f"ledger-{pid}.json").read_text())
    outcomes = {h["name"]: h["outcome"] for r in ledger["registries"] for h in r["entries"]}
    assert outcomes == {"older": "released_at_exit", "newer": "released_at_exit"}, ledger
    assert "Traceback" not in run.stderr, run.describe()


def test_the_ledger_path_imports_nothing_at_exit(tmp_path):
    # Working out the interpreter's id imports a module; done at exit, under a signal
    # handler's teardown, that import waited on a lock the interrupted code held.
    body = """
    def audit(event, args):
        if event == "import" and "interpreters" in args[0]:
            record(f"imported {args[0]}")

    sys.addaudithook(audit)
    h = exitsafe.track("x", lambda raw: record("released"), name="x")
    """
    run = run_program(body, tmp_path, ledger=True)
    assert run.returncode == 0, run.describe()
    assert run.order == ["released"], run.describe()
    assert run.ledger()["registries"], run.describe()


def test_a_second_signal_after_the_handlers_are_back_ends_the_process_by_it(tmp_path):
    # The exit teardown held a first SIGTERM back; a second one landing once the hold put
    # the handlers back (forced there with a tracer) ran the exit mode's handler inside
    # the atexit callback: its SystemExit was "ignored" and the process exited 0.
    body = """
    import signal
    from exitsafe import _interrupts
    from exitsafe.signals import teardown_on_signals

    teardown_on_signals("SIGTERM")
    code = _interrupts.held.__exit__.__code__
    lines = open(code.co_filename).read().splitlines()
    after_restore = next(
        number + 1 for number in range(code.co_firstlineno, len(lines))
        if "arrived = list(" in lines[number]
    )

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == after_restore:
                sys.settrace(None)
                frame.f_trace = None
                os.kill(os.getpid(), signal.SIGTERM)  # the second one
            return local

        return local

    def release(raw):
        os.kill(os.getpid(), signal.SIGTERM)  # the first, held back by the exit teardown
        record("released")
        sys.settrace(tracer)

    h = exitsafe.track("h", release, name="h")
    """
    run = run_program(body, tmp_path)
    assert run.order == ["released"], run.describe()
    assert run.returncode == -15, run.describe()
    assert "Exception ignored" not in run.stderr, run.describe()

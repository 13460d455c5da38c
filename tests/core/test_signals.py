"""The opt-in signal handlers: SIGTERM becomes an orderly teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from exitsafe.signals import teardown_on_signals

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, time, exitsafe
    from exitsafe.signals import teardown_on_signals
    log = sys.argv[2]
    def record(raw):
        with open(log, "a") as fh:
            fh.write(raw + "\\n")
    inst = exitsafe.track("instance", record)
    dev = exitsafe.track("device", record, depends_on=[inst])
    teardown_on_signals(mode=sys.argv[1])
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
)


def run_and_terminate(tmp_path, mode: str) -> tuple[int, list[str]]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    log = tmp_path / "order.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    return proc.returncode, log.read_text().split() if log.exists() else []


def test_sigterm_unprotected_skips_teardown(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PROGRAM.replace("teardown_on_signals(mode=sys.argv[1])", ""))
    log = tmp_path / "order.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), "exit", str(log)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert not log.exists(), "without the helper SIGTERM skips every release"


def test_sigterm_exit_mode_tears_down_in_order(tmp_path):
    code, order = run_and_terminate(tmp_path, "exit")
    assert code == 128 + signal.SIGTERM
    assert order == ["device", "instance"]


def test_sigterm_immediate_mode_tears_down_then_dies_by_signal(tmp_path):
    code, order = run_and_terminate(tmp_path, "immediate")
    assert code == -signal.SIGTERM
    assert order == ["device", "instance"]


def test_programs_own_handler_is_left_alone():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert teardown_on_signals(["SIGTERM"]) == {}
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown signal"):
        teardown_on_signals(["SIGNOPE"])
    with pytest.raises(ValueError, match="mode"):
        teardown_on_signals(mode="later")
    with pytest.raises(TypeError):
        teardown_on_signals([1.5])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "program",
    [
        # the handle's teardown runs at exit, then the process must still die by SIGINT
        "import exitsafe, signal\n"
        "h = exitsafe.track('h', lambda raw: None)\n"
        "signal.raise_signal(signal.SIGINT)\n",
        # an atexit callback that imports a module: on CPython 3.9, 3.10 and 3.12 that
        # alone made the uncaught KeyboardInterrupt end with exit 1
        "import atexit, exitsafe\n"
        "atexit.register(lambda: __import__('json'))\n"
        "raise KeyboardInterrupt\n",
    ],
    ids=["raised-signal", "atexit-import"],
)
def test_uncaught_keyboard_interrupt_still_ends_the_process_by_sigint(
    tmp_path, program: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr
    assert "KeyboardInterrupt" in proc.stderr  # CPython's own report is still printed


def test_a_caught_keyboard_interrupt_keeps_the_program_s_exit_status(tmp_path) -> None:
    program = (
        "import exitsafe, sys\n"
        "try:\n"
        "    raise KeyboardInterrupt\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, timeout=60)
    assert proc.returncode == 3


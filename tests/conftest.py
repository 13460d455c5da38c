"""Set-up shared by every test directory."""

from __future__ import annotations

import signal


def pytest_configure() -> None:
    # A command started in the background by a non-interactive shell (`cmd &`, nohup, many
    # CI runners) inherits SIGINT *ignored*, and so does every program the tests start: Ctrl-C
    # (or os.kill(pid, SIGINT)) then does nothing there, and the tests of what exitsafe does
    # with SIGINT would test nothing.  Give the programs the disposition a terminal gives.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

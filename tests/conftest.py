"""Set-up shared by every test directory."""

from __future__ import annotations

import signal
from typing import Any, List

import pytest


def pytest_configure() -> None:
    # A command started in the background by a non-interactive shell (`cmd &`, nohup, many
    # CI runners) inherits SIGINT *ignored*, and so does every program the tests start: Ctrl-C
    # (or os.kill(pid, SIGINT)) then does nothing there, and the tests of what exitsafe does
    # with SIGINT would test nothing.  Give the programs the disposition a terminal gives.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: Tests whose subject is the same whichever core runs the handles: the docs and their
#: examples, the layout of the source tree, the test harness (exitsafe.testing, the catalogue of
#: exit failures, the hints), the benchmarks' smoke run and the probes of CPython's own shutdown.
#: They carry the marker ``any_core``; CI's passes against the pure-Python core leave them out
#: (``-m "not any_core"``), the compiled-core passes run them on every interpreter.
ANY_CORE = (
    "tests/testing/",
    "tests/test_docs.py",
    "tests/test_docs_site.py",
    "tests/test_structure.py",
    "tests/test_benchmarks_quick.py",
    "tests/test_shutdown_versions.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where.startswith(ANY_CORE):
            item.add_marker(pytest.mark.any_core)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # What the default command leaves out, and why (pyproject.toml's addopts).
    if config.option.markexpr == "not repeat":
        terminalreporter.write_line(
            "not run by default: the 20x repetition runs of the scenario suite (marker "
            "`repeat`, about a minute on 2 cores); `-m repeat` runs them, and CI does."
        )

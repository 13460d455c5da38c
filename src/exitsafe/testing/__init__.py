"""Crash-regression testing: run a program in a fresh process and check it exits cleanly.

::

    from exitsafe.testing import run, assert_clean_exit

    result = run("import mybinding; mybinding.open_device()", repeat=20)
    assert_clean_exit(result)

:func:`run` (and :func:`run_command` for any command) starts a fresh interpreter with
faulthandler on for every thread and exitsafe's teardown trace on, captures its
output, kills its whole process group on timeout, and returns an :class:`ExitResult`:
the exit status with its POSIX signal or Windows NTSTATUS decoded by name, the
``Fatal Python error`` with its thread stacks, the "Exception ignored" blocks, and
exitsafe's teardown steps.  :func:`assert_clean_exit` turns a result into a failure
message a person can act on.  The pytest plugin (:mod:`exitsafe.pytest_plugin`) adds
an ``exit_run`` fixture, an ``exitsafe`` marker and ``--exitsafe-repeat``.

Importing this package imports no test framework.
"""

from __future__ import annotations

from ._decode import NtStatus, decode_ntstatus, decode_signal, describe_exit
from ._result import ExitResult, ExitResults, assert_clean_exit
from ._runner import DEFAULT_ENV, child_env, python_argv, run, run_command
from ._stderr import (
    ExceptionReport,
    FatalError,
    Frame,
    ThreadStack,
    Unraisable,
    parse_fatal_errors,
    parse_uncaught,
    parse_unraisable,
)
from .trace import RegistryTeardown, TeardownStep, parse_trace, summarize

__all__ = [
    "DEFAULT_ENV",
    "ExceptionReport",
    "ExitResult",
    "ExitResults",
    "FatalError",
    "Frame",
    "NtStatus",
    "RegistryTeardown",
    "TeardownStep",
    "ThreadStack",
    "Unraisable",
    "assert_clean_exit",
    "child_env",
    "decode_ntstatus",
    "decode_signal",
    "describe_exit",
    "parse_fatal_errors",
    "parse_trace",
    "parse_uncaught",
    "parse_unraisable",
    "python_argv",
    "run",
    "run_command",
    "summarize",
]

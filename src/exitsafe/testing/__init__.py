"""Crash-regression testing: run a program in a fresh process and check it exits cleanly.

```python
from exitsafe.testing import run, assert_clean_exit

result = run("import mybinding; mybinding.open_device()", repeat=20)
assert_clean_exit(result)
```

[`run`][exitsafe.testing.run] (and [`run_command`][exitsafe.testing.run_command] for any command)
starts a fresh interpreter with faulthandler on for every thread and exitsafe's teardown trace on,
captures its output, kills its whole process group on timeout, and returns an
[`ExitResult`][exitsafe.testing.ExitResult]: the exit status with its POSIX signal or Windows
NTSTATUS decoded by name, the ``Fatal Python error`` with its thread stacks, the "Exception ignored"
blocks, and exitsafe's teardown steps. [`assert_clean_exit`][exitsafe.testing.assert_clean_exit]
turns a result into a failure message a person can act on. The pytest plugin
(`exitsafe.pytest_plugin`) adds an ``exit_run`` fixture, an ``exitsafe`` marker and
``--exitsafe-repeat``.

Importing this package imports no test framework.
"""

from __future__ import annotations

from ._children import ChildProcess
from ._decode import NtStatus
from ._diagnosis import Diagnosis
from ._records import AuditFinding, CheckResult
from ._result import ExitNotClean, ExitResult, ExitResults, assert_clean_exit
from ._runner import run, run_command

__all__ = [
    "AuditFinding",
    "CheckResult",
    "ChildProcess",
    "Diagnosis",
    "ExitNotClean",
    "ExitResult",
    "ExitResults",
    "NtStatus",
    "assert_clean_exit",
    "run",
    "run_command",
]

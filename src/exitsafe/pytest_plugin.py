"""pytest plugin for exit crash-regression tests (registered through the ``pytest11`` entry point).

Adds:

* the fixture ``exit_run``: [`exitsafe.testing.run`][exitsafe.testing.run] with the test's
  ``tmp_path`` as the working directory and the repeat count and timeout of the marker and option
  below applied (``exit_run.command(argv)`` does the same for any command);
* the marker ``@pytest.mark.exitsafe(repeat=20, timeout=60, audit=False, checks=())``: run
  each scenario of the test ``repeat`` times (a failure at exit is often intermittent)
  with that timeout, audited or not, with those checks after each run;
* the option ``--exitsafe-repeat=N``, which overrides every test's repeat count (``1``
  for a quick run, ``100`` for a soak run);
* failure reports: [`assert_clean_exit`][exitsafe.testing.assert_clean_exit] raises
  [`ExitNotClean`][exitsafe.testing.ExitNotClean], whose first line is the decoded summary (what
  pytest's short summary shows); a test that used ``exit_run`` and failed some other
  way gets an ``exitsafe`` section with each non-clean result decoded, and the terminal
  summary lists the failure rate of repeated runs.

Importing this module imports nothing beyond pytest and exitsafe's core; the runner is
imported when the fixture is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator, Iterator, Mapping, Optional, Sequence, Union

import pytest

if TYPE_CHECKING:
    import os

    from exitsafe.testing import ExitResult, ExitResults

    StrPath = Union[str, os.PathLike[str]]

DEFAULT_TIMEOUT = 30.0

_results_key = pytest.StashKey[list[Any]]()
_summary_key = pytest.StashKey[list[tuple[str, str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("exitsafe", "exitsafe exit crash-regression tests")
    group.addoption(
        "--exitsafe-repeat",
        type=int,
        default=None,
        metavar="N",
        help="run every exit_run scenario N times (overrides @pytest.mark.exitsafe(repeat=...))",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "exitsafe(repeat=1, timeout=30.0, audit=False, checks=()): how many times the"
        " exit_run fixture runs each scenario of the test, the timeout of each run, whether"
        " runs are audited, and commands run after each run that must pass",
    )
    repeat = config.getoption("exitsafe_repeat", None)
    if repeat is not None and repeat < 1:
        raise pytest.UsageError(f"--exitsafe-repeat must be at least 1, not {repeat}")
    config.stash[_summary_key] = []


class ExitRunner:
    """The ``exit_run`` fixture: call it like [`exitsafe.testing.run`][exitsafe.testing.run].

    Defaults come from the test: ``cwd`` is the test's ``tmp_path``; ``repeat`` is
    ``--exitsafe-repeat``, else the ``exitsafe`` marker's ``repeat``, else 1; ``timeout``
    is the marker's ``timeout``, else 30 s.  With a repeat count above 1 a call returns an
    [`ExitResults`][exitsafe.testing.ExitResults]; pass the result to
    [`assert_clean_exit`][exitsafe.testing.assert_clean_exit] either way.  Every result is kept in
    `results` for the failure report.
    """

    def __init__(
        self,
        cwd: StrPath,
        repeat: int,
        timeout: Optional[float],
        audit: bool = False,
        checks: Sequence[Union[str, Sequence[str]]] = (),
    ) -> None:
        self.cwd = cwd
        self.repeat = repeat
        self.timeout = timeout
        self.audit = audit
        self.checks = tuple(checks)
        self.results: list[Union[ExitResult, ExitResults]] = []

    def __call__(
        self,
        code: Optional[str] = None,
        *,
        script: Optional[StrPath] = None,
        module: Optional[str] = None,
        args: Sequence[str] = (),
        env: Optional[Mapping[str, Optional[str]]] = None,
        cwd: Optional[StrPath] = None,
        timeout: Optional[float] = None,
        repeat: Optional[int] = None,
        python: Optional[StrPath] = None,
        checks: Optional[Sequence[Union[str, Sequence[str]]]] = None,
        audit: Optional[bool] = None,
    ) -> Union[ExitResult, ExitResults]:
        """Run Python code, a script or a module; see
        [`exitsafe.testing.run`][exitsafe.testing.run]."""
        from exitsafe.testing._runner import python_argv

        kwargs: dict[str, Any] = {"script": script, "module": module, "args": args}
        if python is not None:
            kwargs["python"] = python
        argv = python_argv(code, **kwargs)
        return self.command(
            argv, env=env, cwd=cwd, timeout=timeout, repeat=repeat, checks=checks, audit=audit
        )

    def command(
        self,
        argv: Sequence[StrPath],
        *,
        env: Optional[Mapping[str, Optional[str]]] = None,
        cwd: Optional[StrPath] = None,
        timeout: Optional[float] = None,
        repeat: Optional[int] = None,
        checks: Optional[Sequence[Union[str, Sequence[str]]]] = None,
        audit: Optional[bool] = None,
    ) -> Union[ExitResult, ExitResults]:
        """Run any command; see [`exitsafe.testing.run_command`][exitsafe.testing.run_command]."""
        from exitsafe.testing import run_command

        result = run_command(
            argv,
            env=env,
            cwd=self.cwd if cwd is None else cwd,
            timeout=self.timeout if timeout is None else timeout,
            repeat=self.repeat if repeat is None else repeat,
            checks=self.checks if checks is None else checks,
            audit=self.audit if audit is None else audit,
        )
        self.results.append(result)
        return result


def _marker_settings(
    node: pytest.Item,
) -> tuple[Optional[int], Optional[float], bool, tuple[Any, ...]]:
    marker = node.get_closest_marker("exitsafe")
    if marker is None:
        return None, None, False, ()
    if marker.args:
        pytest.fail("use @pytest.mark.exitsafe(repeat=..., timeout=...) with keywords", False)
    unknown = set(marker.kwargs) - {"repeat", "timeout", "audit", "checks"}
    if unknown:
        names = ", ".join(sorted(unknown))
        pytest.fail(f"unknown @pytest.mark.exitsafe argument(s): {names}", False)
    repeat = marker.kwargs.get("repeat")
    timeout = marker.kwargs.get("timeout")
    if repeat is not None and (
        not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1
    ):
        pytest.fail(f"@pytest.mark.exitsafe: repeat must be an int >= 1, not {repeat!r}", False)
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        pytest.fail(f"@pytest.mark.exitsafe: timeout must be > 0, not {timeout!r}", False)
    audit = marker.kwargs.get("audit", False)
    if not isinstance(audit, bool):
        pytest.fail(f"@pytest.mark.exitsafe: audit must be True or False, not {audit!r}", False)
    checks = marker.kwargs.get("checks", ())
    if isinstance(checks, str):
        checks = (checks,)
    return repeat, None if timeout is None else float(timeout), audit, tuple(checks)


@pytest.fixture
def exit_run(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ExitRunner]:
    """Run a program in a fresh process and decode how it exited; see `ExitRunner`."""
    marker_repeat, marker_timeout, audit, checks = _marker_settings(request.node)
    option = request.config.getoption("exitsafe_repeat", None)
    repeat = option if option is not None else (marker_repeat or 1)
    timeout = marker_timeout if marker_timeout is not None else DEFAULT_TIMEOUT
    runner = ExitRunner(tmp_path, repeat, timeout, audit, checks)
    request.node.stash[_results_key] = runner.results
    yield runner


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when != "call":
        return report
    results = item.stash.get(_results_key, None)
    if not results:
        return report
    from exitsafe.testing import ExitNotClean, ExitResults

    repeated = [r for r in results if isinstance(r, ExitResults)]
    summaries = item.config.stash.get(_summary_key, None)
    if summaries is not None:
        for result in repeated:
            summaries.append((item.nodeid, result.summary()))
    excinfo = call.excinfo
    already_decoded = excinfo is not None and isinstance(excinfo.value, ExitNotClean)
    if report.failed and not already_decoded:
        bad = [r for r in results if not r.clean]
        if bad:
            text = "\n\n".join(r.report() for r in bad)
            report.sections.append(("exitsafe: decoded exit results", text))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    summaries = config.stash.get(_summary_key, None)
    if not summaries:
        return
    terminalreporter.section("exitsafe repeated exit runs")
    for nodeid, summary in summaries:
        terminalreporter.line(f"{nodeid}: {summary}")

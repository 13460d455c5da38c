"""The JSON of a result: [`ExitResult.to_dict`][exitsafe.testing.ExitResult.to_dict] and
[`ExitResults.to_dict`][exitsafe.testing.ExitResults.to_dict], as ``exitsafe run --json``
prints them (schema version `JSON_SCHEMA_VERSION`, documented in the testing docs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._report import stderr_before_fatal
from .parsers import ExceptionReport
from .trace import RegistryTeardown

if TYPE_CHECKING:
    from ._result import ExitResult, ExitResults

#: The version of the JSON that `ExitResult.to_dict` gives (see docs/testing.md).
JSON_SCHEMA_VERSION = 3


def result_dict(result: ExitResult) -> dict[str, Any]:
    """The dict of [`ExitResult.to_dict`][exitsafe.testing.ExitResult.to_dict]."""
    fatal = result.fatal_error
    diagnosis = result.diagnosis
    ntstatus = result.ntstatus
    running = result.audit_running
    return {
        "schema": JSON_SCHEMA_VERSION,
        "args": list(result.args),
        "clean": result.clean,
        "summary": result.summary(),
        "failure_kind": result.failure_kind,
        "diagnosis": None if diagnosis is None else diagnosis.to_dict(),
        "returncode": result.returncode,
        "signal": result.signal,
        "ntstatus": None
        if ntstatus is None
        else {"name": ntstatus.name, "hex": ntstatus.hex, "code": ntstatus.code},
        "timed_out": result.timed_out,
        "timeout": result.timeout,
        "duration": result.duration,
        "fatal_error": None if fatal is None else fatal.to_dict(),
        "stderr_before_fatal": stderr_before_fatal(result) if fatal is not None else [],
        "unraisable": [_exception_dict(r) for r in result.unraisable],
        "thread_exceptions": [_exception_dict(r) for r in result.thread_exceptions],
        "native_fatal": [
            {"line": n.line, "source": n.source, "number": n.number} for n in result.native_fatal
        ],
        "uncaught": None if result.uncaught is None else _exception_dict(result.uncaught),
        "teardown": [s.to_dict() for s in result.teardown],
        "threads_at_exit": [s.to_dict() for s in result.trace if s.event == "thread"],
        "registries": [_registry_dict(r) for r in result.registries],
        "children": [c.to_dict() for c in result.children],
        "checks": [c.to_dict() for c in result.checks],
        "exit_phase": result.exit_phase,
        "audited": result.audited,
        "audit": [f.to_dict() for f in result.audit],
        "audit_running": None if running is None else running.to_dict(),
        "stdout": result.stdout,
        "stderr": result.stderr,
    }


def results_dict(results: ExitResults) -> dict[str, Any]:
    """The dict of [`ExitResults.to_dict`][exitsafe.testing.ExitResults.to_dict]."""
    return {
        "clean": results.clean,
        "summary": results.summary(),
        "runs": len(results),
        "failures": len(results.failures),
        "failure_rate": results.failure_rate,
        "kinds": results.kinds,
        "results": [r.to_dict() for r in results],
    }



def _exception_dict(report: ExceptionReport) -> dict[str, Any]:
    return {
        "context": report.context,
        "object": report.object,
        "type": report.exc_type,
        "message": report.message,
        "traceback": report.traceback,
    }


def _registry_dict(registry: RegistryTeardown) -> dict[str, Any]:
    return {
        "registry": registry.registry,
        "reason": registry.reason,
        "live": registry.live,
        "hooks": registry.hooks,
        "planned": registry.planned,
        "finished": registry.finished,
        "released": registry.released,
        "leaked": registry.leaked,
        "failed": registry.failed,
        "ms": registry.ms,
        "late_releases": registry.late_releases,
        "outcomes": registry.outcomes,
    }

"""The ``exitsafe`` command (also ``python -m exitsafe``).

``exitsafe run [--repeat N] [--timeout S] [--check CMD]... [--audit] [--quiesce] [--json]
[--show-output] [--docs-url URL] -- CMD ...``
    Run a program and tell how it exited: a summary line first (``CLEAN``, or
    ``NOT CLEAN [kind]`` with the cause and the decoded signal or status), then where it
    crashed or hung (faulthandler's frames), the child processes that crashed or hung, the
    exceptions of threads and those ignored at exit, the checks, exitsafe's teardown steps
    and ledger summary when the program uses exitsafe, the audit's findings, the hint with
    the address of its recipe on the docs site, and the last lines of the program's own
    output.  The program runs with
    ``PYTHONFAULTHANDLER=1`` and ``EXITSAFE_TRACE=1`` added to its environment and
    exitsafe's start-up hook on ``PYTHONPATH``, in its own process group, killed whole on
    timeout.  ``--quiesce`` runs it with ``EXITSAFE_QUIESCE`` on (every other thread
    parked at exit before anything is released, with no line of the program changed; a
    bound of the caller's ``EXITSAFE_QUIESCE=S`` is kept).
    Exit status: 0 clean (every run), 1 not clean, 2 usage error (including a command
    that cannot be started).
``exitsafe demo [ARGS ...]``
    Run the scenario catalogue unprotected and protected (``exitsafe.lab.demo``).
``exitsafe --version``
    Print the version.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence, TextIO

EXIT_CLEAN = 0
EXIT_NOT_CLEAN = 1
EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _timeout(text: str) -> Optional[float]:
    if text.lower() in ("none", "0", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _quiesce_env() -> dict[str, str]:
    """``--quiesce``: ``EXITSAFE_QUIESCE`` on, unless the caller's environment gives it a
    bound of its own (a number of seconds), which is kept."""
    import os

    from ._config import quiesce_bound

    own = os.environ.get("EXITSAFE_QUIESCE")
    return {"EXITSAFE_QUIESCE": own if own is not None and quiesce_bound() else "on"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``run`` and ``demo`` subcommands)."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="exitsafe",
        description="Diagnose how programs that hold native handles exit.",
    )
    parser.add_argument("--version", action="version", version=f"exitsafe {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a program and tell how it exited",
        description=(
            "Run CMD (any command; a Python program gets faulthandler and exitsafe's"
            " teardown trace through its environment) and diagnose how it exited."
            " Exit status: 0 clean, 1 not clean, 2 usage error."
        ),
        usage=(
            "exitsafe run [--repeat N] [--timeout S] [--check CMD]... [--audit]"
            " [--quiesce] [--json] [--show-output] [--docs-url URL] -- CMD ..."
        ),
    )
    run.add_argument(
        "--repeat", type=_positive_int, default=1, metavar="N",
        help="run N times and report how many runs failed, and how (default 1)",
    )
    run.add_argument(
        "--timeout", type=_timeout, default=60.0, metavar="S",
        help="seconds before a run is killed with its process group (default 60; 0: none)",
    )
    run.add_argument(
        "--check", action="append", default=[], metavar="CMD",
        help="after the program ends, run CMD (a shell command) in the same directory; a"
        " failing check makes the run NOT CLEAN (catches output lost at exit); repeatable",
    )
    run.add_argument(
        "--audit", action="store_true",
        help="audit exit order: report every native release that runs after exitsafe's"
        " teardown (__del__, ffi.gc, weakref.finalize), with where its object was created,"
        " and the one running when the program hung or crashed",
    )
    run.add_argument(
        "--quiesce", action="store_true",
        help="at exit, park every other thread of a Python program at its next safe point"
        " before anything is released (bounded: 5 s, or EXITSAFE_QUIESCE=S set to seconds):"
        " exitsafe.quiesce() with no line of code; the program need not import exitsafe",
    )
    run.add_argument(
        "--json", action="store_true",
        help="print the decoded result as JSON (schema in docs/testing.md)",
    )
    run.add_argument(
        "--show-output", action="store_true",
        help="print the program's whole stdout and stderr before the diagnosis (without it,"
        " a failed run's report ends with their last lines)",
    )
    run.add_argument(
        "--docs-url", metavar="URL", default=None,
        help="the documentation site the hints link to (default: EXITSAFE_DOCS_URL, else"
        " the project's site); a mirror or a local build (file:///.../site/)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command to run")
    commands.add_parser(
        "demo",
        help="run the scenario catalogue unprotected and protected",
        add_help=False,
    )
    return parser


def _run(args: argparse.Namespace, cmd: list[str], out: TextIO, err: TextIO) -> int:
    if not cmd:
        print("exitsafe run: no command given (usage: exitsafe run [options] -- CMD ...)",
              file=err)
        return EXIT_USAGE
    if args.docs_url:
        import os

        previous = os.environ.get("EXITSAFE_DOCS_URL")
        os.environ["EXITSAFE_DOCS_URL"] = args.docs_url  # read by the report's links
        try:
            return _run_and_report(args, cmd, out, err)
        finally:
            if previous is None:
                os.environ.pop("EXITSAFE_DOCS_URL", None)
            else:
                os.environ["EXITSAFE_DOCS_URL"] = previous
    return _run_and_report(args, cmd, out, err)


def _run_and_report(args: argparse.Namespace, cmd: list[str], out: TextIO, err: TextIO) -> int:
    from .testing import ExitResult, ExitResults, run_command

    try:
        result = run_command(
            cmd, timeout=args.timeout, repeat=args.repeat, checks=args.check, audit=args.audit,
            env=_quiesce_env() if args.quiesce else None,
        )
    except OSError as exc:
        print(f"exitsafe run: cannot start {cmd[0]!r}: {exc}", file=err)
        return EXIT_USAGE
    runs: Sequence[ExitResult] = result if isinstance(result, ExitResults) else (result,)
    global _broken_pipe_status
    _broken_pipe_status = EXIT_CLEAN if result.clean else EXIT_NOT_CLEAN
    if args.json:
        json.dump(result.to_dict(), out, indent=2)
        out.write("\n")
        return EXIT_CLEAN if result.clean else EXIT_NOT_CLEAN
    if args.show_output:
        for number, one in enumerate(runs, 1):
            label = f" (run {number})" if len(runs) > 1 else ""
            out.write(f"--- stdout{label} ---\n{one.stdout}")
            out.write(f"--- stderr{label} ---\n{one.stderr}")
            out.write("--- end of output ---\n")
    if isinstance(result, ExitResults):
        out.write(result.report() + "\n")
    else:
        out.write(result.report(output=not args.show_output) + "\n")
    return EXIT_CLEAN if result.clean else EXIT_NOT_CLEAN


def _demo(argv: list[str], err: TextIO) -> int:
    import importlib

    try:
        demo_main = importlib.import_module("exitsafe.lab.demo").main
    except (ImportError, AttributeError) as exc:
        print(
            "exitsafe demo: the scenario lab is not available in this installation"
            f" (exitsafe.lab.demo could not be imported: {exc})",
            file=err,
        )
        return EXIT_USAGE
    return int(demo_main(argv) or 0)


_RUN_OPTIONS_WITH_VALUE = ("--repeat", "--timeout", "--check", "--docs-url")


def _split_run(argv: list[str]) -> tuple[list[str], Optional[list[str]]]:
    """Split ``run ...`` into exitsafe's options and the command: the command starts after
    the first ``--`` among the options, or at the first argument that is not an option.
    A ``--`` after the command's start belongs to the command."""
    index = 1
    while index < len(argv):
        token = argv[index]
        if token == "--":
            return argv[:index], argv[index + 1 :]
        if token in _RUN_OPTIONS_WITH_VALUE:
            index += 2
        elif token.startswith(tuple(f"{o}=" for o in _RUN_OPTIONS_WITH_VALUE)):
            index += 1
        elif token.startswith("-"):
            index += 1
        else:
            return argv[:index], argv[index:]
    return argv, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``exitsafe`` command with ``argv`` (default ``sys.argv[1:]``); return the
    exit status (0 clean, 1 not clean, 2 usage error).

    A closed standard output (``exitsafe run ... | head``) ends the command quietly
    with the status it would have had."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away: nothing more can be shown.  Point stdout at devnull so
        # the interpreter's final flush does not report the broken pipe again.
        import os

        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return _broken_pipe_status


_broken_pipe_status = EXIT_NOT_CLEAN


def _main(argv: Optional[Sequence[str]] = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    if args_list and args_list[0] == "demo":
        return _demo(args_list[1:], err)
    cmd: Optional[list[str]] = None
    if args_list and args_list[0] == "run":
        args_list, cmd = _split_run(args_list)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, --version, or a usage error argparse printed
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    if args.command == "run":
        # _split_run leaves no positional argument for argparse: the command is ``cmd``.
        return _run(args, cmd or [], out, err)
    parser.print_help(err)
    return EXIT_USAGE

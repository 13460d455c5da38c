"""Every example in the documentation runs, so none of them can rot.

Each ```python block of ``docs/*.md`` and ``docs/porting/*.md`` runs in a fresh
interpreter (``sys.executable``, in an empty temporary directory) and must exit 0
with no "Exception ignored" and no "Traceback" on stderr: the same bar exitsafe
sets for the programs it protects.  An HTML comment on the line right before the
opening fence changes that:

``<!-- no-run -->``
    the block is deliberately not runnable (it needs a real GPU library, say); it
    is still checked to compile.  Use sparingly.
``<!-- continue -->``
    the block continues the last self-contained example above it on the same page
    (the nearest preceding block that is neither ``no-run`` nor a continuation):
    that block's code runs first, in the same fresh interpreter.

A block made only of ``--8<-- "path"`` lines includes a file of ``docs/examples/`` (the
pymdownx.snippets syntax): those programs are real files, and each has an expectation below
(:data:`EXPECTED`): the "before" programs must fail exactly as their page says (a signal, a
FATAL line), the "after" programs must exit 0 cleanly, the example test files must pass (or
fail, for the one that shows a failure report).  The commands the pages show (``$ ...`` lines)
must use the checkout's ``.venv/bin/`` tools, as set up in the README, and the ones of the
pages listed in :data:`COMMAND_PAGES` are run, their first output line compared with the page.

Python code lines in the pages are at most :data:`MAX_LINE` characters, the width of the text
column at 1280 pixels.

The site itself (its build, its diagrams, what it loads) is checked by
tests/test_docs_site.py.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
NO_RUN = "<!-- no-run -->"
CONTINUE = "<!-- continue -->"
FORBIDDEN = ("Exception ignored", "Traceback")
TIMEOUT = 120

_SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")


class Block:
    def __init__(self, path: Path, line: int, lang: str, code: str, marker: str) -> None:
        self.path = path
        self.line = line
        self.lang = lang
        self.code = code
        self.run = marker != NO_RUN
        self.continues = marker == CONTINUE
        self.setup: Block | None = None  # the example a continuation block continues
        self.includes: list[str] = []  # docs/examples files included with --8<--

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(DOCS).as_posix()}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file (any language), in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        lang = match["info"].strip().split(" ")[0].split("{")[0].lower() if match["info"] else ""
        previous = lines[i - 1].strip() if i else ""
        start = i + 1
        j = start
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and stripped.strip(fence[0]) == "":
                break
            j += 1
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[start:j]]
        block = Block(path, i + 1, lang, "\n".join(body) + "\n", previous)
        snippets = [_SNIPPET.match(line) for line in body if line.strip()]
        if snippets and all(snippets):
            # "file.py" or "file.py:START:END" (an excerpt: lines START to END of the file)
            parts = [m.group(1).split(":") for m in snippets if m]
            block.includes = [part[0] for part in parts]
            block.code = "".join(_included(*part) for part in parts)
        blocks.append(block)
        i = j + 1
    return blocks


def _included(name: str, start: str = "", end: str = "") -> str:
    path = EXAMPLES / name
    if not path.exists():
        return ""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if start:
        lines = lines[int(start) - 1 : int(end) if end else None]
    return "".join(lines)


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + sorted((DOCS / "porting").glob("*.md"))


def python_blocks() -> list[Block]:
    found = []
    for path in doc_files():
        root: Block | None = None
        for block in extract_blocks(path):
            if block.lang not in ("python", "py") or block.includes:
                continue  # an included file runs under its own expectation (EXPECTED)
            if block.continues:
                block.setup = root
            elif block.run:
                root = block
            found.append(block)
    return found


def program(block: Block) -> str:
    """The code that runs for ``block``: its setup example first, for a continuation."""
    if block.setup is None:
        return block.code
    return block.setup.code + "\n# --- continued ---\n" + block.code


BLOCKS = python_blocks()


def test_docs_have_examples() -> None:
    assert BLOCKS, f"no ```python blocks found under {DOCS}"


def test_continuations_have_something_to_continue() -> None:
    orphans = [b.id for b in BLOCKS if b.continues and b.setup is None]
    assert not orphans, f"{CONTINUE} blocks with no self-contained example before them: {orphans}"


def test_no_run_marker_is_used_sparingly() -> None:
    skipped = [b.id for b in BLOCKS if not b.run]
    assert len(skipped) <= max(3, len(BLOCKS) // 5), (
        f"{len(skipped)} of {len(BLOCKS)} examples are marked {NO_RUN}: {skipped}; "
        "write them against a fake native API so that they run"
    )


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example(block: Block, tmp_path: Path) -> None:
    if not block.run:
        # marked no-run (it needs a real native library): checked to compile, not run
        compile(block.code, block.id, "exec")
        return
    code = program(block)
    env = dict(os.environ)
    for var in ("EXITSAFE_AT_EXIT", "EXITSAFE_TRACE", "EXITSAFE_LEDGER",
                "EXITSAFE_STEP_TIMEOUT", "EXITSAFE_TEARDOWN_TIMEOUT"):
        env.pop(var, None)
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{block.id}: the example did not finish within {TIMEOUT} s\n{exc.stderr or ''}"
        )
    page = block.id.split(":")[0]
    where = f"{block.id} (the example starting at line {block.line} of docs/{page})"
    assert proc.returncode == 0, (
        f"{where} exited with {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    for needle in FORBIDDEN:
        assert needle not in proc.stderr, (
            f"{where} printed {needle!r} on stderr\n--- stderr\n{proc.stderr}"
        )


# --------------------------------------------------------------------------- docs/examples


@dataclass
class Exits:
    """How a program of docs/examples must end when run as ``python FILE``."""

    returncode: Union[int, Tuple[int, ...]] = 0  # negative: killed by that signal (POSIX)
    stdout: Optional[str] = None  # the whole of stdout, when given
    stderr_has: Tuple[str, ...] = ()  # lines (or parts of lines) stderr must contain
    #: parts the lab runtime's leak report must contain when it was written (a process that
    #: crashes may die before its runtime writes it)
    report_has: Tuple[str, ...] = ()
    env: Dict[str, str] = field(default_factory=dict)
    hangs: float = 0  # > 0: the program must still be running after that many seconds
    #: undefined behaviour that may also, rarely, not crash (as the lab's ``evidence``): a
    #: run that exits 0 instead still fails as its page says when the runtime's report
    #: carries each of these (it proves the late call ran)
    or_exits_with_report: Tuple[str, ...] = ()


@dataclass
class Pytest:
    """An example test file: ``python -m pytest FILE`` must give these counts."""

    passed: int = 0
    failed: int = 0
    output_has: Tuple[str, ...] = ()


SIGSEGV, SIGABRT = -int(signal.SIGSEGV), -int(signal.SIGABRT)
CHILD = "FATAL: device released after its parent instance was released"
NO_LEAKS = "instances=0 devices=0 buffers=0 catalogs=0 inherited=0"
CRASHES = tuple(-int(getattr(signal, n)) for n in ("SIGSEGV", "SIGILL", "SIGTRAP", "SIGBUS")
                if hasattr(signal, n))

#: Every file of docs/examples and what it must do.  A "before" program fails the way its page
#: says; its "after" counterpart exits 0 with no "Traceback" and no "Exception ignored".
EXPECTED: Dict[str, Union[Exits, Pytest]] = {
    # testing.md
    "testing/crash.py": Exits(SIGSEGV, stdout="work done\n"),
    "testing/fixed.py": Exits(0, stdout="work done\n"),
    "testing/test_exit_crash.py": Pytest(passed=4),
    # quickstart.md (and index.md): the recommended binding recipe, cffi and ctypes
    "binding/cffi_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "binding/cffi_after.py": Exits(
        0, stdout="work done\n", stderr_has=(NO_LEAKS + " teardown=unload logger=0",)
    ),
    "binding/ctypes_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "binding/ctypes_after.py": Exits(
        0, stdout="work done\n", stderr_has=(NO_LEAKS + " teardown=unload logger=0",)
    ),
    # adapters.md: the lab runtime aborts with a FATAL line naming the broken rule; its leak
    # report (at unload) must show nothing leaked, or only what the program leaks on purpose
    "adapters/cffi_gc_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "adapters/cffi_gc_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    "adapters/cffi_pin_before.py": Exits(SIGSEGV, stdout="work done\n"),
    "adapters/cffi_pin_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    # the callback is called into a finalized interpreter: SIGSEGV mostly, SIGILL / SIGTRAP /
    # SIGBUS when its trampoline was freed with its Python object
    # the logger thread's own late call may crash the process before the runtime's unload
    # writes its report (docs/scenarios.md, S4): the report is checked when it is there
    "adapters/cffi_callback_before.py": Exits(
        CRASHES, stdout="work done\n", report_has=("logger=1",),
        or_exits_with_report=("logger=1",),  # (seen once under CI's load: the late call ran)
    ),
    "adapters/cffi_callback_after.py": Exits(
        0, stdout="work done\n", stderr_has=(NO_LEAKS + " teardown=unload logger=0",)
    ),
    "adapters/ctypes_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "adapters/ctypes_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    "adapters/adopt_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "adapters/adopt_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    "adapters/neutralize_before.py": Exits(
        SIGABRT,
        stdout="['lab-cpu', 'lab-gpu', 'lab-npu']\n",
        stderr_has=("FATAL: runtime used after it was torn down (rt_catalog_release",),
    ),
    "adapters/neutralize_after.py": Exits(
        0,
        stdout="['lab-cpu', 'lab-gpu', 'lab-npu']\n",
        stderr_has=("instances=0 devices=0 buffers=0 catalogs=1 inherited=0 teardown=shutdown",),
    ),
    "adapters/wrapper_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(CHILD,)),
    "adapters/wrapper_after.py": Exits(0, stdout="closed\nwork done\n",
                                       stderr_has=(NO_LEAKS,)),
    # cookbook.md: one pair per pattern, against the lab runtime
    "cookbook/inference_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(
        "FATAL: device #2 released while rt_device_run is running on it",)),
    "cookbook/inference_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    "cookbook/server_before.py": Exits(stdout="work done\n", hangs=3.0,
                                       env={"PYTHONUNBUFFERED": "1"}),
    "cookbook/server_after.py": Exits(0, stdout="work done\n", stderr_has=(NO_LEAKS,)),
    "cookbook/fork_before.py": Exits(SIGABRT, stdout="child sees 0 devices\n", stderr_has=(
        "FATAL: instance #1 was destroyed by another process",)),
    "cookbook/fork_after.py": Exits(
        0, stdout="child sees 0 devices\nparent done\n",
        stderr_has=("forked=1 instances=0 devices=0 buffers=0 catalogs=0 inherited=1",
                    "forked=0 " + NO_LEAKS)),
    "cookbook/render_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(
        "FATAL: device #2 released while rt_device_run is running on it",)),
    "cookbook/render_after.py": Exits(
        0, stdout="work done\nrender thread: device released\n", stderr_has=(NO_LEAKS,)),
    "cookbook/thirdparty_before.py": Exits(SIGABRT, stdout="work done\n", stderr_has=(
        "FATAL: runtime used after it was torn down (rt_instance_release called after",)),
    "cookbook/thirdparty_after.py": Exits(0, stdout="work done\n", stderr_has=(
        "instances=1 devices=0 buffers=0 catalogs=0 inherited=0 teardown=shutdown",)),
    "testing/test_crash_report.py": Pytest(
        failed=1,
        output_has=(
            "NOT CLEAN [crash-at-exit]: 5 of 5 runs failed (100%): SIGSEGV x5",
            "in device_release",
            "in __del__",
        ),
    ),
}


def example_files() -> List[str]:
    return sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.py"))


def _clean_env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    for var in list(env):
        if var.startswith("EXITSAFE_"):
            del env[var]
    env.update(PYTHONFAULTHANDLER="1", PYTHONIOENCODING="utf-8", **extra)
    return env


def test_every_example_file_has_an_expectation() -> None:
    files = set(example_files())
    assert files, f"no example programs under {EXAMPLES}"
    assert files == set(EXPECTED), (
        f"without an expectation: {sorted(files - set(EXPECTED))}; "
        f"expected but missing: {sorted(set(EXPECTED) - files)}"
    )


def test_every_included_file_is_an_example() -> None:
    included = {name for path in doc_files() for b in extract_blocks(path) for name in b.includes}
    assert included <= set(EXPECTED), f"pages include unknown files: {included - set(EXPECTED)}"
    shown = {name for name in EXPECTED if not name.startswith("testing/test_")}
    assert shown <= included, f"example programs no page shows: {sorted(shown - included)}"


def _assert_hangs(
    name: str, expected: Exits, argv: List[str], cwd: Path, env: dict, tmp_path: Path
) -> None:
    """A "before" that hangs: once its work is done (its whole expected stdout printed,
    however long a loaded machine takes to get there, at most ``TIMEOUT``), it is still
    running ``expected.hangs`` seconds later; then it is killed."""
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + TIMEOUT
        while expected.stdout is not None and time.monotonic() < deadline:
            if out_path.read_bytes().decode("utf-8", "replace") == expected.stdout:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        text = out_path.read_bytes().decode("utf-8", "replace")
        if expected.stdout is not None:
            assert text == expected.stdout, f"docs/examples/{name}: stdout {text!r}"
        try:
            proc.wait(timeout=expected.hangs)
        except subprocess.TimeoutExpired:
            return  # still running: it hangs, as its page says
        pytest.fail(f"docs/examples/{name} ended (status {proc.returncode}) within "
                    f"{expected.hangs} s of its work; its page says it hangs\n"
                    f"{err_path.read_text(errors='replace')!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_file(name: str, tmp_path: Path) -> None:
    expected = EXPECTED[name]
    path = EXAMPLES / name
    if isinstance(expected, Pytest):
        argv = [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
                "-p", "no:randomly", "-o", "addopts="]
        cwd = ROOT
        env = _clean_env()
    else:
        argv, cwd, env = [sys.executable, str(path)], tmp_path, _clean_env(**expected.env)
    if isinstance(expected, Exits) and expected.hangs:
        _assert_hangs(name, expected, argv, cwd, env, tmp_path)
        return
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              encoding="utf-8", errors="replace", timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"docs/examples/{name} did not finish within {TIMEOUT} s\n{exc.stderr or ''}")
    report = f"docs/examples/{name}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    if isinstance(expected, Pytest):
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        for count, word in ((expected.passed, "passed"), (expected.failed, "failed")):
            if count:
                assert f"{count} {word}" in summary, report
            else:
                assert f" {word}" not in summary, report
        assert proc.returncode == (1 if expected.failed else 0), report
        for needle in expected.output_has:
            assert needle in proc.stdout, f"{needle!r} not in the output of {report}"
        return
    codes = expected.returncode if isinstance(expected.returncode, tuple) else (
        expected.returncode,)
    if expected.or_exits_with_report and proc.returncode == 0:
        reports = [line for line in proc.stderr.splitlines() if "leak report:" in line]
        assert reports and all(
            needle in reports[-1] for needle in expected.or_exits_with_report
        ), f"exited 0 without the report's evidence of the late call: {report}"
        codes = (*codes, 0)
    if (
        SIGABRT in codes
        and sys.version_info >= (3, 14)
        and proc.returncode == SIGSEGV
        and "Fatal Python error: Aborted" in proc.stderr
    ):
        # From 3.14 faulthandler also dumps the C stack, and that dump can itself crash
        # while it reports the abort (seen on 3.14.10 in the pure-Python run of CI): the
        # process then ends by SIGSEGV after faulthandler reported the abort.
        codes = (*codes, SIGSEGV)
    assert proc.returncode in codes, (
        f"exit status {proc.returncode}, expected {' or '.join(map(str, codes))}: {report}"
    )
    if expected.stdout is not None:
        assert proc.stdout == expected.stdout, report
    for needle in expected.stderr_has:
        assert needle in proc.stderr, f"{needle!r} not on stderr of {report}"
    reports = [line for line in proc.stderr.splitlines() if "leak report:" in line]
    for needle in expected.report_has:
        assert all(needle in line for line in reports), f"{needle!r} not in the report: {report}"
    if codes == (0,):
        for needle in FORBIDDEN:
            assert needle not in proc.stderr, f"{needle!r} on stderr of {report}"


# ------------------------------------------------------------------------------- commands

#: Tools that exist only in the checkout's virtual environment (README set-up): a page shows
#: them as .venv/bin/<tool> (or says to activate the environment first).
VENV_TOOLS = {"python", "pip", "pip3", "exitsafe", "pytest", "mkdocs", "nox", "ruff", "mypy"}
#: Pages whose commands are run by test_commands_of_the_page, in order.
COMMAND_PAGES = ("testing.md", "quickstart.md", "adapters.md", "cookbook.md")


def commands(path: Path) -> List[Tuple[int, str, Optional[List[str]]]]:
    """``(line, command, output)`` for each command a page shows in a shell block; ``output``
    is the lines shown after a ``$ `` prompt, ``None`` for a command shown without one (a
    set-up step such as an install, never run by the tests)."""
    found = []
    for block in extract_blocks(path):
        if block.lang not in ("sh", "bash", "shell", "console", "text", ""):
            continue
        lines = block.code.splitlines()
        prompt = block.lang in ("console", "text", "") or any(x.startswith("$ ") for x in lines)
        for i, line in enumerate(lines):
            if prompt and not line.startswith("$ "):
                continue
            command = line[2:] if prompt else line
            command = command.split(" #")[0].strip()
            if not command or command.startswith("#"):
                continue
            output = []
            for later in lines[i + 1:]:
                if later.startswith("$ "):
                    break
                output.append(later)
            found.append((block.line + 1 + i, command, output if prompt else None))
    return found


def _programs(command: str) -> List[str]:
    words = []
    for part in re.split(r"&&|\|\||;|\|", command):
        tokens = shlex.split(part)
        while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            tokens.pop(0)  # VAR=value before the command
        if tokens:
            words.append(tokens[0])
    return words


def test_commands_use_the_checkout_environment() -> None:
    bad = []
    for path in [*doc_files(), ROOT / "README.md"]:
        for line, command, _ in commands(path):
            for program in _programs(command):
                if program in VENV_TOOLS:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {command}")
    assert not bad, (
        "commands that only work with the virtual environment activated; write "
        ".venv/bin/<tool> (the README's set-up):\n" + "\n".join(bad)
    )


def _normalize(line: str) -> str:
    # an absolute path depends on the machine and the checkout: keep its file name
    line = re.sub(r"(?<![\w.~])/(?:[^/\s\"':()]+/)+", ".../", line)
    line = re.sub(r"0x[0-9a-fA-F]+", "0x?", line)
    line = re.sub(r"(0x\?) \[[^\]]*\]", r"\1", line)  # a thread's name (faulthandler, 3.14+)
    return re.sub(r"\d+(\.\d+)?", "#", line).rstrip()


#: An output line standing for lines the page leaves out (the lines before it are compared).
ELIDED = "..."


@pytest.mark.parametrize("page", COMMAND_PAGES)
def test_commands_of_the_page(page: str) -> None:
    """Each command runs from the checkout's root, as a reader would run it after the README's
    set-up, stdout and stderr merged as on a terminal; its output (numbers and addresses aside)
    is what the page shows, line for line (up to a ``...`` line, when the page shortens it),
    and an ``echo $?`` shown after it gives the status shown."""
    bindir = str(Path(sys.executable).parent)
    shown = commands(DOCS / page)
    assert shown, f"no commands on {page}"
    status = None
    for line, command, output in shown:
        if output is None or "-m pytest" in command:
            continue  # a set-up step; or an example test file, run under EXPECTED
        if command == "echo $?":
            assert output and status is not None, f"{page}:{line}: nothing to echo"
            assert output[0].strip() == str(status), (
                f"{page}:{line}: the page shows exit status {output[0]}, the command gave {status}"
            )
            continue
        real = command.replace(".venv/bin/", bindir + "/")
        env = _clean_env(PYTHONUNBUFFERED="1")
        del env["PYTHONFAULTHANDLER"]  # the reader's environment has no faulthandler
        proc = subprocess.run(["bash", "-c", real], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=TIMEOUT)
        status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        got = [_normalize(x.replace(bindir + "/", ".venv/bin/"))
               for x in proc.stdout.splitlines() if x.strip()]
        want = [_normalize(x) for x in output if x.strip()]
        if ELIDED in want:
            want = want[: want.index(ELIDED)]
            got = got[: len(want)]
        assert got == want, (
            f"{page}:{line}: `{command}`\n--- page\n" + "\n".join(want)
            + "\n--- real\n" + "\n".join(got)
        )


#: Commands shown without their output, on pages not in COMMAND_PAGES, that the tests run
#: (exit status 0 expected). The others (an install, the full benchmark run, the whole test
#: suite, a sanitizer run) are checked by test_commands_name_what_exists only.
RUN_WITHOUT_OUTPUT = (
    ".venv/bin/exitsafe demo --only S3",
    ".venv/bin/exitsafe demo --only S3 --json",
)


def _words(command: str) -> List[str]:
    return [w for part in re.split(r"&&|\|\||;|\|", command) for w in shlex.split(part)]


def test_commands_name_what_exists() -> None:
    """Every command of every page (and the README) names tools of the checkout's environment
    that exist, files of the repository that exist, and modules that can be run."""
    bindir = Path(sys.executable).parent
    missing = []
    for path in [*doc_files(), ROOT / "README.md"]:
        for line, command, _ in commands(path):
            words = _words(command)
            where = f"{path.relative_to(ROOT)}:{line}: {command}"
            for i, word in enumerate(words):
                word = word.split("=", 1)[-1]
                if word.startswith(".venv/bin/"):
                    tool = word[len(".venv/bin/"):]
                    if not (bindir / tool).exists() and tool != "pip":
                        missing.append(f"{where}: no tool {tool!r} in the environment")
                elif re.match(r"^(docs|src|tests|benchmarks)/[\w./-]+$", word):
                    if not (ROOT / word).exists():
                        missing.append(f"{where}: no file {word}")
                elif word == "-m" and i + 1 < len(words):
                    module = words[i + 1]
                    top = ROOT / module.replace(".", "/")
                    if not (top.is_dir() or top.with_suffix(".py").exists()):
                        try:
                            import importlib.util
                            found = importlib.util.find_spec(module) is not None
                        except ImportError:
                            found = False
                        if not found:
                            missing.append(f"{where}: no module {module}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("command", RUN_WITHOUT_OUTPUT)
def test_commands_shown_without_output_run(command: str) -> None:
    pages = [p for p in doc_files() for _, c, _ in commands(p) if c == command]
    assert pages, f"no page shows `{command}` any more: update RUN_WITHOUT_OUTPUT"
    bindir = str(Path(sys.executable).parent)
    proc = subprocess.run(["bash", "-c", command.replace(".venv/bin/", bindir + "/")],
                          cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}\n{proc.stderr}"


# ----------------------------------------------------------------------------- line width

#: The longest code line that fits the text column of the site at 1280 pixels with both
#: sidebars (docs/stylesheets/extra.css sets the code font); longer lines hide behind a
#: horizontal scrollbar.  Program output is exempt: it is shown as printed.
MAX_LINE = 88


def test_code_lines_fit_the_text_column() -> None:
    long_lines = []
    for path in doc_files():
        for block in extract_blocks(path):
            if block.lang not in ("python", "py", "sh", "bash") or block.includes:
                continue
            for i, line in enumerate(block.code.splitlines()):
                if len(line) > MAX_LINE:
                    long_lines.append(f"{block.id.split(':')[0]}:{block.line + 1 + i}: "
                                      f"{len(line)} characters")
    for name in example_files():
        for i, line in enumerate((EXAMPLES / name).read_text(encoding="utf-8").splitlines()):
            if len(line) > MAX_LINE:
                long_lines.append(f"examples/{name}:{i + 1}: {len(line)} characters")
    assert not long_lines, (
        f"code lines wider than the text column ({MAX_LINE} characters):\n"
        + "\n".join(long_lines)
    )


# -------------------------------------------------------------------------------- wording

#: Words of the project's own notes that mean nothing to a reader of the documentation.
JARGON = re.compile(r"\bseeds?\b|\bbars? of the design\b|\bproduct brief\b|\bdesign contract\b",
                    re.IGNORECASE)


def test_no_internal_jargon() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*doc_files(), ROOT / "README.md"]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if JARGON.search(line)
    ]
    assert not found, "internal jargon in the documentation:\n" + "\n".join(found)


# ----------------------------------------------------------------- tables and references

def _table_after(path: Path, heading: str) -> List[List[str]]:
    """The cells of each row (the header row included) of the first table after ``heading``,
    a heading line of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert heading in lines, f"{path.relative_to(ROOT)} has no heading {heading!r}"
    rows: List[List[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
            if "".join(cells).strip("-: "):  # not the |---|---| line
                rows.append(cells)
        elif rows:
            break
    assert rows, f"no table after {heading!r} in {path.relative_to(ROOT)}"
    return rows


def test_the_ledger_table_names_every_outcome() -> None:
    """docs/concepts.md says every handle ends in one of the outcomes of its table: the table
    lists every value of ``exitsafe.Outcome.ALL``, and nothing else."""
    import exitsafe

    rows = _table_after(DOCS / "concepts.md", "## The ledger")
    named = {name for cells in rows for name in re.findall(r"`([a-z_]+)`", cells[0])}
    missing = sorted(set(exitsafe.Outcome.ALL) - named)
    unknown = sorted(named - set(exitsafe.Outcome.ALL))
    assert not missing and not unknown, (
        f"docs/concepts.md, the ledger's table: outcomes missing {missing}; "
        f"not outcomes {unknown}"
    )


#: ``EXITSAFE_*`` variables exitsafe sets for its own processes, never for a user to set:
#: ``exitsafe run`` passes its start-up hook a run directory and the root process's id
#: (``EXITSAFE_RUN_DIR``, ``EXITSAFE_RUN_ROOT``; ``EXITSAFE_RUN`` is their common prefix), and
#: the lab's scenario runner passes the lab runtime the file its leak report goes to and, for
#: the leak-checker scenario S10, the exit status of a run that leaked
#: (``EXITSAFE_LAB_LEAK_REPORT``, ``EXITSAFE_LAB_LEAK_EXITCODE``; it removes both from the
#: caller's environment).
INTERNAL_VARIABLES = frozenset({
    "EXITSAFE_RUN", "EXITSAFE_RUN_DIR", "EXITSAFE_RUN_ROOT",
    "EXITSAFE_LAB_LEAK_REPORT", "EXITSAFE_LAB_LEAK_EXITCODE",
})
_VARIABLE = re.compile(r"EXITSAFE_[A-Z_]+")


def _variables_in_the_source() -> Dict[str, List[str]]:
    """Every ``EXITSAFE_*`` name in the package's code (not its docstrings or comments), with
    the files it is in: each string constant of a module that is exactly such a name (what
    ``os.environ`` lookups and the helpers reading the environment are given), and each
    ``getenv("EXITSAFE_...")`` of the C sources."""
    import ast

    found: Dict[str, List[str]] = {}
    package = ROOT / "src" / "exitsafe"
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and _VARIABLE.fullmatch(node.value)):
                found.setdefault(node.value, []).append(path.relative_to(ROOT).as_posix())
    for path in sorted(package.rglob("*.c")):
        for match in re.finditer(r'getenv\(\s*"(EXITSAFE_[A-Z_]+)"\s*\)',
                                 path.read_text(encoding="utf-8")):
            found.setdefault(match.group(1), []).append(path.relative_to(ROOT).as_posix())
    return found


def test_the_readme_lists_every_environment_variable() -> None:
    """Every ``EXITSAFE_*`` variable exitsafe reads, except those it sets for its own processes,
    has a row in the README's environment table, and each row names a variable it reads."""
    found = _variables_in_the_source()
    assert "EXITSAFE_AT_EXIT" in found, "the scan of src/exitsafe found nothing"
    stale = sorted(INTERNAL_VARIABLES - set(found))
    assert not stale, f"INTERNAL_VARIABLES names variables src/exitsafe no longer uses: {stale}"
    rows = _table_after(ROOT / "README.md", "## Environment")
    listed = {name for cells in rows for name in _VARIABLE.findall(cells[0])}
    missing = sorted(set(found) - INTERNAL_VARIABLES - listed)
    assert not missing, "variables read in src/exitsafe without a row in README.md's table: " + (
        "; ".join(f"{name} ({', '.join(sorted(set(found[name])))})" for name in missing)
    )
    unknown = sorted(listed - set(found))
    assert not unknown, f"README.md's table lists variables exitsafe does not read: {unknown}"


#: ``path.py::name`` (or ``path.py::Class::name``), a path of the repository's tests or of the
#: example tests of docs/examples.
_TEST_REFERENCE = re.compile(r"(?<![\w./-])((?:tests|docs/examples)/[\w./-]+\.py)((?:::\w+)+)")


def _defines(path: Path, names: List[str]) -> bool:
    """Whether ``path`` defines ``names[0]`` at module level (a function or a class), and each
    later name in the class the name before it names."""
    import ast

    body = ast.parse(path.read_text(encoding="utf-8")).body
    for i, name in enumerate(names):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.ClassDef)) and n.name == name), None)
        if node is None:
            return False
        if i < len(names) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True


def test_test_references_name_existing_tests() -> None:
    """Every ``tests/...py::name`` a page or the README names is a file of the repository that
    defines that test."""
    pages = [*doc_files(), *sorted((DOCS / "api").glob("*.md")), ROOT / "README.md"]
    references = [
        (f"{page.relative_to(ROOT)}:{number}", match.group(1), match.group(2)[2:].split("::"))
        for page in pages
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for match in _TEST_REFERENCE.finditer(line)
    ]
    assert any(file.startswith("tests/") for _, file, _ in references), (
        "no tests/...py::name reference found: has the pattern stopped matching?"
    )
    broken = []
    for where, file, names in references:
        path = ROOT / file
        if not path.is_file():
            broken.append(f"{where}: no file {file}")
        elif not _defines(path, names):
            broken.append(f"{where}: {file} defines no {'::'.join(names)}")
    assert not broken, "references to tests that do not exist:\n" + "\n".join(broken)


def test_the_environment_page_lists_exactly_the_variables_read() -> None:
    """docs/environment.md has a row for every ``EXITSAFE_*`` variable the package reads (those
    exitsafe sets for its own processes included, in their own table), and no other."""
    found = set(_variables_in_the_source())
    path = DOCS / "environment.md"
    listed = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            first = re.split(r"(?<!\\)\|", line.strip()[1:-1])[0]
            listed.update(_VARIABLE.findall(first))
    missing = sorted(found - listed)
    unknown = sorted(listed - found)
    assert not missing and not unknown, (
        f"docs/environment.md: variables read in src/exitsafe without a row: {missing}; "
        f"rows for variables exitsafe does not read: {unknown}"
    )


def test_the_glossary_defines_every_outcome() -> None:
    """docs/glossary.md: the outcomes' table lists every value of ``exitsafe.Outcome.ALL``, each
    with the page that explains it."""
    import exitsafe

    rows = _table_after(DOCS / "glossary.md", "## Outcomes")
    named = {name for cells in rows[1:] for name in re.findall(r"`([a-z_]+)`", cells[0])}
    assert named == set(exitsafe.Outcome.ALL), (
        f"docs/glossary.md, Outcomes: missing {sorted(set(exitsafe.Outcome.ALL) - named)}; "
        f"not outcomes {sorted(named - set(exitsafe.Outcome.ALL))}"
    )
    unlinked = [cells[0] for cells in rows[1:] if "](" not in cells[-1]]
    assert not unlinked, f"docs/glossary.md: outcomes without a page: {unlinked}"


def test_the_navigation_follows_the_four_kinds() -> None:
    """mkdocs.yml's nav: the home page, then the tutorial, the how-to guides, the reference and
    the explanation, each page in one of them."""
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (the docs extra)")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ENV", lambda loader, node: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)["nav"]
    sections = [next(iter(entry)) for entry in nav]
    assert sections == ["Home", "Tutorial", "How-to guides", "Reference", "Explanation"]
    assert nav[1]["Tutorial"] == [{"Quick start": "quickstart.md"}]

    def pages(entries: object) -> List[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, list):
            return [p for entry in entries for p in pages(entry)]
        assert isinstance(entries, dict)
        return [p for value in entries.values() for p in pages(value)]

    reference = pages(nav[3]["Reference"])
    assert {"environment.md", "glossary.md", "api/index.md"} <= set(reference)

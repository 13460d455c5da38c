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

A second test builds the site with ``mkdocs build --strict`` when mkdocs is
installed (``pip install -e '.[docs]'``), and is skipped with that reason otherwise.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NO_RUN = "<!-- no-run -->"
CONTINUE = "<!-- continue -->"
FORBIDDEN = ("Exception ignored", "Traceback")
TIMEOUT = 120

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
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", previous))
        i = j + 1
    return blocks


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + sorted((DOCS / "porting").glob("*.md"))


def python_blocks() -> list[Block]:
    found = []
    for path in doc_files():
        root: Block | None = None
        for block in extract_blocks(path):
            if block.lang not in ("python", "py"):
                continue
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


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"mkdocs is not installed ({exc}); pip install -e '.[docs]' to build the site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed\n{proc.stdout}\n{proc.stderr}"

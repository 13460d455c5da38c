"""The hints: one table (``exitsafe.testing._hints.HINTS``), each with a link to its
recipe on the docs site whose anchor exists, and every piece of code it shows runnable as
written.  The audit's suggestions are runnable too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exitsafe.testing import Diagnosis, run
from exitsafe.testing._hints import DOCS_URL, HINTS, docs_url

DOCS = Path(__file__).resolve().parents[2] / "docs"
CODE = re.compile(r"`([^`]+)`")


def _anchors(page: Path) -> set[str]:
    """The ids of a page's headings, as the site's table of contents makes them."""
    # (Python-Markdown's own slugify, as the site uses it: it comes with the docs extra,
    # which the main venv of .ci/run has; the venvs of the other interpreters (nox's
    # sessions, .ci/sid-python) install '.[test]' only)
    toc = pytest.importorskip("markdown.extensions.toc", reason="comes with the docs extra")
    slugify = toc.slugify

    ids = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        explicit = re.search(r"\{#([\w-]+)\}\s*$", line)
        if explicit:
            ids.add(explicit.group(1))
        title = re.sub(r"\s*\{#[\w-]+\}\s*$", "", line.lstrip("#").strip())
        ids.add(slugify(title, "-"))
    return ids


@pytest.mark.parametrize("kind", sorted(HINTS))
def test_each_hint_links_to_an_existing_section(kind: str) -> None:
    _, doc = HINTS[kind]
    page, _, anchor = doc.partition("#")
    assert (DOCS / page).is_file(), f"{kind}: no page docs/{page}"
    assert anchor in _anchors(DOCS / page), f"{kind}: docs/{page} has no section #{anchor}"


def test_links_use_the_configured_site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXITSAFE_DOCS_URL", raising=False)
    assert docs_url("threads.md#workers") == DOCS_URL + "threads/#workers"
    assert docs_url("index.md") == DOCS_URL
    monkeypatch.setenv("EXITSAFE_DOCS_URL", "file:///tmp/site")
    assert docs_url("threads.md#workers") == "file:///tmp/site/threads/#workers"
    diagnosis = Diagnosis("hang-in-atexit", "h", doc="threads.md#the-early-phase")
    assert diagnosis.url == "file:///tmp/site/threads/#the-early-phase"


#: The objects the hints' code names, made fresh for each piece of code.
NAMESPACE = '''
import concurrent.futures, threading
import cffi
import exitsafe, exitsafe.cffi

def make():
    stop_event = threading.Event()

    class Thread(threading.Thread):  # a threading.Thread, and QThread's quit()/wait()
        def quit(self):
            stop_event.set()

        def wait(self):
            self.join(5)

    thread = Thread(target=stop_event.wait, daemon=True)
    thread.start()

    class Writer:
        def write(self, data):
            pass

        def close(self):
            pass

    class Obj:
        def __init__(self):
            self._handle = 1

        def close(self):
            pass

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    lib = ffi.dlopen(None)
    return {
        "exitsafe": exitsafe, "stop_event": stop_event, "thread": thread,
        "writer": Writer(), "obj": Obj(), "handle": exitsafe.track(1, lambda raw: None),
        "executor": concurrent.futures.ThreadPoolExecutor(1), "fn": lambda *args: None,
        "raw": 2, "ffi": ffi, "lib": lib, "ptr": lib.malloc(8),
    }
'''

RUNNER = NAMESPACE + '''
import json, sys
failed = []
for code in json.loads(sys.argv[1]):
    source = code + ("\\n    pass" if code.rstrip().endswith(":") else "")
    try:
        exec(compile(source, "<hint>", "exec"), make())
    except Exception as exc:
        failed.append(f"{code!r}: {type(exc).__name__}: {exc}")
print(json.dumps(failed))
sys.stdout.flush()
exitsafe.exit()  # also a piece of code of the hints: it must end the process, status 0
'''


def _hint_code() -> list[str]:
    found = []
    for text, _ in HINTS.values():
        for code in CODE.findall(text):
            if code not in found and code != "exitsafe.exit()":
                found.append(code)
    return found


def test_every_piece_of_code_in_the_hints_runs(tmp_path: Path) -> None:
    pieces = _hint_code()
    assert "exitsafe.worker(thread, stop=stop_event, uses=[handle])" in pieces
    assert any("exitsafe.exit()" in text for text, _ in HINTS.values())
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(pieces)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout.splitlines()[-1])
    assert not failed, "code in the hints that does not run:\n" + "\n".join(failed)


LATE = textwrap.dedent(
    """
    import ctypes, weakref

    def free_frame(address):
        pass

    class Frame:
        pass

    # before exitsafe is imported: weakref's exit hook then runs after exitsafe's teardown
    frame = Frame()
    finalizer = weakref.finalize(frame, free_frame, 1234)

    import cffi
    import exitsafe

    class Parent:
        def __init__(self):
            self._ptr = ffi.new("int *")

        def __del__(self):
            pass

    class Device:  # a close method, a parent holding a pointer
        def __init__(self, parent):
            self._parent = parent
            self._handle = ctypes.c_void_p(8)

        def close(self):
            pass

        def __del__(self):
            self.close()

    class Session:  # no close method, no pointer attribute named like a handle
        def __init__(self):
            self.handle = 77

        def __del__(self):
            pass

    ffi = cffi.FFI()
    ffi.cdef("void *malloc(size_t); void free(void *);")
    lib = ffi.dlopen(None)
    runtime = exitsafe.track(1, lambda raw: None, kind="runtime")
    parent = Parent()
    device = Device(parent)
    session = Session()
    scratch = ffi.gc(lib.malloc(64), lib.free)
    """
)


def test_every_suggestion_of_the_audit_runs(tmp_path: Path) -> None:
    result = run(LATE, audit=True, cwd=tmp_path)
    findings = {f.type: f for f in result.audit}
    assert {"__main__.Device", "__main__.Parent", "__main__.Session", "cdata 'void *'",
            "finalizer of Frame"} <= set(findings), result.report()
    device = findings["__main__.Device"]
    assert device.suggest == (
        'parent = exitsafe.adopt(obj._parent, close=None);'
        ' exitsafe.adopt(obj, close="close", depends_on=[parent])'
    )
    assert device.alternative == 'exitsafe.lowlevel.neutralize_at_exit(obj, attr="_handle")'
    # each suggestion, run with obj bound to an object of its type
    checks = []
    bind = {
        "__main__.Device": "obj = Device(Parent())",
        "__main__.Parent": "obj = Parent()",
        "__main__.Session": "obj = Session()",
        "cdata 'void *'": "ptr = lib.malloc(8)",
        "finalizer of Frame": "raw = 1234",
    }
    for name, finding in findings.items():
        for code in (finding.suggest, finding.alternative):
            if code:
                checks.append((bind[name], code))
    program = LATE + textwrap.dedent(
        """
        import json, sys
        import exitsafe.cffi
        failed = []
        for setup, code in json.loads(sys.argv[1]):
            space = dict(globals())
            try:
                exec(setup, space)
                exec(code, space)
            except Exception as exc:
                failed.append(f"{code!r}: {type(exc).__name__}: {exc}")
        print(json.dumps(failed))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", program, json.dumps(checks)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    failed = json.loads(proc.stdout.splitlines()[-1])
    assert not failed, "suggestions that do not run:\n" + "\n".join(failed)


def test_a_failure_no_rule_names_links_to_the_kinds_the_diagnosis_knows() -> None:
    from exitsafe.testing import ExitResult
    from exitsafe.testing._hints import UNRECOGNISED_DOC

    page, _, anchor = UNRECOGNISED_DOC.partition("#")
    assert anchor in _anchors(DOCS / page)
    result = ExitResult.from_output(["python", "prog.py"], 4, "", "")
    assert result.diagnosis is None
    assert f"  see: {docs_url(UNRECOGNISED_DOC)}" in result.report().splitlines()
    clean = ExitResult.from_output(["python", "prog.py"], 0, "", "")
    assert "see:" not in clean.report()

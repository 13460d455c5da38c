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

from exitsafe.testing import AuditFinding, Diagnosis, run
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

        def requestInterruption(self):
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
        "raw": 2, "ffi": ffi, "lib": lib, "ptr": lib.malloc(8), "wake_it": stop_event.set,
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


# A program with one late release of each suggestion shape of the audit
# (exitsafe._audit._describe.SUGGESTIONS), run with EXITSAFE_AUDIT_MODULES=latebinding.
LATE = textwrap.dedent(
    """
    import ctypes, os, weakref

    released = []  # what the finalizers' callbacks were called with

    def free_frame(address):
        released.append(("free_frame", address))

    def free_pair(first, second):
        released.append(("free_pair", first, second))

    def free_flags(address, flags=0):
        released.append(("free_flags", address, flags))

    class Pool:
        def give_back(self, address):
            released.append(("give_back", address))

    class Frame: pass
    class PairFrame: pass
    class LambdaFrame: pass
    class FlagsFrame: pass
    class LambdaFlagsFrame: pass
    class PoolFrame: pass
    class FileFrame: pass

    # before exitsafe is imported: weakref's exit hook then runs after exitsafe's teardown
    pool = Pool()
    frame = Frame()
    weakref.finalize(frame, free_frame, 1234)  # track(raw, fn)
    pair = PairFrame()
    weakref.finalize(pair, free_pair, 1, 2)  # two arguments
    gone = LambdaFrame()
    weakref.finalize(gone, lambda address: released.append(("lambda", address)), 3)
    flags = FlagsFrame()
    weakref.finalize(flags, free_flags, 4, flags=5)  # keyword arguments
    flags_gone = LambdaFlagsFrame()
    weakref.finalize(
        flags_gone,
        lambda address, flags=0: released.append(("lambda-flags", address, flags)),
        7,
        flags=8,
    )
    pooled = PoolFrame()
    weakref.finalize(pooled, pool.give_back, 6)  # a bound method
    opened = FileFrame()
    weakref.finalize(opened, os.close, os.open(os.devnull, os.O_RDONLY))  # a built-in

    import cffi
    import exitsafe
    import latebinding

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

    class Connection:  # a close method, a pointer, no parent
        def __init__(self):
            self._ptr = ffi.new("int *")

        def close(self):
            pass

        def __del__(self):
            self.close()

    class Session:  # no close method, an int in an attribute named like a handle
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
    connection = Connection()
    session = Session()
    context = latebinding.Context()
    stream = latebinding.Stream(Parent())
    scratch = ffi.gc(lib.malloc(64), lib.free)
    free_later = lambda p: lib.free(p)  # a destructor with no name
    buffer = ffi.gc(ffi.cast("char *", lib.malloc(32)), free_later)
    """
)

# A binding the audit is told about: its objects' __del__ are recorded, pointer or not.
LATE_BINDING = textwrap.dedent(
    """
    class Context:  # no pointer, no close method
        def __del__(self):
            pass

    class Stream:  # no pointer, no close method, an attribute holding a native object
        def __init__(self, device):
            self._device = device

        def __del__(self):
            pass
    """
)

# Each finding's names, bound as the program has them: obj an object of its type; for a
# weakref.finalize its callback and arguments, the finalizer detached (the suggestion
# replaces it); for an ffi.gc ptr a pointer before ffi.gc and release its destructor.
BIND = {
    "__main__.Connection": "obj = Connection()",
    "__main__.Device": "obj = Device(Parent())",
    "__main__.Parent": "obj = Parent()",
    "__main__.Session": "obj = Session()",
    "latebinding.Context": "obj = latebinding.Context()",
    "latebinding.Stream": "obj = latebinding.Stream(Parent())",
    "cdata 'void *'": "ptr = lib.malloc(8)",
    "cdata 'char *'": 'ptr = ffi.cast("char *", lib.malloc(8)); release = free_later',
}
FINALIZER = (
    "_, callback, args, kwargs = FINALIZERS[{0!r}]; raw = args[0] if len(args) == 1 else None"
)
# What the finalizers' callbacks are called with, once each, when the suggestions that
# replace them run at the teardown (os.close records nothing).
RELEASED = [
    ("free_frame", 1234), ("free_pair", 1, 2), ("lambda", 3), ("free_flags", 4, 5),
    ("lambda-flags", 7, 8), ("give_back", 6),
]
CHECK = textwrap.dedent(
    """
    import json, os, sys, weakref
    import exitsafe.cffi, exitsafe.lowlevel

    # the finalizers the program made, by its object's class, detached
    FINALIZERS = {
        type(fin.peek()[0]).__name__: fin.detach()
        for fin in list(weakref.finalize._registry)  # type: ignore[attr-defined]
        if fin.peek() is not None
    }
    failed = []
    kept = []  # each suggestion's names (a handle it assigns), kept as long as the program
    for setup, code in json.loads(sys.argv[1]):
        space = {k: v for k, v in globals().items() if k not in ("space", "kept")}
        kept.append(space)
        try:
            exec(setup, space)
            exec(code, space)
        except Exception as exc:
            failed.append(f"{code!r}: {type(exc).__name__}: {exc}")
    failed += [f"released before the teardown: {call!r}" for call in released]
    released.clear()
    exitsafe.teardown()  # runs what the suggestions declared (lambdas, close functions)
    failed += [
        f"at teardown: {e.name} {e.outcome}: {e.detail}"
        for e in exitsafe.ledger() if e.outcome not in exitsafe.Outcome.RAN
    ]
    print(json.dumps({"failed": failed, "released": sorted(map(repr, released))}))
    sys.stdout.flush()
    os._exit(0)  # not the program's own late releases: the audit's findings, hazards
    """
)


def _shape(code: str) -> str:
    """The shape (a key of SUGGESTIONS) whose template ``code`` fills in: the most literal
    one when several match (``release`` may be a function's name too)."""
    from exitsafe._audit._describe import SUGGESTIONS

    matches = []
    for shape, template in SUGGESTIONS.items():
        parts = re.split(r"(\{\w+\})", template)
        pattern = "".join(r"[\w.]+" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        if re.fullmatch(pattern, code):
            matches.append((len(parts), shape))
    assert matches, f"{code!r} is no shape of exitsafe._audit._describe.SUGGESTIONS"
    return min(matches)[1]


@pytest.fixture(scope="module")
def late(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[AuditFinding]]:
    """(the directory, the findings of ``LATE`` run with ``exitsafe run --audit``)."""
    where = tmp_path_factory.mktemp("late")
    (where / "latebinding.py").write_text(LATE_BINDING, encoding="utf-8")
    result = run(LATE, audit=True, cwd=where, env={"EXITSAFE_AUDIT_MODULES": "latebinding"})
    return where, result.audit


def test_every_suggestion_shape_is_produced_by_a_program(
    late: tuple[Path, list[AuditFinding]],
) -> None:
    """Each shape of SUGGESTIONS is printed for a late release of ``LATE``: a shape added
    to the table needs a program here, and ``test_every_suggestion_of_the_audit_runs``
    then runs it."""
    from exitsafe._audit._describe import SUGGESTIONS

    _, findings = late
    produced = {
        _shape(code): f.type for f in findings for code in (f.suggest, f.alternative) if code
    }
    missing = sorted(set(SUGGESTIONS) - set(produced))
    assert not missing, f"no program of LATE produces {missing}; produced {produced}"


def test_every_suggestion_is_written_from_the_table() -> None:
    """Every piece of exitsafe code in the audit's source is in SUGGESTIONS: a shape
    written elsewhere would be printed without a test producing and running it."""
    import ast

    import exitsafe._audit
    from exitsafe._audit import _describe

    code = re.compile(r"\bexitsafe\.[\w.]+\(")
    outside = []
    for source in sorted(Path(exitsafe._audit.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        skipped = {  # the docstrings, and the table
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
        }
        if source == Path(_describe.__file__):
            table = next(
                node for node in tree.body if isinstance(node, ast.AnnAssign)
                and getattr(node.target, "id", "") == "SUGGESTIONS"
            )
            skipped |= {id(node) for node in ast.walk(table)}
        outside += [
            f"{source.name}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skipped and code.search(node.value)
        ]
    assert not outside, "exitsafe code written outside SUGGESTIONS:\n" + "\n".join(outside)


def test_every_suggestion_of_the_audit_runs(
    late: tuple[Path, list[AuditFinding]],
) -> None:
    """Each suggestion (and alternative) of each finding of ``LATE`` runs as written, in
    the program, with its names bound as the program has them; then the teardown runs
    what it declared, without a failure, and each finalizer's callback is called with the
    finalizer's arguments."""
    where, findings = late
    by_type = {f.type: f for f in findings}
    device = by_type["__main__.Device"]
    assert device.suggest == (
        'parent = exitsafe.adopt(obj._parent, close=None);'
        ' exitsafe.adopt(obj, close="close", depends_on=[parent])'
    )
    assert device.alternative == 'exitsafe.lowlevel.neutralize_at_exit(obj, attr="_handle")'
    assert by_type["latebinding.Context"].suggest == (
        "exitsafe.adopt(obj, close=type(obj).__del__)"
    )
    assert by_type["finalizer of PairFrame"].suggest == (
        "exitsafe.on_teardown(lambda: free_pair(*args))"
    )
    assert by_type["finalizer of FileFrame"].suggest == (
        "exitsafe.on_teardown(lambda: callback(*args))"  # not close(*args)
    )
    checks = []
    for finding in findings:
        if finding.type.startswith("finalizer of "):
            setup = FINALIZER.format(finding.type[len("finalizer of "):])
        else:
            setup = BIND[finding.type]
        checks += [(setup, code) for code in (finding.suggest, finding.alternative) if code]
    proc = subprocess.run(
        [sys.executable, "-c", LATE + CHECK, json.dumps(checks)],
        capture_output=True, text=True, timeout=120, cwd=where,
    )
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.splitlines()[-1])
    assert not outcome["failed"], "suggestions that do not run:\n" + "\n".join(
        outcome["failed"]
    )
    assert outcome["released"] == sorted(map(repr, RELEASED))


def test_code_name_is_a_name_the_code_reaches() -> None:
    """A finalizer's function is named in a suggestion only when that name reaches it."""
    import ctypes
    import functools
    import os

    from exitsafe._audit._describe import code_name

    def nested() -> None:
        pass

    def names() -> dict[int, str]:
        return {}

    assert code_name(_shape, names) == "_shape"  # a module-level function
    for fn in (nested, lambda: None, functools.partial(_shape), os.close, Path("x").exists,
               ctypes.pythonapi.Py_IncRef):
        assert code_name(fn, names) is None, fn


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


def test_every_hint_is_chosen_by_a_rule() -> None:
    """Each key of HINTS is named in a diagnosis rule (a kind, or the hint of a kind's
    variant): an entry no rule names is never printed."""
    import ast

    import exitsafe.testing

    named: set[str] = set()
    for source in Path(exitsafe.testing.__file__).parent.glob("_rules_*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        named |= {
            node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
    missing = sorted(set(HINTS) - named)
    assert not missing, f"hints no rule chooses: {missing}"


QTHREAD_ABORT = textwrap.dedent(
    """\
    QThread: Destroyed while thread is still running
    Fatal Python error: Aborted

    Thread 0x00007f2159b856c0 (most recent call first):
      File "app.py", line 12 in run

    Current thread 0x00007f215a3c1740 (most recent call first):
      <no Python frame>
    """
)


def test_a_qthread_destroyed_while_running_gets_the_qthread_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exitsafe.testing import ExitResult

    monkeypatch.delenv("EXITSAFE_DOCS_URL", raising=False)
    hint, doc = HINTS["native-fatal-qthread"]
    for stderr in ("QThread: Destroyed while thread is still running\n", QTHREAD_ABORT):
        result = ExitResult.from_output(["python", "app.py"], -6, "", stderr)
        assert result.signal == "SIGABRT"
        diagnosis = result.diagnosis
        assert diagnosis is not None and diagnosis.kind == "native-fatal"
        assert (diagnosis.hint, diagnosis.doc) == (hint, doc)
        report = result.report().splitlines()
        assert report[0].startswith(
            "NOT CLEAN [native-fatal]: a native library aborted on its own check (Qt):"
            " QThread: Destroyed while thread is still running"
        )
        assert f"hint: {hint}" in report
        assert f"  see: {DOCS_URL}threads/#any-kind-of-thread" in report
    other = ExitResult.from_output(["python", "app.py"], -6, "", "FATAL: runtime gone\n")
    assert other.diagnosis is not None and other.diagnosis.hint == HINTS["native-fatal"][0]


def test_a_qthread_destroyed_then_a_crash_is_still_the_qthread_check() -> None:
    """Qt's check ends the process, which may crash on the way (the QThread's Python
    override printing its traceback meanwhile: seen once in CI on CPython 3.10)."""
    from exitsafe.testing import ExitResult

    stderr = textwrap.dedent(
        """\
        QThread: Destroyed while thread 'hasher' is still running
        Fatal Python error: Error calling Python override of QThread::run(): Traceback (most recent call last):
        Thread 0x00007f758ddff6c0 (most recent call first):
          File "/usr/lib/python3.10/tokenize.py", line 323 in read_or_stop
          File "app.py", line 12 in run
        """  # noqa: E501
    )
    result = ExitResult.from_output(["python", "app.py"], -11, "", stderr)
    assert result.signal == "SIGSEGV"
    diagnosis = result.diagnosis
    assert diagnosis is not None and diagnosis.kind == "native-fatal"
    assert diagnosis.hint == HINTS["native-fatal-qthread"][0]

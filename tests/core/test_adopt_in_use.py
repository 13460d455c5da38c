"""adopt() alone never closes an object under another thread still using it at exit.

The exit teardown looks at the other threads' Python stacks before it closes an adopted
object.  A thread of the program's own (its target is the program's code) that refers to
it (a local, a module global its code names, an attribute of a local, a bound method, an
item of a container held so), or, for an object of an installed package, to any object
of that package (a dataset its file made) or runs that package's code, is parked at its
next safe point, as ``quiesce()`` parks it, and then the object is closed.  Any other
thread referring to it (a library's own), and one that does not reach a safe point
within the bound, makes the close wait, bounded, then leak the object ``leaked_in_use``
with the thread named, instead of closing it under that thread.
"""

from __future__ import annotations

import collections
import contextlib
import re
import textwrap
import threading
import types

import pytest

import exitsafe
from exitsafe import _users
from tests.support import assert_clean, run_program

WRITER = """
    import time

    class Writer:
        def __init__(self):
            self.closed = False

        def write(self, frame):
            if self.closed:
                record("write after close")
            time.sleep(0.001)

        def close(self):
            record("closed")
            self.closed = True

    started = threading.Event()
"""


#: The trace line of the teardown parking the thread.
PARKED = re.compile(r"exitsafe: park threads=1 parked=1 running=0 ")


def _entry(run):
    (entry,) = run.ledger()["registries"][0]["entries"]
    return entry


def _assert_parked_then_closed(run, order=("closed",)):
    """Exit 0, closed once (after the thread parked: nothing after the close), and the
    trace's park line."""
    assert_clean(run)
    assert run.order == list(order)
    assert _entry(run)["outcome"] == "released_at_exit"
    assert PARKED.search(run.stderr), run.stderr


def _assert_not_parked_and_leaked(run, thread):
    """Exit 0, never closed, the object leaked naming ``thread``, which the teardown
    found still running at its bound."""
    assert_clean(run)
    assert run.order == []
    entry = _entry(run)
    assert entry["outcome"] == "leaked_in_use"
    assert f"'{thread}'" in entry["detail"]
    assert "exitsafe: park threads=1 parked=0 running=1" in run.stderr


@pytest.mark.parametrize(
    "thread_code",
    [
        # a module global named by the thread's code
        """
        writer = Writer()
        exitsafe.adopt(writer)

        def loop():
            started.set()
            while True:
                writer.write(b"x")
        """,
        # a local variable
        """
        def loop(w=exitsafe.adopt(Writer()).raw):
            started.set()
            while True:
                w.write(b"x")
        """,
        # an attribute of a local (self.writer)
        """
        class Recorder:
            def __init__(self):
                self.writer = exitsafe.adopt(Writer()).raw

            def run(self):
                started.set()
                while True:
                    self.writer.write(b"x")

        loop = Recorder().run
        """,
        # a bound method held in a local
        """
        def loop(write=exitsafe.adopt(Writer()).raw.write):
            started.set()
            while True:
                write(b"x")
        """,
        # an item of a list held in a local
        """
        def loop(writers=[exitsafe.adopt(Writer()).raw, None]):
            started.set()
            while True:
                threading.Event().wait(0.01)  # (between writes, held only by the list)
                writers[0].write(b"x")
        """,
        # a value of a dict held in an attribute of a local
        """
        class Router:
            def __init__(self):
                self.writers = {"gpu0": exitsafe.adopt(Writer()).raw}

            def run(self):
                started.set()
                while True:
                    threading.Event().wait(0.01)  # (between writes, held only by the dict)
                    self.writers["gpu0"].write(b"x")

        loop = Router().run
        """,
        # a value of a dict that is a module global the thread's code names
        """
        WRITERS = {"main": exitsafe.adopt(Writer()).raw}

        def loop():
            started.set()
            while True:
                threading.Event().wait(0.01)  # (between writes, held only by the dict)
                WRITERS["main"].write(b"x")
        """,
        # an attribute two levels down (self.sink.writer)
        """
        class Sink:
            def __init__(self):
                self.writer = exitsafe.adopt(Writer()).raw

        class Recorder:
            def __init__(self):
                self.sink = Sink()

            def run(self):
                started.set()
                while True:
                    threading.Event().wait(0.01)  # (between writes)
                    self.sink.writer.write(b"x")

        loop = Recorder().run
        """,
        # an item of a list inside a list held in a local
        """
        def loop(groups=[[None, exitsafe.adopt(Writer()).raw]]):
            started.set()
            while True:
                threading.Event().wait(0.01)  # (between writes)
                groups[0][1].write(b"x")
        """,
    ],
    ids=[
        "global", "local", "attribute", "bound-method", "list-item", "dict-value",
        "global-dict", "attribute-of-attribute", "nested-list",
    ],
)
def test_a_program_thread_referring_to_the_object_is_parked_then_it_is_closed(
    tmp_path, thread_code
):
    start = """
    threading.Thread(target=loop, daemon=True, name="recorder").start()
    started.wait(30)
    """
    body = "".join(textwrap.dedent(part) for part in (WRITER, thread_code, start))
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    _assert_parked_then_closed(run)  # (no write after the close)


#: An installed package (under a ``site-packages`` directory): a file whose datasets the
#: program's thread writes to, and a loop of the package's own.
VENDOR = """
    class File:
        def __init__(self, record):
            self.record = record
            self.closed = False

        def create_dataset(self):
            return Dataset(self)

        def close(self):
            self.record("closed")
            self.closed = True

    class Dataset:  # made by a File; holds it only inside a list of its own
        def __init__(self, file):
            self._owner = [file]

        def __setitem__(self, index, value):
            if self._owner[0].closed:
                self._owner[0].record("write after close")

    def run_for(obj, started, seconds, done):
        # a thread of the package's own using what it was given for a while, then done
        import time

        started.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            obj.write(b"x")
        done("thread done")

    def run_forever(obj, started):
        # a thread of the package's own, using what it was given
        started.set()
        while True:
            obj.write(b"x")
"""

#: The program's first lines: the package importable from the program's directory.
VENDOR_IMPORT = """
    sys.path.insert(0, os.path.join(os.getcwd(), "site-packages"))
    import vendorlib
"""


def _install_vendor(tmp_path):
    package = tmp_path / "site-packages" / "vendorlib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(VENDOR))


def test_a_derived_object_of_the_same_package_is_a_use_of_the_adopted_one(tmp_path):
    """The h5py pattern: the thread writes to a dataset the adopted file made, and
    refers to nothing that is the file itself."""
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + """
    f = vendorlib.File(record)
    exitsafe.adopt(f, close="close")
    frames = f.create_dataset()
    started = threading.Event()

    def write_forever():
        i = 0
        while True:
            frames[i % 8] = b"x"
            i += 1
            started.set()

    threading.Thread(target=write_forever, daemon=True, name="writer").start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    _assert_parked_then_closed(run)


def test_a_package_thread_referring_to_the_object_keeps_it_from_being_closed(tmp_path):
    """A thread of a package's own is not parked (it runs no code of the program's to
    park at): the close waits, then leaks the object, naming the thread."""
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + WRITER + """
    writer = Writer()
    exitsafe.adopt(writer)
    threading.Thread(
        target=vendorlib.run_forever, args=(writer, started), daemon=True, name="recorder"
    ).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == []  # not closed: no close under the thread, no write after it
    entry = _entry(run)
    assert entry["outcome"] == "leaked_in_use"
    assert "'recorder'" in entry["detail"]
    assert "after 1 s" in entry["detail"]
    assert "leaking it" in run.stderr


def test_a_program_thread_that_does_not_park_within_the_bound_keeps_it_from_being_closed(
    tmp_path,
):
    """Parked only at a safe point: a thread inside a long native call (through ctypes,
    which exitsafe cannot tell from a library's) is not closed under, but waited for;
    the object is leaked when the bound is hit."""
    body = WRITER + """
    import ctypes

    libc = ctypes.CDLL(None)
    writer = Writer()
    exitsafe.adopt(writer)

    def loop():
        while True:
            writer.write(b"x")
            started.set()
            libc.usleep(3_000_000)  # (the bound is 1 s)

    threading.Thread(target=loop, daemon=True, name="recorder").start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    _assert_not_parked_and_leaked(run, "recorder")


def test_a_package_thread_that_lets_go_within_the_bound_lets_the_close_run_after_it(
    tmp_path,
):
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + WRITER + """
    writer = Writer()
    exitsafe.adopt(writer)
    # still writing for a while after the main thread ends, then done
    threading.Thread(
        target=vendorlib.run_for, args=(writer, started, 0.1, record), daemon=True
    ).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["thread done", "closed"]
    assert _entry(run)["outcome"] == "released_at_exit"


def test_a_thread_that_does_not_refer_to_the_object_does_not_delay_its_close(tmp_path):
    body = WRITER + """
    exitsafe.adopt(Writer())

    def loop():
        started.set()
        while True:
            time.sleep(0.001)

    threading.Thread(target=loop, daemon=True).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    assert_clean(run)
    assert run.order == ["closed"]
    assert _entry(run)["outcome"] == "released_at_exit"


def test_threads_quiesced_do_not_count_so_the_object_is_closed(tmp_path):
    body = WRITER + """
    writer = Writer()
    exitsafe.adopt(writer)
    exitsafe.quiesce()

    def loop():
        started.set()
        while True:
            writer.write(b"x")

    threading.Thread(target=loop, daemon=True).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["closed"]  # the thread parked at a call: never writes again
    assert _entry(run)["outcome"] == "released_at_exit"


def test_the_wait_is_half_the_close_timeout_when_that_is_shorter(tmp_path):
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + WRITER + """
    writer = Writer()
    exitsafe.adopt(writer, timeout=0.4)
    threading.Thread(target=vendorlib.run_forever, args=(writer, started), daemon=True).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    entry = _entry(run)
    assert entry["outcome"] == "leaked_in_use"
    assert "after 0.2 s" in entry["detail"]


def test_close_none_only_lets_go_and_is_never_held_back(tmp_path):
    body = WRITER + """
    writer = Writer()
    exitsafe.adopt(writer, close=None)

    def loop():
        started.set()
        while True:
            writer.write(b"x")

    threading.Thread(target=loop, daemon=True).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert _entry(run)["outcome"] == "released_at_exit"


def test_an_explicit_release_while_the_program_runs_is_the_programs_call():
    # Only the exit's teardown looks at other threads: a release the program makes is
    # run at once, whoever refers to the object.
    closed = []

    class Writer:
        def close(self):
            closed.append(True)

    writer = Writer()
    handle = exitsafe.adopt(writer, registry=exitsafe.Registry("explicit-in-use"))
    stop = threading.Event()
    holder = threading.Thread(target=lambda w=writer: stop.wait(30), daemon=True)
    holder.start()
    try:
        handle.release()
    finally:
        stop.set()
        holder.join()
    assert closed == [True]


@contextlib.contextmanager
def _held_by_a_thread(target):
    """A thread named 'holder' whose frame refers to ``target`` until the block ends."""
    ready = threading.Event()
    stop = threading.Event()

    def holding(obj=target):
        ready.set()
        stop.wait(30)

    thread = threading.Thread(target=holding, name="holder", daemon=True)
    thread.start()
    try:
        ready.wait(30)
        yield thread
    finally:
        stop.set()
        thread.join()


def test_users_of_names_the_thread_and_its_own_frame_and_skips_the_caller():
    target = object()
    with _held_by_a_thread(target) as thread:
        local_copy = target  # the calling thread refers to it too, and is not counted
        users = _users.users_of(local_copy)
        assert list(users) == [thread.ident]
        assert "'holder'" in users[thread.ident]
        assert "holding() at" in users[thread.ident]
        assert _users.users_of(object()) == {}
    assert _users.users_of(target) == {}


def test_wait_until_unused_raises_in_use_with_the_threads_after_the_bound():
    target = object()
    with _held_by_a_thread(target):
        with pytest.raises(_users.InUse, match="still used by thread 'holder'"):
            _users.wait_until_unused(target, bound=0.05)
    _users.wait_until_unused(target, bound=0.05)  # gone: returns at once


def test_one_thread_holding_many_objects_costs_one_wait_not_one_per_object(tmp_path):
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + WRITER + """
    class All:  # one object whose write uses three adopted writers
        def __init__(self, *writers):
            self.w1, self.w2, self.w3 = writers

        def write(self, frame):
            self.w1.write(frame)
            self.w2.write(frame)
            self.w3.write(frame)

    w1, w2, w3 = Writer(), Writer(), Writer()
    for w in (w1, w2, w3):
        exitsafe.adopt(w)
    threading.Thread(
        target=vendorlib.run_forever, args=(All(w1, w2, w3), started), daemon=True
    ).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    details = sorted(e["detail"] for e in run.ledger()["registries"][0]["entries"])
    assert [e.split(" after ")[1].split(";")[0] for e in details].count("1 s") == 1
    assert all(e.startswith("still used by thread") for e in details)


def test_exitsafe_own_code_is_told_from_the_program_and_from_the_lab_programs():
    """One test decides, for the quiescing and for the in-use check alike, which code is
    exitsafe's own: its modules (wherever it is installed), never the lab's scenario
    programs, which stand for a user's program."""
    import os
    import sysconfig

    from exitsafe import _stacks, lab

    assert _stacks.is_exitsafe_file(exitsafe.__file__)
    assert _stacks.is_exitsafe_file(_users.__file__)
    scenarios = os.path.join(os.path.dirname(lab.__file__), "scenarios", "anything.py")
    assert not _stacks.is_exitsafe_file(scenarios)
    assert not _stacks.is_exitsafe_file(__file__)
    assert not _stacks.is_exitsafe_file(os.__file__)
    assert not _stacks.is_exitsafe_file(
        os.path.join(sysconfig.get_paths()["purelib"], "exitsafe_other", "x.py")
    )


def test_an_object_leaked_in_use_is_not_neutralized_under_its_thread(tmp_path):
    """``adopt(neutralize=...)`` sets the attribute once exitsafe is done with the object;
    when the object is leaked because a thread still uses it, that write would land
    under the thread (its next call would hand ``None`` to the library): the object is
    left as it is."""
    body = """
    import time

    class Session:
        def __init__(self):
            self._handle = object()

        def run(self):
            if self._handle is None:
                record("neutralized under the thread")
            time.sleep(0.001)

        def close(self):
            record("closed")

    class Sleeper:  # closed last: the thread runs on meanwhile
        def close(self):
            time.sleep(0.3)

    exitsafe.adopt(Sleeper())
    session = Session()
    session.write = lambda frame: session.run()  # (what the package's loop calls)
    exitsafe.adopt(session, neutralize="_handle")
    started = threading.Event()
    threading.Thread(
        target=vendorlib.run_forever, args=(session, started), daemon=True, name="runner"
    ).start()
    started.wait(30)
    """
    _install_vendor(tmp_path)
    run = run_program(VENDOR_IMPORT + body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == []
    outcomes = {e["name"]: e["outcome"] for e in run.ledger()["registries"][0]["entries"]}
    assert outcomes["Session#2"] == "leaked_in_use", outcomes


class _Frame:
    """Stands for a frame in `_users._walk`: its locals, no globals."""

    def __init__(self, *values):
        self.f_locals = {f"v{i}": value for i, value in enumerate(values)}
        self.f_globals = {}
        self.f_code = (lambda: None).__code__  # (no names; the test module's own code)


def test_references_are_followed_by_identity_within_their_limits():
    class Loud:
        def __eq__(self, other):  # never called: items are compared by identity
            raise AssertionError("program code ran")

        __hash__ = object.__hash__

    class Box:
        pass

    def boxed(value, depth):
        for _ in range(depth):
            box = Box()
            box.inner = value
            value = box
        return value

    target, other = Box(), Loud()

    def reach(*roots):
        return _users._walk([_Frame(*roots)], id(target), None) == 0

    assert reach(target)
    assert reach([other, target]) and reach((other, target)) and reach({other, target})
    assert reach({"a": other, "b": target}) and reach({target: 1})  # (values and keys)
    assert not reach([other], {"a": other}, other)
    # subclasses of the built-in containers, and deques, read by the base's own methods
    class Hostile(dict):
        def __iter__(self):
            raise AssertionError("program code ran")

        values = keys = items = __len__ = __iter__

    hostile = Hostile()
    dict.__setitem__(hostile, "w", target)
    assert reach(hostile)
    assert reach(collections.defaultdict(list, w=target))
    assert reach(collections.OrderedDict(w=target)) and reach(collections.deque([target]))
    assert reach(type("L", (list,), {"__getitem__": Hostile.__iter__})([target]))
    assert reach(type("S", (set,), {"__iter__": Hostile.__iter__})({target}))
    beyond = [None] * _users.SCAN_LIMIT + [target]
    assert not reach(beyond)
    assert reach([target, *beyond])
    assert not reach(set(range(_users.SCAN_LIMIT)) | {target})
    # attributes and containers, nested, up to DEPTH steps from the frame
    assert reach(boxed(target, _users.DEPTH))
    assert not reach(boxed(target, _users.DEPTH + 1))
    assert reach([[[target]]]) and not reach([[[[target]]]])
    assert reach(boxed([target], _users.DEPTH - 1))
    # a bound method of the object, or of an object holding it
    assert reach(types.MethodType(lambda self: None, target))
    assert reach([types.MethodType(lambda self: None, boxed(target, 1))])
    # nearest first, at most WALK_LIMIT values: past the limit, farther steps are not taken
    wide = [[Box() for _ in range(64)] for _ in range(_users.WALK_LIMIT // 64 + 1)]
    assert not reach(wide, [[[target]]])
    assert reach(wide, [[target]]) and reach([[target]], wide) and reach(target, wide)
    assert reach([[[target]]], [[Box() for _ in range(64)] for _ in range(8)])


def test_a_thread_reaches_an_object_through_its_outermost_frame_first():
    target = object()
    assert _users._walk([_Frame([target]), _Frame(target)], id(target), None) == 0
    # far from the outer frame (beyond DEPTH) and near the inner one: the inner's
    far = [[[[target]]]]
    assert _users._walk([_Frame(far), _Frame(far[0][0])], id(target), None) == 1
    assert _users._walk([_Frame(far), _Frame([])], id(target), None) is None


def test_a_program_thread_reaches_any_object_of_the_package():
    # the package of a type: its module's top-level name, when installed (site-packages)
    import pytest as package_object_source

    library = _users._library_of_type(type(package_object_source.mark))
    assert library == "_pytest"
    class Holder:  # (a class of the program's: its attributes are walked)
        def __init__(self):
            self.inner = [package_object_source.mark]

    frames = [_Frame(), _Frame(Holder())]
    assert _users._walk(frames, id(object()), library) == 1
    assert _users._walk(frames, id(object()), None) is None  # (identity only: no)


def test_a_thread_is_never_parked_holding_a_lock_the_close_takes(tmp_path):
    """A wrapper of the program's that takes its own lock in ``write`` and in ``close``:
    the thread sleeps inside ``write`` holding the lock when the teardown parks it.  Were
    it parked there (as the sleep returns), the close would wait for the lock for ever;
    it parks at its next call outside the lock instead, and the close runs after it."""
    body = """
    import time

    class Recorder:
        def __init__(self):
            self._lock = threading.Lock()

        def write(self, row):
            with self._lock:
                time.sleep(0.01)

        def close(self):
            with self._lock:
                record("closed")

    recorder = Recorder()
    exitsafe.adopt(recorder)

    def loop():
        while True:
            recorder.write(1)

    threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.05)
    """
    run = run_program(body, tmp_path, ledger=True, timeout=30)
    assert_clean(run)
    assert run.order == ["closed"]
    assert _entry(run)["outcome"] == "released_at_exit"


def test_a_thread_that_always_holds_a_lock_is_not_parked_and_the_object_leaks(tmp_path):
    """Never outside the lock (an ``RLock`` held around the whole loop): the thread is
    still running at the bound, and the object is leaked rather than closed under it (and
    rather than a close that would wait for the lock for ever)."""
    body = WRITER + """
    lock = threading.RLock()
    writer = Writer()
    exitsafe.adopt(writer)

    def loop():
        with lock:
            started.set()
            while True:
                writer.write(b"x")

    threading.Thread(target=loop, daemon=True, name="recorder").start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    _assert_not_parked_and_leaked(run, "recorder")


def test_a_thread_the_teardown_parks_must_be_parked_not_only_idle(tmp_path):
    """The thread is inside a standard-library call that takes a while but does not block
    (hashing), which ``quiesce()`` takes for idle; its next step reaches the package
    through no call (a subscript), where it cannot park.  The teardown waits until it has
    parked (as the hash returns), so the dataset is never written after the close."""
    _install_vendor(tmp_path)
    body = VENDOR_IMPORT + """
    import hashlib

    f = vendorlib.File(record)
    exitsafe.adopt(f, close="close")
    frames = f.create_dataset()
    data = b"x" * 20_000_000
    started = threading.Event()

    def write_forever():
        while True:
            started.set()
            digest = hashlib.sha256(data).digest()  # (tens of ms in C, not a wait)
            frames[0] = digest

    threading.Thread(target=write_forever, daemon=True, name="writer").start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    _assert_parked_then_closed(run)


def test_a_thread_blocked_for_good_is_not_parked_and_the_object_leaks(tmp_path):
    """Idle is not parked: a thread blocked in ``queue.get()`` with the writer in a local
    may wake and write at any time; it is still running at the bound, and the writer is
    leaked rather than closed under it."""
    body = WRITER + """
    import queue

    jobs = queue.Queue()

    def serve(w=exitsafe.adopt(Writer()).raw):
        started.set()
        while True:
            w.write(jobs.get())

    threading.Thread(target=serve, daemon=True, name="server").start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"}, timeout=30)
    _assert_not_parked_and_leaked(run, "server")


def test_a_thread_is_never_parked_inside_a_method_of_the_object(tmp_path):
    """The object's class is the program's own: its ``write`` calls (``time.sleep``,
    standing for native calls) are safe points of the program's code, but a close there
    would find the write half done.  The thread parks between two writes."""
    body = """
    import time

    class Writer:
        def __init__(self):
            self.writing = False

        def write(self, frame):
            self.writing = True
            for _ in range(20):
                time.sleep(0.001)
            self.writing = False

        def close(self):
            record("closed under a write" if self.writing else "closed between writes")

    writer = exitsafe.adopt(Writer()).raw
    started = threading.Event()

    def loop():
        while True:
            writer.write(b"x")
            started.set()

    threading.Thread(target=loop, daemon=True).start()
    started.wait(30)
    """
    run = run_program(body, tmp_path, ledger=True, env={"EXITSAFE_TRACE": "1"})
    _assert_parked_then_closed(run, ["closed between writes"])


def test_the_main_thread_is_never_one_to_park():
    """A teardown run off the main thread (a signal watcher's) finds the main thread using
    the object: it is waited for, never parked (it would stop the program's own flow)."""
    target = object()
    found = {}
    looker = threading.Thread(target=lambda: found.update(_users._find_users(target)))
    looker.start()
    looker.join()
    main = threading.main_thread().ident
    assert main in found and found[main][1] is False
    assert target is not None  # (the main thread's frame refers to it until here)


def test_reading_the_stacks_runs_no_code_of_the_program(tmp_path):
    """Another thread holds an object whose metaclass has a ``__getattribute__`` (it would
    run for ``type(obj).__mro__``) and a dict of the program's own with a hostile
    ``__iter__``: the check reads neither through the program's code, and the adopted
    object, which that thread does not use, is closed."""
    body = WRITER + """
    import time

    class Meta(type):
        def __getattribute__(cls, name, _record=record):
            if name in ("__mro__", "__dict__"):
                _record(f"program code ran: {name}")
            return super().__getattribute__(name)

    class Config(metaclass=Meta):
        def __init__(self):
            self.x = 1

    class Table(dict):
        def __iter__(self, _record=record):
            _record("program code ran: __iter__")
            return iter(())

    exitsafe.adopt(Writer())

    def hold():
        cfg, table = Config(), Table(a=1)
        started.set()
        threading.Event().wait()

    thread = threading.Thread(target=hold, daemon=True, name="holder")
    thread.start()
    started.wait(30)
    while "wait" not in sys._current_frames()[thread.ident].f_code.co_name:
        time.sleep(0.001)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == ["closed"], run.describe()


@pytest.mark.skipif(_users._threads.schedstat(threading.get_ident()) is None,
                    reason="no scheduler statistics here (Linux's schedstat)")
def test_a_thread_is_walked_again_only_once_it_ran():
    import sys
    import time

    wake, waiting, stop = threading.Event(), threading.Event(), threading.Event()

    def loop():
        while not stop.is_set():
            waiting.set()
            wake.wait()
            wake.clear()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def stack():
        waiting.wait()
        while "wait" not in sys._current_frames()[thread.ident].f_code.co_name:
            time.sleep(0.001)
        # its frame says "wait" before it blocks in the lock: until it does, it still runs
        # (a loaded machine: walked again, once in CI); blocked, it is asleep and its
        # statistics stay as they are
        before = _users._threads.schedstat(thread.ident)
        while True:
            time.sleep(0.02)
            now = _users._threads.schedstat(thread.ident)
            if now == before and _users._threads.state(thread.ident) == "S":
                break
            before = now
        frames, frame = [], sys._current_frames()[thread.ident]
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        return frames[::-1]

    try:
        first = _users._reach_of(thread.ident, stack())
        assert _users._reach_of(thread.ident, stack()) is first, "idle: not walked again"
        waiting.clear()
        wake.set()  # it runs once round its loop, and waits again at the same place
        time.sleep(0.01)
        assert _users._reach_of(thread.ident, stack()) is not first, "it ran: walked again"
    finally:
        stop.set()
        wake.set()
        thread.join()

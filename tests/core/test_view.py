"""Handle.borrowing(): a view of the handle's object whose every use borrows the handle."""

from __future__ import annotations

import threading

import pytest

import exitsafe
from exitsafe import HandleClosedError

from ..support import assert_clean, run_program


class Dataset:
    """An object derived from a File (same module: comes back as a view)."""

    def __init__(self, owner):  # type: ignore[no-untyped-def]
        self.owner = owner
        self.rows = {}

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        self.owner.seen.append(("setitem", self.owner.handle.borrowed))
        self.rows[key] = value

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        self.owner.seen.append(("getitem", self.owner.handle.borrowed))
        return self.rows[key]


class File:
    def __init__(self):  # type: ignore[no-untyped-def]
        self.seen = []
        self.handle = None
        self.datasets = {"frames": Dataset(self)}
        self.mode = "w"

    def write(self, data):  # type: ignore[no-untyped-def]
        self.seen.append(("write", self.handle.borrowed))
        return len(data)

    def __getitem__(self, name):  # type: ignore[no-untyped-def]
        self.seen.append(("getitem", self.handle.borrowed))
        return self.datasets[name]

    def __len__(self):  # type: ignore[no-untyped-def]
        self.seen.append(("len", self.handle.borrowed))
        return len(self.datasets)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.datasets)

    def __enter__(self):  # type: ignore[no-untyped-def]
        self.seen.append(("enter", self.handle.borrowed))
        return self

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        self.seen.append(("exit", self.handle.borrowed))
        return False

    def close(self):  # type: ignore[no-untyped-def]
        self.seen.append(("close", self.handle.borrowed))


@pytest.fixture
def adopted():  # type: ignore[no-untyped-def]
    reg = exitsafe.Registry("view")
    f = File()
    f.handle = reg.adopt(f) if hasattr(reg, "adopt") else exitsafe.adopt(f, registry=reg)
    yield f
    reg.teardown()


def test_every_use_through_the_view_borrows_the_handle(adopted):
    f = adopted
    view = f.handle.borrowing()
    assert view.write(b"abc") == 3
    assert len(view) == 1
    assert list(view) == ["frames"]
    assert view.mode == "w"  # an attribute: read under the borrow, returned as it is
    view.mode = "r"
    assert f.mode == "r"
    with view as same:
        assert same is view  # a method returning its own object returns the view
    # (list() asks len() too, for a size hint)
    assert {name for name, _ in f.seen} == {"write", "len", "enter", "exit"}
    assert all(borrowed for _, borrowed in f.seen)
    assert not f.handle.borrowed


def test_a_result_of_the_same_library_is_a_view_borrowing_the_same_handle(adopted):
    f = adopted
    view = f.handle.borrowing()
    view["frames"][3] = "row"  # both steps borrowed: the Dataset comes back as a view
    assert view["frames"][3] == "row"
    assert f.seen == [("getitem", True), ("setitem", True), ("getitem", True), ("getitem", True)]
    assert isinstance(f.datasets["frames"].rows[3], str)  # other results: as they are


def test_a_release_waits_for_the_call_in_flight_through_the_view(adopted):
    f = adopted
    inside, go = threading.Event(), threading.Event()
    order = []

    def slow_write(data):  # type: ignore[no-untyped-def]
        inside.set()
        go.wait(30)
        order.append("write ended")

    f.write = slow_write
    f.close = lambda: order.append("closed")
    view = f.handle.borrowing()
    t = threading.Thread(target=view.write, args=(b"x",))
    t.start()
    inside.wait(30)
    f.handle.release()  # the last owner lets go: the close waits for the borrow to end
    assert order == []
    go.set()
    t.join(30)
    assert order == ["write ended", "closed"]
    with pytest.raises(HandleClosedError):
        view.write(b"late")


def test_the_view_says_what_it_stands_for(adopted):
    view = adopted.handle.borrowing()
    assert repr(view).startswith("<exitsafe borrowing view of its object, <exitsafe.Handle")
    assert "borrowing call" in repr(view.write)


ADOPTED_WRITER_USED_BY_A_DAEMON_THREAD = """
    import time

    class Writer:  # a third-party writer: close() under a write in flight corrupts it
        def __init__(self):
            self.writing = False
            self.closed = False

        def write(self, frame):
            if self.closed:
                record("write after close")
            self.writing = True
            started.set()
            end = time.monotonic() + 1  # (native code, the GIL released: 1 s, or until closed)
            while not self.closed and time.monotonic() < end:
                time.sleep(0.001)
            self.writing = False

        def close(self):
            record("closed under a write" if self.writing else "closed between writes")
            self.closed = True

    started = threading.Event()
    writer = exitsafe.adopt(Writer(), close="close").borrowing()  # the one line

    def record_frames():  # the thread's own code, unchanged: it calls writer.write
        while True:
            writer.write(b"frame")

    threading.Thread(target=record_frames, daemon=True).start()
    started.wait(30)
"""


@pytest.mark.parametrize("borrowing", [True, False])
def test_at_exit_the_close_waits_for_the_write_and_the_writer_is_parked(tmp_path, borrowing):
    # With .borrowing() the close waits for the write, then the thread parks at its next
    # call: the writer's own code is not changed.  adopt() alone does not know about the
    # write, but sees that the thread's code refers to the writer: it parks the thread,
    # never inside one of the writer's methods (a write longer than the bound here), so
    # it never closes it under that thread, and leaks it, saying which thread and where.
    body = ADOPTED_WRITER_USED_BY_A_DAEMON_THREAD
    if not borrowing:
        body = body.replace('close="close").borrowing()', 'close="close").raw')
        body = body.replace("time.monotonic() + 1  #", "time.monotonic() + 5  #")
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    registry = run.ledger()["registries"][0]
    if borrowing:
        assert run.order == ["closed between writes"]
        assert registry["parked_threads"] == 1
    else:
        assert run.order == []  # never closed under the write, nor after it
        (entry,) = registry["entries"]
        assert entry["outcome"] == "leaked_in_use"
        assert "record_frames() at" in entry["detail"]
        assert "handle.borrowing()" in entry["detail"]

"""Classes 8 and 9: the ledger file and the documented contracts.

``EXITSAFE_LEDGER`` is written only to a regular file (a symbolic link is followed):
a device node, a FIFO or a directory gets one clear error and nothing is replaced, and
no temporary file is left behind.  Two writes at once (the exit teardown, and
exitsafe.exit() on another thread) each go through a temporary file of their own.
Exit policies read a snapshot of the handle in which ``raw`` and the rest are
readable; the finalization of handles that already ended is not a late request.
"""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from exitsafe import _exit, _ledger

from ..support import assert_clean, run_program

BODY = """
    import logging
    logging.basicConfig()
    h = exitsafe.track("h", record, name="h")
"""


def ledger_to(tmp_path, target):
    return run_program(BODY, tmp_path, env={"EXITSAFE_LEDGER": str(target)})


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_is_neither_replaced_nor_opened(tmp_path):
    fifo = tmp_path / "ledger.fifo"
    os.mkfifo(fifo)
    run = ledger_to(tmp_path, fifo)  # opening a FIFO with no reader would block: a hang
    assert run.returncode == 0 and run.order == ["h"], run.describe()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert run.stderr.count("not a regular file") == 1, run.describe()
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="creating a device node needs root"
)
def test_device_node_is_not_replaced(tmp_path):
    device = tmp_path / "null"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    run = ledger_to(tmp_path, device)
    assert run.returncode == 0, run.describe()
    assert stat.S_ISCHR(os.stat(device).st_mode), "the device node was replaced"
    assert run.stderr.count("not a regular file") == 1, run.describe()
    assert leftovers(tmp_path) == []


def test_symlink_is_followed_to_its_target(tmp_path):
    target = tmp_path / "real-ledger.json"
    link = tmp_path / "ledger.json"
    link.symlink_to(target)
    run = ledger_to(tmp_path, link)
    assert_clean(run)
    assert link.is_symlink() and os.readlink(link) == str(target)
    data = json.loads(target.read_text())
    assert data["registries"][0]["entries"][0]["outcome"] == "released_at_exit"
    assert leftovers(tmp_path) == []


def test_directory_is_refused_without_leaving_a_temporary_file(tmp_path):
    directory = tmp_path / "a-directory"
    directory.mkdir()
    run = ledger_to(tmp_path, directory)
    assert run.returncode == 0, run.describe()
    assert run.stderr.count("it is a directory") == 1, run.describe()
    assert list(directory.iterdir()) == [] and leftovers(tmp_path) == []


def test_exit_policy_reads_a_snapshot_of_the_handle(tmp_path):
    body = """
        def policy(info):
            record(f"raw={info.raw}")
            record(f"kind={info.kind},name={info.name},owners={info.owners}")
            record(f"main={info.created_on_main_thread},inherited={info.inherited}")
            record(f"thread={info.thread_id == threading.main_thread().ident}")
            return "leak" if info.raw == "keep-me" else "release"

        a = exitsafe.track("keep-me", record, kind="device", name="a", exit_policy=policy)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert_clean(run)
    assert run.order == [
        "raw=keep-me",
        "kind=device,name=a,owners=1",
        "main=True,inherited=False",
        "thread=True",
    ]
    assert run.outcomes() == {"a": "leaked_policy"}


def test_finalizing_handles_that_already_ended_is_not_a_late_request(tmp_path):
    body = """
        handles = [exitsafe.track(i, record) for i in range(1000)]
        # module globals: finalized during interpreter shutdown, after the teardown
    """
    run = run_program(body, tmp_path, env={"EXITSAFE_TRACE": "1"}, ledger=True)
    assert_clean(run)
    assert len(run.order) == 1000
    assert "late-release" not in run.stderr
    assert run.ledger()["registries"][0]["late_requests"] == 0


def test_exit_policy_answer_that_cannot_be_compared_is_a_bad_answer(tmp_path):
    body = """
        import enum

        class ArrayLike:  # answers == with an error, as numpy arrays and pandas objects do
            def __eq__(self, other):
                raise ValueError("the truth value of an array is ambiguous")

            __hash__ = None

        class Verdict(str, enum.Enum):
            RELEASE = "release"

        a = exitsafe.track("a", record, name="a", exit_policy=lambda info: ArrayLike())
        b = exitsafe.track("b", record, name="b", exit_policy=lambda info: Verdict.RELEASE)
    """
    run = run_program(body, tmp_path, ledger=True)
    assert not run.hung and run.returncode == 0, run.describe()
    assert run.order == ["b"], "the release function of 'a' never ran"
    assert run.outcomes() == {"a": "leaked_policy", "b": "released_at_exit"}
    assert "exit policy for handle 'a' returned <" in run.stderr
    assert "failed" not in run.stderr
    entry = next(e for e in run.ledger()["registries"][0]["entries"] if e["name"] == "a")
    assert entry["detail"].startswith("exit policy returned <")


def test_two_ledger_writes_at_once_never_collide(tmp_path, monkeypatch, caplog):
    # Both writers are held inside their write, each with its temporary file open, until
    # the other got there too: with one temporary name per process, the second could not
    # even create it (and a writer's clean-up could delete the other's file).
    target = tmp_path / "ledger.json"
    both_writing = threading.Barrier(2, timeout=30)
    real_write = _ledger.write_json

    def write_when_both_write(*args, **kwargs):
        both_writing.wait()
        return real_write(*args, **kwargs)

    monkeypatch.setattr(_ledger, "write_json", write_when_both_write)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            _exit.write_ledger(str(target))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    with caplog.at_level("ERROR", logger="exitsafe"):
        writers = [threading.Thread(target=write) for _ in range(2)]
        for t in writers:
            t.start()
        for t in writers:
            t.join(60)
    assert not any(t.is_alive() for t in writers)
    assert errors == [] and caplog.records == [], (errors, caplog.text)
    data = json.loads(target.read_text())
    assert data["pid"] == os.getpid() and isinstance(data["registries"], list)
    assert leftovers(tmp_path) == []


def test_a_failed_ledger_write_leaves_no_temporary_file(tmp_path, monkeypatch, caplog):
    target = tmp_path / "ledger.json"
    target.write_text("previous")

    def refuse(src, dst):
        raise PermissionError(13, "refused", dst)

    monkeypatch.setattr(_exit.os, "replace", refuse)
    with caplog.at_level("ERROR", logger="exitsafe"):
        _exit.write_ledger(str(target))
    assert "could not write the ledger" in caplog.text
    assert target.read_text() == "previous"
    assert leftovers(tmp_path) == []


def test_a_temporary_name_in_use_is_skipped(tmp_path, monkeypatch):
    # A name left by a writer that was killed (or taken by another) is never reused.
    target = str(tmp_path / "ledger.json")
    tokens = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6])
    monkeypatch.setattr(_exit.os, "urandom", lambda n: next(tokens))
    fd, first = _exit._new_temporary(target)
    os.close(fd)
    fd, second = _exit._new_temporary(target)
    os.close(fd)
    assert first != second and os.path.exists(first) and os.path.exists(second)

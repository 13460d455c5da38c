"""What records a release as it begins: one ``audit-release`` line for the first release of
each group, ``audit-repeat`` lines counting the others, and the release in progress in
``audit-<pid>.state`` (16 bytes), so that a finalizer the process hung or crashed in is
named."""

from __future__ import annotations

import os

from ._emit import emit
from ._state import state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Size of the file that holds the release in progress (``audit-<pid>.state``).
STATE_SIZE = 16


class Group:
    """Releases of one kind, type and creation site: reported once, then counted."""

    __slots__ = ("begin", "count", "fields", "gid")

    def __init__(self, gid: int, fields: dict[str, Any]) -> None:
        self.gid = gid
        self.fields = fields
        self.count = 0
        self.begin = (b"%-15d" % gid)[:15] + b"R"


class Sink:
    """What records a release: the only part of the audit kept alive to the very end
    (`keep_forever`), so it holds nothing of the program: no module dictionary,
    no function of the program, only strings, weak references and builtins."""

    def __init__(self, names: dict[int, str], unknown: str) -> None:
        import _thread

        self.unknown = unknown
        self.state = state
        self.names = names
        self.get_ident = _thread.get_ident
        #: id(weak reference) -> the reference, and its group: one per ffi.gc pointer
        self.refs: dict[int, Any] = {}
        self.groups_of: dict[int, Group] = {}
        self.slot = _open_slot()

    def begin(self, group: Group) -> None:
        """A release of ``group`` begins (written before the finalizer runs)."""
        group.count += 1
        count = group.count
        slot = self.slot
        if slot is not None:
            slot[0:STATE_SIZE] = group.begin
        if count & (count - 1) == 0:  # 1, 2, 4 ...
            self.report(group, count)

    def report(self, group: Group, count: int) -> None:
        """The first release of ``group`` (all its fields), then how many so far."""
        if count == 1:
            self.state.seq += 1
            fields = group.fields
            emit(
                "audit-release",
                seq=self.state.seq,
                group=group.gid,
                what=fields["what"],
                type=fields["type"],
                site=fields["site"] or self.unknown,
                stack=fields["stack"],
                holds=fields["holds"],
                via=fields["via"],
                thread=self.names.get(self.get_ident(), "a thread started late"),
                suggest=fields["suggest"],
                alternative=fields["alternative"],
            )
        else:  # 2, 4, 8 ...: how many, without a line each
            emit("audit-repeat", group=group.gid, count=count)

    def done(self, group: Group) -> None:
        """The release of ``group`` that began last has returned."""
        slot = self.slot
        if slot is not None:
            slot[STATE_SIZE - 1 : STATE_SIZE] = b"D"

    def gc_released(self, ref: Any) -> None:
        """The weak reference on an ``ffi.gc`` pointer died: its destructor runs next
        (cffi clears the weak references first); its end cannot be seen."""
        try:
            key = id(ref)
            group = self.groups_of.pop(key, None)
            if group is not None:  # begin(), inlined: there may be millions of them
                group.count += 1
                count = group.count
                slot = self.slot
                if slot is not None:
                    slot[0:STATE_SIZE] = group.begin
                if count & (count - 1) == 0:
                    self.report(group, count)
            del self.refs[key]
        except BaseException:
            pass


def _open_slot() -> Any:
    """A writable 16-byte map of ``audit-<pid>.state`` in exitsafe run's directory, or
    ``None``: the release in progress, for the runner to read after the process ended."""
    run_dir = os.environ.get("EXITSAFE_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return None
    try:
        import mmap

        path = os.path.join(run_dir, f"audit-{os.getpid()}.state")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b" " * STATE_SIZE)
            return mmap.mmap(fd, STATE_SIZE)
        finally:
            os.close(fd)
    except Exception:
        return None

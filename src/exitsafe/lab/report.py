"""The lab runtime's leak report, as data.

When the runtime library is unloaded, or the process exits, its destructor
writes one line (to stderr, or appended to the file named by
``EXITSAFE_LAB_LEAK_REPORT``), shown wrapped here::

    exitsafe-lab leak report: pid=4242 forked=0 instances=0 devices=1 buffers=0
    catalogs=0 inherited=0 teardown=unload logger=0

After the fixed prefix come ``key=value`` pairs separated by single spaces;
integers are decimal.  Keys (stable; new keys may be appended):

``pid``        the process writing the report.
``forked``     1 when that process is a fork child of the one that loaded the library.
``instances``, ``devices``, ``buffers``, ``catalogs``
               objects of each kind created by *this* process and never released.
``inherited``  objects inherited from the parent at ``fork()`` and not released here
               (never a leak of this process).
``teardown``   ``shutdown`` when ``rt_shutdown()`` tore the runtime down before the
               unload, else ``unload``.
``logger``     1 when a logger callback was still registered at unload.

`parse_leak_reports` extracts every report from a text (stderr, or the
report file, which collects one line per process that loaded the runtime).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

__all__ = ["PREFIX", "LeakReport", "parse_leak_reports", "read_leak_reports"]

PREFIX = "exitsafe-lab leak report:"
_LINE = re.compile(r"^exitsafe-lab leak report:((?: [a-z_]+=\S+)+)\s*$", re.MULTILINE)
_KINDS = ("instances", "devices", "buffers", "catalogs")


@dataclass(frozen=True)
class LeakReport:
    """One leak report line."""

    pid: int
    forked: bool
    instances: int
    devices: int
    buffers: int
    catalogs: int
    inherited: int
    teardown: str
    logger: bool
    fields: Dict[str, str]

    @property
    def leaks(self) -> Dict[str, int]:
        """Leaked objects by kind (only kinds with a non-zero count)."""
        counts = {kind: getattr(self, kind) for kind in _KINDS}
        return {kind: n for kind, n in counts.items() if n}

    @property
    def total(self) -> int:
        """Objects this process created and never released."""
        return self.instances + self.devices + self.buffers + self.catalogs

    def summary(self) -> str:
        """``"no leaks"`` or e.g. ``"leaked devices=1 instances=1"`` (plus inherited)."""
        parts = [f"{kind}={n}" for kind, n in self.leaks.items()]
        text = "leaked " + " ".join(parts) if parts else "no leaks"
        if self.inherited:
            text += f" (inherited={self.inherited})"
        return text


def _parse_line(pairs: str) -> LeakReport:
    fields: Dict[str, str] = {}
    for item in pairs.split():
        key, _, value = item.partition("=")
        fields[key] = value

    def number(key: str) -> int:
        try:
            return int(fields.get(key, "0"))
        except ValueError:
            return 0

    return LeakReport(
        pid=number("pid"),
        forked=fields.get("forked") == "1",
        instances=number("instances"),
        devices=number("devices"),
        buffers=number("buffers"),
        catalogs=number("catalogs"),
        inherited=number("inherited"),
        teardown=fields.get("teardown", ""),
        logger=fields.get("logger") == "1",
        fields=fields,
    )


def parse_leak_reports(text: str) -> List[LeakReport]:
    """Every leak report line in ``text``, in order."""
    return [_parse_line(m.group(1)) for m in _LINE.finditer(text)]


def read_leak_reports(path: Union[str, Path]) -> List[LeakReport]:
    """The reports in the file at ``path`` (an empty list when it does not exist)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return parse_leak_reports(text)


def main_report(reports: List[LeakReport], pid: Optional[int] = None) -> Optional[LeakReport]:
    """The report of the main process: ``pid`` when given, else the first non-forked one."""
    for report in reports:
        if pid is not None and report.pid == pid:
            return report
        if pid is None and not report.forked:
            return report
    return None

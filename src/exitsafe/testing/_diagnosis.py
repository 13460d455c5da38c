"""The cause of a bad exit, as data: [`Diagnosis`][exitsafe.testing.Diagnosis], and
`make_diagnosis`, which gives a kind its hint from the table (`HINTS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ._hints import HINTS, docs_url


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a bad exit, in words a person can act on.

    Attributes:
        kind: a stable label, named in the report's first line: ``"thread-in-native"``,
            ``"hang-before-teardown"``, ``"hang-in-atexit"``, ``"hang-in-finalizer"``,
            ``"deadlock-at-exit"``, ``"hang-in-teardown"``, ``"hang-in-main"``,
            ``"timeout"``, ``"crash-in-teardown"``, ``"crash-after-teardown"``,
            ``"crash-at-exit"``, ``"native-fatal"``, ``"child-process"``,
            ``"thread-exception"``, ``"atexit-error"``, ``"unraisable-at-exit"``,
            ``"lost-output"`` or ``"audit"``.
        headline: one line naming the cause (the report's first line carries it).
        details: further lines (which thread, which step, which process ...).
        hint: what fixes it, naming the exitsafe feature.
        doc: the documentation section of that recipe (``"threads.md#workers"``); its
            address on the docs site is `url`.
    """

    kind: str
    headline: str
    details: Sequence[str] = field(default_factory=tuple)
    hint: Optional[str] = None
    doc: Optional[str] = None

    @property
    def specific(self) -> bool:
        """Whether the cause says more than the decoded status (every kind but
        ``"timeout"`` and ``"other"``)."""
        return self.kind not in ("timeout", "other")

    @property
    def url(self) -> Optional[str]:
        """The address of `doc` on the docs site (``EXITSAFE_DOCS_URL`` or `DOCS_URL`)."""
        return None if self.doc is None else docs_url(self.doc)

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as a JSON-ready dict, as
        `exitsafe run --json` gives (schema version 3, see the testing page).

        Returns:
            One key per attribute, and `url`.
        """
        return {
            "kind": self.kind,
            "headline": self.headline,
            "details": list(self.details),
            "hint": self.hint,
            "doc": self.doc,
            "url": self.url,
        }


def make_diagnosis(kind: str, headline: str, details: Sequence[str] = (), hint: Optional[str] = None
          ) -> Diagnosis:
    text, doc = HINTS[hint or kind]
    return Diagnosis(kind, headline, tuple(details), text, doc)

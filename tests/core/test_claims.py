"""The claim table (one live handle per address or adopted object): an interrupt at the end
of a claim's section leaves no reservation behind, or the key could never be tracked again
("already tracked by another thread right now")."""

from __future__ import annotations

import pytest

from exitsafe import AlreadyTrackedError, _sync
from exitsafe._claims import ClaimTable


def _taken(key: object, handle: object) -> str:
    return f"{key!r} is already tracked"


@pytest.mark.parametrize("strong", [False, True], ids=["weak", "strong"])
def test_an_interrupt_as_the_claims_section_ends_leaves_no_reservation(monkeypatch, strong):
    # (the KeyboardInterrupt lands right after the lock is let go, inside the claim: the
    # reservation it made is dropped before the interrupt goes on)
    table = ClaimTable(strong=strong)
    release = _sync.release
    fired = []

    def release_then_interrupt() -> None:
        release()
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(_sync, "release", release_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        table.claim(0x1234, None, _taken)
    monkeypatch.setattr(_sync, "release", release)
    assert fired and not _sync.reentered()
    table.claim(0x1234, None, _taken)  # not refused: nothing was left reserved
    with pytest.raises(AlreadyTrackedError, match="already tracked"):
        table.claim(0x1234, None, _taken)  # (reserved now, by the claim above)

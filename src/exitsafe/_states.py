"""Shared state constants and the process's fork generation."""

from __future__ import annotations

from ._ledger import Outcome

# Native-object states.  RELEASING: a thread has claimed the release and is running it.
LIVE, RELEASING, RELEASED, LEAKED = 0, 1, 2, 3
STATE_NAMES = ("live", "live", "released", "leaked")

# Registry phases.
OPEN, TEARING, CLOSED = 0, 1, 2

#: Outcomes after which the native object may still exist: whatever it depends on
#: must then be leaked too, never released from under it.
TAINTING = frozenset(
    {
        Outcome.LEAKED_POLICY,
        Outcome.LEAKED_IN_USE,
        Outcome.LEAKED_TIMEOUT,
        Outcome.LEAKED_DEPENDENT,
        Outcome.LEAKED_AFTER_CLOSE,
        Outcome.LEAKED_INHERITED,
        Outcome.RELEASE_FAILED,
        Outcome.HOOK_TIMEOUT,
    }
)

#: Incremented in every child after ``os.fork()``; a handle remembers the value it was
#: created under, so a handle whose value differs was inherited from a parent process.
fork_generation = 0

#: Objects deliberately kept referenced for the life of the process: pinned libraries
#: without a close function and the raw objects of leaked handles.
kept_alive: list[object] = []

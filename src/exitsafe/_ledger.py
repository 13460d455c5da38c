"""The ledger: what happened to every handle, as data.

Every handle ends in exactly one outcome.  The registry appends one compact
record per outcome; :class:`LedgerEntry` objects are built only when somebody
asks for them, so the release hot path stays cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional


class Outcome:
    """The outcomes a handle can end in (plain strings, so they compare and serialize simply).

    ``released``            released by its owners before teardown.
    ``released_at_exit``    released natively by the teardown.
    ``leaked_policy``       its exit policy (or ``EXITSAFE_AT_EXIT=leak``) said leak.
    ``leaked_in_use``       it was borrowed (or being released on another thread) at teardown.
    ``leaked_timeout``      its release step blocked past the step or total timeout.
    ``leaked_dependent``    something depending on it was leaked or failed, so releasing it
                            could pull native state from under that dependent.
    ``leaked_after_close``  tracked after the registry's teardown began (or, rarely, garbage
                            collected in the instant teardown began, so that it never saw it).
    ``leaked_inherited``    inherited by a forked child, which never releases its parent's handles.
    ``release_failed``      the release function raised; it is never called again.
    ``hook_ran`` / ``hook_failed`` / ``hook_timeout``  a teardown hook's fate.
    ``hook_cancelled``      a teardown hook removed with :meth:`Handle.release` before teardown.
    """

    RELEASED = "released"
    RELEASED_AT_EXIT = "released_at_exit"
    LEAKED_POLICY = "leaked_policy"
    LEAKED_IN_USE = "leaked_in_use"
    LEAKED_TIMEOUT = "leaked_timeout"
    LEAKED_DEPENDENT = "leaked_dependent"
    LEAKED_AFTER_CLOSE = "leaked_after_close"
    LEAKED_INHERITED = "leaked_inherited"
    RELEASE_FAILED = "release_failed"
    HOOK_RAN = "hook_ran"
    HOOK_FAILED = "hook_failed"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_CANCELLED = "hook_cancelled"

    ALL = frozenset(
        {
            RELEASED,
            RELEASED_AT_EXIT,
            LEAKED_POLICY,
            LEAKED_IN_USE,
            LEAKED_TIMEOUT,
            LEAKED_DEPENDENT,
            LEAKED_AFTER_CLOSE,
            LEAKED_INHERITED,
            RELEASE_FAILED,
            HOOK_RAN,
            HOOK_FAILED,
            HOOK_TIMEOUT,
            HOOK_CANCELLED,
        }
    )
    #: Outcomes in which the native release (or the hook) actually ran to completion.
    RAN = frozenset({RELEASED, RELEASED_AT_EXIT, HOOK_RAN})


class LedgerEntry:
    """One handle's final outcome.

    Attributes: ``registry`` (registry name), ``seq`` (creation number, unique
    within the registry), ``kind``, ``name`` (display name), ``outcome`` (an
    :class:`Outcome` string), ``detail`` (why: the error, the policy, the
    dependent that leaked; or ``None``), ``at_exit`` (``True`` when the outcome
    was decided by a teardown).
    """

    __slots__ = ("at_exit", "detail", "kind", "name", "outcome", "registry", "seq")

    def __init__(
        self,
        registry: str,
        seq: int,
        kind: str,
        name: str,
        outcome: str,
        detail: Optional[str],
        at_exit: bool,
    ) -> None:
        self.registry = registry
        self.seq = seq
        self.kind = kind
        self.name = name
        self.outcome = outcome
        self.detail = detail
        self.at_exit = at_exit

    def as_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LedgerEntry):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.registry, self.seq, self.outcome))

    def __repr__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"<LedgerEntry {self.registry}:{self.name} {self.outcome}{detail}>"

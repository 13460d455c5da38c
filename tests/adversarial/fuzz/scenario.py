"""The description of one generated program, and the hypothesis strategies that draw it.

A :class:`Scenario` is plain data: :mod:`.render` writes it as a program, :mod:`.model`
says what must happen when it runs.  Indices refer to ``Scenario.handles``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hypothesis import strategies as st

#: Exit policies a handle may name (``None``: the registry's default).
POLICIES = (None, "release", "leak", "call-release", "call-leak", "call-raise")
#: How the main program ends.
EXITS = (
    "end",  # the end of the main module
    "sys.exit",  # sys.exit(code)
    "exitsafe.exit",  # exitsafe.exit(code): the teardown, then os._exit
    "teardown-late",  # REG.teardown(), then late release() of every handle, then the end
    "raise",  # an exception escapes the main module
    "keyboard",  # SIGINT with Python's default handler: KeyboardInterrupt
    "sigterm-exit",  # teardown_on_signals("SIGTERM"), SIGTERM to itself
    "sigterm-immediate",  # the same with mode="immediate"
)
#: How a forked child ends.
CHILD_EXITS = ("sys.exit", "exitsafe.exit")


@dataclass(frozen=True)
class HandleSpec:
    name: str
    parents: tuple[int, ...]  # indices of earlier handles this one depends on
    policy: Optional[str]  # one of POLICIES
    extra_owners: int  # retain() calls right after track()


@dataclass(frozen=True)
class HookSpec:
    name: str
    before: tuple[int, ...]
    after: tuple[int, ...]


@dataclass(frozen=True)
class BorrowSpec:
    handle: int
    forever: bool  # a daemon thread holds it until the process ends; else until its "unborrow" op


@dataclass(frozen=True)
class ChildSpec:
    own: tuple[
        tuple[str, tuple[int, ...]], ...
    ]  # handles the child tracks: name, inherited parents
    releases: tuple[int, ...]  # inherited handles the child calls release() on
    release_own: bool  # the child releases its own handles before it leaves
    exit: str  # one of CHILD_EXITS
    code: int


# Ops, in program order: ("release", i), ("drop", i) (the program's last reference goes),
# ("unborrow", b) (borrow b ends), ("fork",).
Op = tuple


@dataclass(frozen=True)
class Scenario:
    registry: str  # "default" or "own" (a Registry("fz") of the program's own)
    default_policy: str  # the registry's exit_policy: "release" or "leak"
    handles: tuple[HandleSpec, ...]
    hooks: tuple[HookSpec, ...]
    borrows: tuple[BorrowSpec, ...]
    ops: tuple[Op, ...]
    child: Optional[ChildSpec]
    exit: str
    code: int
    #: The registry's step_timeout: a borrow held until the process ends is waited for
    #: this long at teardown (5 s without one), so such scenarios always set one.
    step_timeout: Optional[float] = None

    @property
    def registry_name(self) -> str:
        return "default" if self.registry == "default" else "fz"


#: A node of the teardown's order: ``("h", i)`` handle ``i``, ``("k", j)`` hook ``j``.
Node = tuple[str, int]


def goes_before(
    handles: tuple[HandleSpec, ...], hooks: tuple[HookSpec, ...], node: Node
) -> set[Node]:
    """Every node the teardown must finish after ``node`` (``node`` before each of them):
    a handle goes before the handles it depends on and before the hooks naming it in
    ``after=``; a hook goes before the handles in its ``before=``."""
    seen: set[Node] = set()
    todo = [node]
    while todo:
        kind, i = todo.pop()
        if kind == "h":
            nxt = [("h", p) for p in handles[i].parents]
            nxt += [("k", j) for j, k in enumerate(hooks) if i in k.after]
        else:
            nxt = [("h", b) for b in hooks[i].before]
        for n in nxt:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def is_acyclic(handles: tuple[HandleSpec, ...], hooks: tuple[HookSpec, ...]) -> bool:
    """Whether the order the handles' dependencies and the hooks' edges ask for has no
    cycle (exitsafe raises DependencyCycleError for the edge that would close one)."""
    nodes = [("h", i) for i in range(len(handles))] + [("k", j) for j in range(len(hooks))]
    return not any(n in goes_before(handles, hooks, n) for n in nodes)


@st.composite
def handle_specs(draw: st.DrawFn) -> tuple[HandleSpec, ...]:
    n = draw(st.integers(1, 7))
    out = []
    for i in range(n):
        parents = (
            tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 3))))) if i else ()
        )
        policy = draw(st.sampled_from(POLICIES))
        extra = draw(st.integers(0, 2))
        out.append(HandleSpec(f"h{i}", parents, policy, extra))
    return tuple(out)


@st.composite
def hook_specs(draw: st.DrawFn, handles: tuple[HandleSpec, ...]) -> tuple[HookSpec, ...]:
    n = len(handles)
    hooks: list[HookSpec] = []
    for k in range(draw(st.integers(0, 3))):
        before = draw(st.sets(st.integers(0, n - 1), max_size=2))
        # The new hook goes before each handle in `before` and everything those go before
        # (their parents, and the hooks drawn so far that wait for them): an `after=a`
        # among those would close a cycle, through this hook alone or through others.
        placed = (*hooks, HookSpec(f"k{k}", tuple(sorted(before)), ()))
        forbidden = {i for kind, i in goes_before(handles, placed, ("k", k)) if kind == "h"}
        after = draw(st.sets(st.sampled_from(range(n)), max_size=2)) - forbidden
        hooks.append(HookSpec(f"k{k}", tuple(sorted(before)), tuple(sorted(after))))
    return tuple(hooks)


@st.composite
def child_specs(draw: st.DrawFn, handles: tuple[HandleSpec, ...]) -> ChildSpec:
    n = len(handles)
    own = tuple(
        (f"c{j}", tuple(sorted(draw(st.sets(st.integers(0, n - 1), max_size=2)))))
        for j in range(draw(st.integers(0, 2)))
    )
    releases = tuple(draw(st.lists(st.integers(0, n - 1), max_size=3)))
    return ChildSpec(
        own,
        releases,
        draw(st.booleans()),
        draw(st.sampled_from(CHILD_EXITS)),
        draw(st.integers(0, 3)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    handles = draw(handle_specs())
    n = len(handles)
    hooks = draw(hook_specs(handles))
    borrows = tuple(
        BorrowSpec(draw(st.integers(0, n - 1)), draw(st.booleans()))
        for _ in range(draw(st.integers(0, 2)))
    )
    ops: list[Op] = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("release"), st.integers(0, n - 1)),
                st.tuples(st.just("drop"), st.integers(0, n - 1)),
            ),
            max_size=8,
        )
    )
    for b, spec in enumerate(borrows):
        if not spec.forever:
            ops.insert(draw(st.integers(0, len(ops))), ("unborrow", b))
    child = None
    if draw(st.booleans()):
        child = draw(child_specs(handles))
        ops.insert(draw(st.integers(0, len(ops))), ("fork",))
    step_timeout = draw(st.sampled_from((None, 5.0)))
    if any(b.forever for b in borrows):
        step_timeout = 1.0  # short, yet far above a logged release under load
    exit_mode = draw(st.sampled_from(EXITS))
    code = draw(st.integers(0, 3)) if exit_mode in ("sys.exit", "exitsafe.exit") else 0
    return Scenario(
        draw(st.sampled_from(("default", "own"))),
        draw(st.sampled_from(("release", "release", "leak"))),
        handles,
        hooks,
        borrows,
        tuple(normalize(ops)),
        child,
        exit_mode,
        code,
        step_timeout,
    )


def normalize(ops: list[Op]) -> list[Op]:
    """Drop what cannot be written: a release or a second drop after a handle's drop."""
    dropped: set[int] = set()
    out = []
    for op in ops:
        if op[0] in ("release", "drop"):
            if op[1] in dropped:
                continue
            if op[0] == "drop":
                dropped.add(op[1])
        out.append(op)
    return out

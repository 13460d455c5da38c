"""What the documentation says must happen when a :class:`~.scenario.Scenario` runs.

:func:`expect` simulates the program's explicit part (owners, borrows, dropped references,
the cascade of releases to parents) and then the teardown, and returns per process the
acceptable ledger outcomes of every handle and hook, the exit status, and which names
that process must have released.  Where the documentation leaves the choice open (a
handle both leaked by policy and under a leaked dependent), every documented outcome is
accepted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from .scenario import Scenario

LEAK = "leak"
_EFFECTIVE = {"release": "release", "leak": LEAK, "call-release": "release"}
_EFFECTIVE.update({"call-leak": LEAK, "call-raise": LEAK})  # a raising policy leaks

_RAN = frozenset({"released", "released_at_exit"})

EXIT_STATUS = {
    "end": 0,
    "teardown-late": 0,
    "raise": 1,
    "keyboard": -2,  # an uncaught KeyboardInterrupt ends the process by SIGINT
    "sigterm-exit": 143,  # SystemExit(128 + SIGTERM)
    "sigterm-immediate": -15,  # dies by the signal after the teardown
}


@dataclass
class Process:
    """The expectations for one process (the main one or the forked child)."""

    status: int
    outcomes: dict[str, set[str]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)  # names whose release must run here
    may_release: set[str] = field(default_factory=set)  # names whose release may run here
    hooks_run: set[str] = field(default_factory=set)
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)  # this process's graph
    hook_edges: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)


@dataclass
class Expected:
    main: Process
    child: Optional[Process]


class _Sim:
    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.owners = {i: 1 + h.extra_owners for i, h in enumerate(s.handles)}
        self.ended: dict[int, str] = {}
        self.dropped: set[int] = set()
        self.borrows: Counter[int] = Counter(b.handle for b in s.borrows)
        self.forever = {b.handle for b in s.borrows if b.forever}

    def dependents(self, i: int) -> list[int]:
        return [j for j, h in enumerate(self.s.handles) if i in h.parents]

    def referenced(self, i: int) -> bool:
        if i not in self.dropped or self.borrows[i]:
            return True
        if any(j not in self.ended for j in self.dependents(i)):
            return True  # a live dependent keeps its parents
        return any(i in k.before for k in self.s.hooks)  # a pending hook keeps its before=

    def try_release(self, i: int) -> None:
        if i in self.ended or self.owners[i] or self.borrows[i]:
            return
        if any(j not in self.ended for j in self.dependents(i)):
            return
        self.ended[i] = "released"
        for p in self.s.handles[i].parents:
            self.try_release(p)

    def settle(self) -> None:
        changed = True
        while changed:
            changed = False
            for i in range(len(self.s.handles)):
                if i not in self.ended and self.owners[i] and not self.referenced(i):
                    self.owners[i] = 0  # garbage collected: every owner dropped at once
                    self.try_release(i)
                    changed = True

    def release(self, i: int) -> None:
        if self.owners[i]:
            self.owners[i] -= 1
            self.try_release(i)
        self.settle()

    def teardown(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {i: {o} for i, o in self.ended.items()}
        for i in reversed(range(len(self.s.handles))):  # dependents have higher indices
            if i in self.ended:
                continue
            dep_leaked = any(not out[j] & _RAN for j in self.dependents(i))
            spec = self.s.handles[i]
            policy = _EFFECTIVE[spec.policy or self.s.default_policy]
            opts: set[str] = set()
            if i in self.forever:
                opts.add("leaked_in_use")
            if policy == LEAK:
                opts.add("leaked_policy")
            if dep_leaked:
                opts.add("leaked_dependent")
            out[i] = opts or {"released_at_exit"}
        return out


def expect(s: Scenario) -> Expected:
    sim = _Sim(s)
    child: Optional[Process] = None
    for op in s.ops:
        if op[0] == "release":
            sim.release(op[1])
        elif op[0] == "drop":
            sim.dropped.add(op[1])
            sim.settle()
        elif op[0] == "unborrow":
            i = s.borrows[op[1]].handle
            sim.borrows[i] -= 1
            sim.try_release(i)
            sim.settle()
        elif op[0] == "fork":
            child = _child(s, sim)
    names = [h.name for h in s.handles]
    status = s.code if s.exit in ("sys.exit", "exitsafe.exit") else EXIT_STATUS[s.exit]
    main = Process(status)
    for i, opts in sim.teardown().items():
        main.outcomes[names[i]] = opts
        if opts <= _RAN:
            main.released.add(names[i])
        elif opts & _RAN:
            main.may_release.add(names[i])
    for k in s.hooks:
        main.outcomes[k.name] = {"hook_ran"}
        main.hooks_run.add(k.name)
        main.hook_edges[k.name] = (
            tuple(names[i] for i in k.before),
            tuple(names[i] for i in k.after),
        )
    main.parents = {h.name: tuple(names[p] for p in h.parents) for h in s.handles}
    return Expected(main, child)


def _child(s: Scenario, sim: _Sim) -> Process:
    c = s.child
    assert c is not None
    p = Process(c.code)
    for i, h in enumerate(s.handles):
        # The ledger is inherited with the memory: what ended before the fork keeps its
        # outcome; the rest belongs to the parent and is never released here.
        p.outcomes[h.name] = {sim.ended[i]} if i in sim.ended else {"leaked_inherited"}
    for k in s.hooks:
        p.outcomes[k.name] = {"leaked_inherited"}
    usable = {
        s.handles[i].name
        for i in range(len(s.handles))
        if i not in sim.dropped and i not in sim.ended and sim.owners[i] > 0
    }
    for name, parents in c.own:
        if c.release_own:
            p.outcomes[name] = {"released"}
        elif s.default_policy == LEAK:
            p.outcomes[name] = {"leaked_policy"}
        else:
            p.outcomes[name] = {"released_at_exit"}
        if p.outcomes[name] & _RAN:
            p.released.add(name)
        p.parents[name] = tuple(s.handles[i].name for i in parents if s.handles[i].name in usable)
    return p

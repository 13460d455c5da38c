"""Differential tests of the two cores: the same program, run once under the compiled core
(``EXITSAFE_PURE_PYTHON=0``) and once under the pure-Python one (``=1``), must observe the
same thing.

Hypothesis draws *operation sequences* on a few handles in three registries (the default
one, ``r``, which may have a ``ledger_limit``, and ``s``, which is strict): ``track``
(``exitsafe.track``, ``Registry.track`` or ``exitsafe.ctypes.track``, options by keyword or
by position, with or without kind, name, ``depends_on``, exit policy (``"release"``,
``"leak"`` or a callable printing the ``HandleInfo`` it is shown) and affinity; a raw
object that may sit in a reference cycle with its handle; a release function that
succeeds, raises, or calls exitsafe: releases, retains or reads another handle, tracks a
new one, collects garbage, starts its registry's teardown or calls ``exitsafe.exit``),
``retain``, ``release`` (also beyond the last owner, and on another thread, joined at
once), ``borrow`` entered and exited (nested, with releases requested meanwhile), ``raw``,
``add_dependency`` (refused ones too: cycles, foreign registries, closed handles),
``detach``, dropping the program's last references (``del``) and ``gc.collect()`` (the
automatic collector is off, so collections happen only there), ``on_teardown`` hooks,
``run_pending``, reading the ledgers, an explicit teardown (every later operation is then
a late one) and ``os.fork()`` (the child runs operations of its own and leaves by
``exitsafe.exit``, ``sys.exit`` or a teardown and ``os._exit``).  The program then ends
(by falling off its end, ``exitsafe.exit`` or ``sys.exit``) with whatever is still live, so
the exit teardown runs too; some programs set ``EXITSAFE_TRACE=1`` or
``EXITSAFE_AT_EXIT``.  Each program draws from a random part of the operations,
registries and actions (swarm testing), so that the parts it keeps meet often.

Each program is one script, printed in any failure.  Every operation prints a JSON line
of what it saw (its return value, its exception's type and message, every handle's state,
owner count and borrow flag after it); every release function and hook prints a line when
it runs (so the lines give the order of the native release calls), the end of each process
prints every registry's ledger (registry, seq, kind, name, outcome, detail, at_exit), its
``ledger_counts``, ``live_handles`` and ``late_requests``, and each process (the parent
and every forked child) writes the exit ledger through ``EXITSAFE_LEDGER``.  All of it,
the exit statuses and the exitsafe lines on stderr (the trace included, durations
masked) must be equal for both cores.  A program is deterministic: no automatic garbage
collection, threads joined at once, ``PYTHONHASHSEED=0``.

Only the public API is used, since the internals of both cores change.

The default run draws a fixed series (``derandomize``) of ``EXITSAFE_DIFF_EXAMPLES``
programs (default 50, about 15-25 s); ``EXITSAFE_DIFF_EXAMPLES=400`` is the long mode,
``EXITSAFE_DIFF_SEED=N`` draws another series and ``EXITSAFE_DIFF_SHRINK=1`` lets
hypothesis minimize a failure (slow: two subprocesses per step).

Disagreements found so far have a test of their own below (``test_disagreement_*``),
with the smallest program that shows them; they fail until the cores agree again.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st

from ..support import child_env

BUILT = importlib.util.find_spec("exitsafe._speedups") is not None
pytestmark = [
    pytest.mark.skipif(
        not BUILT,
        reason="the compiled core (exitsafe._speedups) is not built: nothing to compare the "
        "pure-Python core with",
    ),
]

EXAMPLES = int(os.environ.get("EXITSAFE_DIFF_EXAMPLES", "50"))
SEED = os.environ.get("EXITSAFE_DIFF_SEED")
SHRINK = os.environ.get("EXITSAFE_DIFF_SHRINK") == "1"
#: A hang is killed after this; a healthy program takes a fraction of a second.
TIMEOUT = 60.0
CORES = {"compiled": "0", "python": "1"}

# ---------------------------------------------------------------- the generated programs

#: What every generated program starts with (after ``R_POLICY = ...`` lines).
PRELUDE = textwrap.dedent(
    '''
    import gc, json, os, re, sys, threading
    import exitsafe, exitsafe.ctypes

    gc.disable()  # collections happen only at the program's gc.collect() steps
    WHO = "parent"
    H = {}  # name -> handle: the program's own references (del H[name] drops one)
    B = {}  # name -> the borrows entered on it, innermost last
    MADE = []  # handles tracked by release functions and hooks (kept referenced)
    REG = {
        "default": exitsafe.lowlevel.default_registry(),
        "r": exitsafe.Registry("r", exit_policy=R_POLICY, ledger_limit=R_LIMIT),
        "s": exitsafe.Registry("s", strict=True, exit_policy=S_POLICY),
    }
    _ADDR = re.compile(r"0x[0-9a-fA-F]+")


    def emit(ev, **fields):
        fields["ev"] = ev
        fields["who"] = WHO
        os.write(1, (json.dumps(fields, sort_keys=True) + "\\n").encode())


    emit("pid", pid=os.getpid())


    class Unbound(Exception):
        """The program holds no handle of that name (its track failed, or it was dropped)."""


    def g(name):
        try:
            return H[name]
        except KeyError:
            raise Unbound(name) from None


    class Box:
        """A raw object in a reference cycle with its handle (box.handle)."""

        def __init__(self, label):
            self.label = label
            self.handle = None
            self.peer = None  # another handle its release function works on


    def label(raw):
        if isinstance(raw, int):  # an address given to exitsafe.ctypes.track
            return "@" + ADDRESSES.get(raw, hex(raw))
        return raw.label if isinstance(raw, Box) else raw


    ADDRESSES = {}  # address -> the name of the handle tracked at it


    def address(name, n):
        ADDRESSES[n] = name
        return n


    def clean(text):
        return None if text is None else _ADDR.sub("0x?", str(text))


    def describe(value):
        if isinstance(value, exitsafe.Handle):
            return "handle " + value.name
        if isinstance(value, (Box, str, int)) and not isinstance(value, bool):
            return "raw " + label(value)
        return repr(value)


    def error(exc):
        return [type(exc).__name__, clean(exc)]


    def thread():
        return "main" if threading.current_thread() is threading.main_thread() else "other"


    def act(who, reg, action, target, raw=None):
        """What a release function or hook does once it logged its call.  It works on
        the handle its raw object refers to (raw.peer) or, without one, on the program's
        handle named target."""
        if action == "raise":
            raise RuntimeError(f"{who} fails")
        if action == "exit":
            emit("inner", by=who, action=action)
            exitsafe.exit(0)
        try:
            if action in ("release", "retain", "raw"):
                peer = getattr(raw, "peer", None)
                other = peer if peer is not None else g(target)
            if action == "release":
                other.release()
                emit("inner", by=who, action=action, target=target)
            elif action == "retain":
                other.retain()
                emit("inner", by=who, action=action, target=target)
            elif action == "raw":
                emit("inner", by=who, action=action, raw=describe(other.raw))
            elif action == "collect":
                gc.collect()
                emit("inner", by=who, action=action)
            elif action == "track":
                made = REG[reg].track(who + "+", rel(who + "+", reg), name=who + "+")
                MADE.append(made)
                emit("inner", by=who, action=action, state=[made.state, made.owners])
            elif action == "teardown":
                REG[reg].teardown()
                emit("inner", by=who, action=action)
        except Exception as exc:
            emit("inner", by=who, action=action, error=error(exc))


    def rel(name, reg, action="ok", target=None):
        def release(raw):
            emit("release", h=name, raw=label(raw), thread=thread())
            act(name, reg, action, target, raw)

        return release


    def hook(name, reg, action="ok", target=None):
        def run():
            emit("hook", k=name, thread=thread())
            act(name, reg, action, target)

        return run


    def decide(info):
        emit("policy", h=info.name, kind=info.kind, owners=info.owners, inherited=info.inherited,
             registry=info.registry, raw=label(info.raw), thread=thread())
        return "leak" if info.owners > 1 else "release"


    def snapshot():
        state = {n: [h.state, h.owners, h.borrowed] for n, h in H.items()}
        state.update((h.name, [h.state, h.owners, h.borrowed]) for h in MADE)
        return state


    class op:
        """One operation: prints what it returned or raised, and after it every handle's
        state and every registry's ledger counts."""

        def __init__(self, i):
            self.i = i
            self.ret = None
            emit("op", i=i)

        def __call__(self, value):
            self.ret = describe(value)
            return value

        def __enter__(self):
            return self

        def __exit__(self, kind, exc, tb):
            fields = {"i": self.i, "ret": self.ret}
            if exc is not None:
                if not isinstance(exc, Exception):
                    return False
                fields["error"] = error(exc)
            fields["state"] = snapshot()
            counts = {n: r.ledger_counts() for n, r in REG.items()}
            fields["counts"] = {n: c for n, c in counts.items() if c}
            emit("done", **fields)
            return True


    def borrow_enter(name):
        borrow = g(name).borrow()
        raw = borrow.__enter__()
        B.setdefault(name, []).append(borrow)
        return raw


    def borrow_exit(name):
        if not B.get(name):
            raise Unbound(f"no borrow of {name} open")
        B[name].pop().__exit__(None, None, None)


    def on_thread(fn, name):
        """fn(g(name)) on another thread, joined before this returns (its exception re-raised)."""
        handle = g(name)
        caught = []

        def run():
            try:
                fn(handle)
            except Exception as exc:
                caught.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        del handle
        if caught:
            raise caught.pop()


    def report():
        out = {}
        for name, r in REG.items():
            out[name] = {
                "ledger": [
                    [e.registry, e.seq, e.kind, e.name, e.outcome, clean(e.detail), e.at_exit]
                    for e in r.ledger()
                ],
                "counts": r.ledger_counts(),
                "live": [[i.name, i.kind, i.owners] for i in r.live_handles()],
                "late": r.late_requests,
            }
        emit("end", registries=out)

    '''
)

REGISTRIES = ("default", "r", "s")
#: A track's exit_policy: "decide" is a callable that prints what it was shown (a
#: HandleInfo) and leaks what has more than one owner left.
POLICIES = (None, "release", "leak", "decide")
KINDS = (None, "device", "buffer", "library")
#: What a release function or hook does (besides printing that it runs): nothing, raise,
#: or call exitsafe (on the handle its raw object refers to, else a handle of the program).
ACTIONS = ("ok",) * 5 + (
    "raise",
    "release",
    "release",
    "retain",
    "raw",
    "track",
    "teardown",
    "teardown",
    "collect",
    "collect",
    "exit",
)
#: Actions on another handle: a raw object in a cycle refers to that handle (box.peer).
ON_PEER = ("release", "retain", "raw")


@dataclass(frozen=True)
class Track:
    reg: str
    #: "module" (exitsafe.track, default registry only), "method" (Registry.track),
    #: "positional" (either, options by position), "ctypes" (exitsafe.ctypes.track of an
    #: int address: the adapter's compiled path; never in a cycle)
    form: str
    kind: Optional[str]
    named: bool
    deps: tuple[tuple[int, bool], ...]  # (slot, from another registry)
    policy: Optional[str]
    cycle: bool  # the raw object refers to its handle
    action: str  # what the release function does (see ACTIONS)
    target: int  # the slot its action works on
    affinity: Optional[str] = None  # "main", "creator" or None


@dataclass(frozen=True)
class Hook:
    reg: str
    before: tuple[tuple[int, bool], ...]
    after: tuple[tuple[int, bool], ...]
    action: str
    target: int


@dataclass(frozen=True)
class On:
    """An operation on one handle: retain, release, release_thread, borrow, unborrow, raw,
    detach, drop."""

    what: str
    slot: int


@dataclass(frozen=True)
class AddDependency:
    slot: int
    others: tuple[tuple[int, bool], ...]


@dataclass(frozen=True)
class Collect:
    """``gc.collect()``."""


@dataclass(frozen=True)
class Forget:
    """Drop the program's references to a few handles, then ``gc.collect()``: one
    collection that may find several handles (in cycles with their raw objects)."""

    slots: tuple[int, ...]


@dataclass(frozen=True)
class Ledger:
    """Read every registry's ledger, counts and live handles mid-run."""


@dataclass(frozen=True)
class RunPending:
    """``exitsafe.lowlevel.run_pending()``: the releases queued for this thread (affinity)."""


@dataclass(frozen=True)
class Teardown:
    reg: str


@dataclass(frozen=True)
class Fork:
    ops: tuple[Any, ...]
    end: str  # "exit", "sys_exit", "teardown_exit"


@dataclass(frozen=True)
class Program:
    r_policy: str
    s_policy: str
    r_limit: Optional[int]  # registry r's ledger_limit
    trace: bool  # EXITSAFE_TRACE=1 (the teardown then takes its traced, Python path)
    at_exit: Optional[str]  # EXITSAFE_AT_EXIT
    ops: tuple[Any, ...]
    end: str  # "fall", "exit", "sys_exit"


#: Operations and how often each is drawn (relative weights).
WEIGHTS = {
    "track": 8,
    "retain": 2,
    "release": 6,
    "release_thread": 1,
    "raw": 1,
    "detach": 1,
    "borrow": 2,
    "unborrow": 2,
    "drop": 4,
    "add_dependency": 2,
    "gc": 2,
    "forget": 3,
    "hook": 1,
    "ledger": 1,
    "run_pending": 1,
    "teardown": 3,
    "fork": 1,
}
TRACK_FORMS = ("module", "method", "positional", "ctypes")


@dataclass(frozen=True)
class Swarm:
    """What one program may draw from (swarm testing: each program leaves out a random
    part of the operations, registries and release-function actions, so that the rest
    meet more often than in programs drawing from everything)."""

    kinds: tuple[str, ...]
    registries: tuple[str, ...]
    actions: tuple[str, ...]
    cycles: tuple[bool, ...]


def _subset(items: tuple[str, ...], keep: str) -> st.SearchStrategy[tuple[str, ...]]:
    """A non-empty part of ``items`` (in their order) that holds ``keep``."""
    return st.lists(st.booleans(), min_size=len(items), max_size=len(items)).map(
        lambda flags: tuple(x for x, on in zip(items, flags) if on or x == keep)
    )


swarms = st.builds(
    Swarm,
    kinds=_subset(tuple(WEIGHTS), "track"),
    registries=_subset(REGISTRIES, "default"),
    actions=_subset(tuple(dict.fromkeys(ACTIONS)), "ok"),
    cycles=st.sampled_from(((False,), (True,), (False, True, True))),
)
slots = st.integers(0, 7)
foreign_edges = st.lists(
    st.tuples(slots, st.sampled_from([False] * 9 + [True])), max_size=3
).map(tuple)
#: add_dependency names at least one handle (the handle itself when nothing else is held)
some_edges = st.lists(
    st.tuples(slots, st.sampled_from([False] * 9 + [True])), min_size=1, max_size=3
).map(tuple)


def _strategy(what: str, swarm: Swarm) -> st.SearchStrategy[Any]:
    registries = st.sampled_from(swarm.registries)
    actions = st.sampled_from([a for a in ACTIONS if a in swarm.actions])
    if what == "track":
        return st.builds(
            Track,
            reg=registries,
            form=st.sampled_from(TRACK_FORMS),
            kind=st.sampled_from(KINDS),
            named=st.booleans(),
            deps=foreign_edges,
            policy=st.sampled_from(POLICIES),
            cycle=st.sampled_from(swarm.cycles),
            action=actions,
            target=slots,
            affinity=st.sampled_from((None,) * 6 + ("main", "creator")),
        )
    if what == "hook":
        return st.builds(
            Hook,
            reg=registries,
            before=foreign_edges,
            after=foreign_edges,
            action=actions,
            target=slots,
        )
    if what == "add_dependency":
        return st.builds(AddDependency, slot=slots, others=some_edges)
    if what == "gc":
        return st.just(Collect())
    if what == "forget":
        return st.builds(Forget, st.lists(slots, min_size=1, max_size=3).map(tuple))
    if what == "ledger":
        return st.just(Ledger())
    if what == "run_pending":
        return st.just(RunPending())
    if what == "teardown":
        return st.builds(Teardown, reg=registries)
    if what == "fork":
        return st.builds(
            Fork,
            ops=st.lists(operations(swarm, False), max_size=6).map(tuple),
            end=st.sampled_from(("exit", "sys_exit", "teardown_exit")),
        )
    return st.builds(On, what=st.just(what), slot=slots)


def operations(swarm: Swarm, fork: bool) -> st.SearchStrategy[Any]:
    """One operation of ``swarm`` (a fork only when ``fork``: children do not fork
    again)."""
    kinds = [
        w for w, n in WEIGHTS.items() for _ in range(n)
        if w in swarm.kinds and (fork or w != "fork")
    ]
    return st.sampled_from(kinds).flatmap(lambda what: _strategy(what, swarm))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """A program: its registries' exit policies, its operations, how it ends."""
    swarm = draw(swarms)
    return Program(
        r_policy=draw(st.sampled_from(("release", "leak"))),
        s_policy=draw(st.sampled_from(("release", "leak"))),
        r_limit=draw(st.sampled_from((None, None, 0, 1, 2, 3))),
        trace=draw(st.sampled_from((False, False, False, True))),
        at_exit=draw(st.sampled_from((None,) * 6 + ("release", "leak"))),
        ops=tuple(draw(st.lists(operations(swarm, True), min_size=8, max_size=30))),
        end=draw(st.sampled_from(("fall", "exit", "sys_exit"))),
    )


@dataclass
class Rendering:
    """A program being written: its lines and which handle names it holds."""

    lines: list[str] = field(default_factory=list)
    bound: dict[str, str] = field(default_factory=dict)  # name -> registry, oldest first
    steps: list[str] = field(default_factory=list)  # op index -> its code, for the diff
    forks: int = 0
    who: str = ""  # the forked child being written ("" in the parent)

    def pick(self, slot: int, reg: Optional[str] = None, foreign: bool = False) -> Optional[str]:
        if reg is None:
            names = list(self.bound)
        else:
            names = [n for n, r in self.bound.items() if (r != reg) == foreign]
        return names[slot % len(names)] if names else None

    def refs(self, edges: tuple[tuple[int, bool], ...], reg: str) -> str:
        names = []
        for slot, foreign in edges:
            name = self.pick(slot, reg, foreign)
            if name is not None and name not in names:
                names.append(name)
        return "[" + ", ".join(f'g("{n}")' for n in names) + "]"


def _step(r: Rendering, indent: str, body: list[str]) -> None:
    i = len(r.steps)
    r.steps.append(("in " + r.who + ": " if r.who else "") + "; ".join(body))
    r.lines.append(f"{indent}with op({i}) as o:")
    r.lines.extend(f"{indent}    {line}" for line in body)


def _track(r: Rendering, t: Track, indent: str) -> None:
    name = f"h{len(r.steps)}"
    target = r.pick(t.target) or name
    release = f'rel("{name}", "{t.reg}"' + (
        f', "{t.action}", "{target}")' if t.action != "ok" else ")"
    )
    cycle = t.cycle and t.form != "ctypes"
    raw = "box" if cycle else f'"{name}"'
    kind = t.kind or "handle"
    deps = r.refs(t.deps, t.reg)
    shown = f'"{name}"' if t.named else "None"
    policy = {None: "None", "decide": "decide"}.get(t.policy, f'"{t.policy}"')
    options = []  # the options given by keyword
    if t.kind is not None:
        options.append(f'kind="{t.kind}"')
    if deps != "[]":
        options.append(f"depends_on={deps}")
    if t.policy is not None:
        options.append(f"exit_policy={policy}")
    if t.named:
        options.append(f"name={shown}")
    if t.affinity is not None:
        options.append(f'affinity="{t.affinity}"')
    if t.form == "ctypes":
        where = [f'registry=REG["{t.reg}"]'] if t.reg != "default" else []
        at = f'address("{name}", {0x10000 + 16 * len(r.steps):#x})'
        call = f"exitsafe.ctypes.track({', '.join([at, release, *where, *options])})"
    elif t.form == "positional":
        owner = "exitsafe" if t.reg == "default" else f'REG["{t.reg}"]'
        affinity = f', None, "{t.affinity}"' if t.affinity else ""
        call = (
            f'{owner}.track({raw}, {release}, "{kind}", {deps}, {policy}, {shown}{affinity})'
        )
    else:
        owner = "exitsafe" if (t.reg == "default" and t.form == "module") else f'REG["{t.reg}"]'
        call = f"{owner}.track({', '.join([raw, release, *options])})"
    body = [f'H["{name}"] = o({call})']
    if cycle:
        body = [f'box = Box("{name}")', *body, f'box.handle = H["{name}"]']
        if t.action in ON_PEER and target in r.bound:
            body.append(f'box.peer = H.get("{target}")')
    _step(r, indent, body)
    if cycle:
        r.lines.append(f"{indent}box = None")
    r.bound[name] = t.reg


def _hook(r: Rendering, k: Hook, indent: str) -> None:
    name = f"k{len(r.steps)}"
    target = r.pick(k.target) or name
    fn = f'hook("{name}", "{k.reg}"' + (
        f', "{k.action}", "{target}")' if k.action != "ok" else ")"
    )
    owner = "exitsafe" if k.reg == "default" else f'REG["{k.reg}"]'
    args = [fn]
    before, after = r.refs(k.before, k.reg), r.refs(k.after, k.reg)
    if before != "[]":
        args.append(f"before={before}")
    if after != "[]":
        args.append(f"after={after}")
    args.append(f'name="{name}"')
    _step(r, indent, [f'H["{name}"] = o({owner}.on_teardown({", ".join(args)}))'])
    r.bound[name] = k.reg


ON_CODE = {
    "retain": 'o(g("{n}").retain())',
    "release": 'o(g("{n}").release())',
    "release_thread": 'o(on_thread(exitsafe.Handle.release, "{n}"))',
    "raw": 'o(g("{n}").raw)',
    "detach": 'o(g("{n}").detach())',
    "borrow": 'o(borrow_enter("{n}"))',
    "unborrow": 'o(borrow_exit("{n}"))',
    "drop": 'del H["{n}"]',
}


def _render_op(r: Rendering, item: Any, indent: str) -> None:
    if isinstance(item, Track):
        _track(r, item, indent)
    elif isinstance(item, Hook):
        _hook(r, item, indent)
    elif isinstance(item, On):
        name = r.pick(item.slot)
        if name is None:
            return
        _step(r, indent, [ON_CODE[item.what].format(n=name)])
        if item.what == "drop":
            del r.bound[name]
    elif isinstance(item, AddDependency):
        name = r.pick(item.slot)
        if name is None:
            return
        others = r.refs(item.others, r.bound[name])
        if others == "[]":  # the handle itself: a cycle of one
            others = f'[g("{name}")]'
        _step(r, indent, [f'o(g("{name}").add_dependency(*{others}))'])
    elif isinstance(item, Forget):
        names = []
        for slot in item.slots:
            name = r.pick(slot)
            if name is not None:
                del r.bound[name]
                names.append(name)
        _step(r, indent, [*(f'del H["{n}"]' for n in names), "gc.collect()"])
    elif isinstance(item, Collect):
        _step(r, indent, ["gc.collect()"])
    elif isinstance(item, Ledger):
        _step(r, indent, ["report()"])
    elif isinstance(item, RunPending):
        _step(r, indent, ["o(exitsafe.lowlevel.run_pending())"])
    elif isinstance(item, Teardown):
        call = "exitsafe.teardown()" if item.reg == "default" else f'REG["{item.reg}"].teardown()'
        _step(r, indent, [call])
    elif isinstance(item, Fork):
        r.forks += 1
        who = f"child{r.forks}"
        i = len(r.steps)
        r.steps.append(f"fork ({who}: its operations follow)")
        r.lines += [
            f"{indent}emit('op', i={i})",
            f"{indent}pid = os.fork()",
            f"{indent}if pid == 0:",
            f'{indent}    WHO = "{who}"',
            f'{indent}    emit("pid", pid=os.getpid())',
        ]
        saved = dict(r.bound)
        r.who = who
        for sub in item.ops:
            _render_op(r, sub, indent + "    ")
        r.bound, r.who = saved, ""
        r.lines.append(f"{indent}    report()")
        if item.end == "exit":
            r.lines.append(f"{indent}    exitsafe.exit(0)")
        elif item.end == "sys_exit":
            r.lines.append(f"{indent}    sys.exit(0)")
        else:
            r.lines += [f"{indent}    exitsafe.teardown()", f"{indent}    os._exit(0)"]
        r.lines += [
            f"{indent}_, status = os.waitpid(pid, 0)",
            f'{indent}emit("child", who="{who}", code=os.waitstatus_to_exitcode(status))',
        ]
    else:  # pragma: no cover
        raise TypeError(item)


def render(p: Program) -> tuple[str, list[str]]:
    """The program's text, and the code of each numbered operation."""
    r = Rendering()
    for item in p.ops:
        _render_op(r, item, "")
    r.lines.append("report()")
    if p.end == "exit":
        r.lines.append("exitsafe.exit(0)")
    elif p.end == "sys_exit":
        r.lines.append("sys.exit(3)")
    head = (
        f"R_POLICY = {p.r_policy!r}\nS_POLICY = {p.s_policy!r}\nR_LIMIT = {p.r_limit!r}\n"
    )
    if p.trace or p.at_exit:
        head += "import os\n"
    if p.trace:
        head += 'os.environ["EXITSAFE_TRACE"] = "1"\n'
    if p.at_exit:
        head += f'os.environ["EXITSAFE_AT_EXIT"] = "{p.at_exit}"\n'

    return head + PRELUDE + "\n".join(r.lines) + "\n", r.steps


# ---------------------------------------------------------------- running and comparing


@dataclass
class Observed:
    """What one core's run of a program showed."""

    core: str
    returncode: Optional[int]  # None: killed after TIMEOUT
    events: list[Any]  # the JSON lines of stdout (other lines as strings)
    ledgers: dict[str, Any]  # who -> the EXITSAFE_LEDGER file (or None)
    stderr: list[str]  # exitsafe's lines and exception lines, addresses masked
    stdout: str
    raw_stderr: str

    def comparable(self) -> dict[str, Any]:
        return {
            "returncode": self.returncode,
            "events": self.events,
            "ledgers": self.ledgers,
            "stderr": self.stderr,
        }

    def lines(self) -> list[tuple[Optional[int], str]]:
        """One line per fact (a ledger entry has a line of its own), for a readable diff;
        each with the index of the event it comes from (``None``: the exit ledgers,
        the exit status and stderr)."""
        out: list[tuple[Optional[int], str]] = [(None, f"returncode {self.returncode}")]
        for k, e in enumerate(self.events):
            if isinstance(e, dict) and e.get("ev") == "end":
                for name, reg in e["registries"].items():
                    where = f"end of {e['who']}, registry {name}:"
                    out += [(k, f"{where} entry {json.dumps(x)}") for x in reg["ledger"]]
                    out.append((k, f"{where} counts {json.dumps(reg['counts'], sort_keys=True)}"))
                    out.append((k, f"{where} live {json.dumps(reg['live'])} late {reg['late']}"))
            else:
                out.append((k, json.dumps(e, sort_keys=True)))
        for who, data in sorted(self.ledgers.items()):
            if data is None:
                out.append((None, f"exit ledger of {who}: none written"))
                continue
            for reg in data["registries"]:
                where = f"exit ledger of {who}, registry {reg['name']}:"
                rest = {k: v for k, v in reg.items() if k != "entries"}
                out += [
                    (None, f"{where} entry {json.dumps(x, sort_keys=True)}")
                    for x in reg["entries"]
                ]
                out.append((None, f"{where} {json.dumps(rest, sort_keys=True)}"))
        out += [(None, f"stderr: {line}") for line in self.stderr]
        return out


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_MILLISECONDS = re.compile(r"\bms=[0-9.]+")  # the durations of EXITSAFE_TRACE=1
_CHAINING = ("Traceback (most recent call last)", "During handling of", "The above exception")


def _stderr_facts(text: str) -> list[str]:
    """The stderr lines both cores must print alike: not traceback frames (whose Python
    frames differ between a C function and a Python one), addresses masked."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith((" ", "\t")):
            continue
        if line.startswith(_CHAINING):
            continue
        out.append(_MILLISECONDS.sub("ms=?", _ADDRESS.sub("0x?", line)))
    return out


def _start(core: str, text: str, tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    where = tmp / core
    where.mkdir()
    script = where / "program.py"
    script.write_text(text)
    env = child_env(
        {
            "EXITSAFE_PURE_PYTHON": CORES[core],
            "EXITSAFE_LEDGER": str(where / "ledger-{pid}.json"),
            "PYTHONHASHSEED": "0",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, where


def _finish(core: str, proc: subprocess.Popen[str], where: Path) -> Observed:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        code: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        out, err = proc.communicate()
        code = None
    events: list[Any] = []
    who_of: dict[str, str] = {}
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            events.append(line)
            continue
        if event.get("ev") == "pid":
            who_of[str(event.pop("pid"))] = event["who"]
        events.append(event)
    ledgers: dict[str, Any] = {who: None for who in who_of.values()}
    for path in where.glob("ledger-*.json"):
        pid = path.stem.split("-", 1)[1]
        data = json.loads(path.read_text())
        del data["pid"], data["python"]
        ledgers[who_of.get(pid, f"unknown process {pid}")] = data
    return Observed(core, code, events, ledgers, _stderr_facts(err), out, err)


def run_both(text: str) -> dict[str, Observed]:
    """Run ``text`` under each core (at the same time: two processes)."""
    with tempfile.TemporaryDirectory(prefix="exitsafe-diff-") as tmp:
        started = {core: _start(core, text, Path(tmp)) for core in CORES}
        return {core: _finish(core, *started[core]) for core in CORES}


def _operation_at(events: list[Any], upto: int) -> Optional[int]:
    """The number of the operation under way at event ``upto`` (in the process that
    printed it)."""
    who = events[upto].get("who") if isinstance(events[upto], dict) else None
    current = None
    for event in events[: upto + 1]:
        if isinstance(event, dict) and event.get("ev") == "op" and event.get("who") == who:
            current = event["i"]
    return current


def explain(text: str, steps: list[str], seen: dict[str, Observed]) -> str:
    """A readable account of a disagreement: where it starts, the diff, the program."""
    a, b = seen["compiled"], seen["python"]
    la, lb = a.lines(), b.lines()
    diff = "\n".join(
        difflib.unified_diff(
            [x for _, x in la], [x for _, x in lb], "compiled core", "pure-Python core",
            lineterm="", n=3,
        )
    )
    where = ""
    for (k, x), (_, y) in zip(la, lb):
        if x != y:
            i = _operation_at(a.events, k) if k is not None else None
            if i is not None:
                code = f": {steps[i]}" if i < len(steps) else ""
                where = f"first visible difference during operation {i}{code}\n"
            break
    numbered = "".join(f"  {i:2}: {s}\n" for i, s in enumerate(steps))
    listing = f"--- operations\n{numbered}" if steps else ""
    return (
        f"the cores disagree\n{where}{listing}--- diff\n{diff}\n"
        f"--- program\n{text}\n--- compiled stderr\n{a.raw_stderr[-3000:]}"
        f"\n--- pure-Python stderr\n{b.raw_stderr[-3000:]}"
    )


def assert_same(text: str, steps: Optional[list[str]] = None) -> dict[str, Observed]:
    """Run ``text`` under both cores; fail with a readable diff unless they agree."""
    seen = run_both(text)
    for core, o in seen.items():
        assert o.returncode is not None, (
            f"the program hung under the {core} core\n--- program\n{text}\n"
            f"--- stdout\n{o.stdout[-3000:]}\n--- stderr\n{o.raw_stderr[-3000:]}"
        )
        noise = [e for e in o.events if not isinstance(e, dict)]
        assert not noise, f"stray output under the {core} core: {noise}\n{text}"
    if seen["compiled"].comparable() != seen["python"].comparable():
        again = run_both(text)  # a program that differs from itself is no evidence
        unstable = [c for c in CORES if again[c].comparable() != seen[c].comparable()]
        note = (
            f"NOTE: the program is not deterministic under the {' and '.join(unstable)} "
            "core(s): a second run observed something else\n"
            if unstable
            else "(the same again on a second run of each core)\n"
        )
        raise AssertionError(note + explain(text, steps or [], seen))
    return seen


# ---------------------------------------------------------------- the differential test

_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=SEED is None,
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    + ([Phase.shrink] if SHRINK else []),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _collected_releases(o: Observed, steps: list[str]) -> int:
    """How many release functions and hooks ran during the program's garbage
    collections, and how many of those called exitsafe (what hypothesis steers toward:
    finalizers calling exitsafe are where the cores' paths differ most)."""
    count = 0
    collecting = False
    for e in o.events:
        if not isinstance(e, dict):
            continue
        if e["ev"] == "op":
            collecting = "gc.collect()" in steps[e["i"]]
        elif collecting and e["ev"] in ("release", "hook", "inner"):
            count += 1
    return count


@_settings
@given(programs())
def _differential(p: Program) -> None:
    text, steps = render(p)
    seen = assert_same(text, steps)
    target(float(_collected_releases(seen["compiled"], steps)), label="collected releases")


if SEED is not None:
    _differential = seed(int(SEED))(_differential)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the programs may fork")
def test_both_cores_observe_the_same_for_generated_programs():
    """Every drawn operation sequence gives the same return values, exceptions, states,
    owner counts, release and hook calls (in the same order), ledgers (mid-run and
    written at exit, in every forked child too), exit statuses and exitsafe log lines
    under the compiled core and under the pure-Python one."""
    _differential()


# ---------------------------------------------------------------- signatures and constants

#: Prints, as JSON, what both cores must share: the signature (names, kinds and defaults
#: of the parameters; the compiled functions carry no annotations) and the docstring of
#: every function the compiled core replaces, and the public constants.  Methods are
#: read bound: CPython makes the ``$self`` of a compiled method positional-only in
#: ``inspect.signature`` whatever its text signature says.
SURFACE = textwrap.dedent(
    """
    import inspect, json
    import exitsafe, exitsafe.cffi, exitsafe.ctypes, exitsafe.lowlevel

    registry = exitsafe.Registry("surface")
    handle = registry.track("raw", lambda raw: None)

    def parameters(fn):
        return [
            [p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()
        ]

    replaced = {
        "Registry.track": registry.track,
        "Handle.release": handle.release,
        "Handle.retain": handle.retain,
        "exitsafe.track": exitsafe.track,
        "exitsafe.cffi.track": exitsafe.cffi.track,
        "exitsafe.ctypes.track": exitsafe.ctypes.track,
    }
    out = {
        "core": exitsafe.lowlevel.CORE,
        "functions": {
            name: {"name": fn.__name__, "signature": parameters(fn), "doc": fn.__doc__}
            for name, fn in replaced.items()
        },
        "outcomes": {
            k: sorted(v) if isinstance(v, frozenset) else v
            for k, v in vars(exitsafe.Outcome).items() if k.isupper()
        },
        "all": sorted(exitsafe.__all__),
        "lowlevel": sorted(exitsafe.lowlevel.__all__),
        "modules": {
            f"{module.__name__}.{name}": getattr(getattr(module, name), "__module__", None)
            for module in (exitsafe, exitsafe.lowlevel) for name in module.__all__
        },
        "registry": {
            "init": parameters(exitsafe.Registry),
            "attributes": sorted(n for n in dir(registry) if not n.startswith("_")),
            "defaults": [registry.strict, registry.exit_policy, registry.step_timeout,
                         registry.teardown_timeout],
        },
        "handle": {
            "attributes": sorted(n for n in dir(handle) if not n.startswith("_")),
            "fresh": [handle.state, handle.owners, handle.borrowed, handle.kind, handle.name],
        },
    }
    print(json.dumps(out, sort_keys=True))
    """
)


def _surface(core: str) -> dict[str, Any]:
    env = child_env({"EXITSAFE_PURE_PYTHON": CORES[core]})
    done = subprocess.run(
        [sys.executable, "-c", SURFACE], env=env, capture_output=True, text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    assert data.pop("core") == core
    return data


def test_both_cores_share_signatures_docstrings_and_constants():
    """Every function the compiled core replaces (``Registry.track``, ``Handle.release``,
    ``Handle.retain``, ``exitsafe.track``, ``exitsafe.cffi.track``,
    ``exitsafe.ctypes.track``) has the same name, parameters (names, kinds, defaults) and
    docstring in both cores, and the public constants (the ``Outcome`` values,
    ``exitsafe.__all__`` and ``exitsafe.lowlevel.__all__``, the module each public name
    shows, a new registry's and handle's public attributes and defaults) are the same."""
    compiled, python = _surface("compiled"), _surface("python")
    for name in python["functions"]:
        assert compiled["functions"][name] == python["functions"][name], name
    assert compiled == python


# ---------------------------------------------------------------- disagreements found


def reproducer(body: str) -> str:
    """A program of the differential test's form: :data:`PRELUDE`, ``body``, the report."""
    head = "R_POLICY = 'release'\nS_POLICY = 'release'\nR_LIMIT = None\n"
    return head + PRELUDE + textwrap.dedent(body) + "report()\n"


def test_disagreement_teardown_from_a_collected_release_also_collecting_another_handle():
    """A release function run by a cyclic garbage collection starts the teardown while
    the same collection has found another handle: the compiled core's teardown releases
    that one (``released_at_exit``, its release function runs), the pure-Python core's
    leaks it unreleased (``leaked_after_close``, "collected while the teardown began,
    unseen by it").  Known: "The cores disagree on a teardown started by a release
    function run from a cyclic collection that also collects another handle".  Fails
    until the cores agree."""
    assert_same(
        reproducer(
            """
            a = Box("a")  # each raw object refers to its handle: a reference cycle
            a.handle = exitsafe.track(a, rel("a", "default", "teardown"), name="a")
            b = Box("b")
            b.handle = exitsafe.track(b, rel("b", "default"), name="b")
            del a, b
            with op(0) as o:
                gc.collect()  # a's release runs first and tears the registry down
            """
        )
    )


def test_disagreement_pending_parent_of_a_collected_handle_whose_release_tears_down():
    """A handle whose last owner let go (its release waits for its dependent) and that
    dependent, in a reference cycle with its raw object, are found by one collection; the
    dependent's release function starts the teardown.  The compiled core records the
    parent ``leaked_dependent`` (the dependent ended ``leaked_in_use``); the pure-Python
    core records nothing for it: the parent is neither live nor in the ledger, although
    every handle must end with exactly one outcome.  (The same family as the known
    disagreement above, with a worse symptom.)  Fails until the cores agree."""
    assert_same(
        reproducer(
            """
            parent = exitsafe.track("parent", rel("parent", "default"), name="parent")
            child = Box("child")  # in a reference cycle with its handle
            child.handle = exitsafe.track(
                child, rel("child", "default", "teardown"), name="child", depends_on=[parent]
            )
            parent.release()  # its last owner: the release waits for the child
            del parent, child
            with op(0) as o:
                gc.collect()  # the child's release tears the registry down
            """
        )
    )


def test_disagreement_name_of_a_handle_refused_by_a_closed_strict_registry():
    """``track`` on a strict registry whose teardown began raises
    ``RegistryClosedError`` naming the refused handle: ``handle#0`` in the compiled core,
    ``handle#1`` in the pure-Python core, whose lock-free registration (a track with no
    option) takes a creation number before it finds the registry closed (its locked path,
    a track with an option, says ``handle#0``).  Fails until the cores agree."""
    assert_same(
        reproducer(
            """
            REG["s"].teardown()
            with op(0) as o:
                o(REG["s"].track("a", rel("a", "s")))
            """
        )
    )

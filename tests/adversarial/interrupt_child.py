"""The child program of the interrupt harness (see :mod:`tests.adversarial.interrupt_harness`).

Run as a script in a fresh interpreter (it imports nothing from the tests)::

    python interrupt_child.py SECTION MODE [--stride S | --budget B] [--threads main|all]

For ``N = 1, 1 + S, 1 + 2S, ...`` (``--budget B``: the stride that makes about B runs)
it runs SECTION's set-up in a new registry, then its
action with an *interrupter* installed that delivers SIGINT at the N-th event of
exitsafe's package code, and checks exitsafe's promises afterwards; it stops at the
first N whose run ends without the interrupter firing (the action ran to its end), after
also running the last event of the uninterrupted run.  One JSON line per run that fired
goes to stdout as soon as it is known (a hang loses nothing already printed), then one
``{"done": ...}`` line.

MODE ``line``: a ``sys.settrace`` / ``threading.settrace`` tracer counting every trace
event (``call``, ``line``, ``return``, ``exception``) in exitsafe's code: where a
KeyboardInterrupt surfaces when a debugger, ``coverage`` or a profiler is installed
(Python runs the pending signal handler inside the tracer, and its exception
propagates into the traced frame).  MODE ``opcode``: every instruction of exitsafe's
code, through ``frame.f_trace_opcodes`` where ``sys.settrace`` delivers opcode events,
else (CPython 3.12+ does not reliably) ``sys.monitoring``'s INSTRUCTION events: where
CPython 3.9 acts on a signal without any tracer (it checks after most opcodes).  MODE
``calls``: the same instruction events, counted only at a function's entry and right
after each call: where CPython 3.10+ acts on a signal without any tracer.

"Delivers SIGINT" means: call the SIGINT handler in place at that moment, as CPython
would, so Python's default handler raises ``KeyboardInterrupt`` there, while exitsafe's
own hold of signals during its queued work and teardowns (``exitsafe._interrupts``) is
honoured (its recording handler records the signal, delivered when the hold ends).
``--threads main`` (the default) counts only the main thread's events: signal handlers run
on the main thread only.  ``--threads all`` counts every thread's events and raises
``KeyboardInterrupt`` directly on whichever thread reaches the N-th one (a tracer or a
profiler raising on a worker thread).

The checks after each run (the ``failures`` of a line, each ``[check, detail]``):

``lock-held``        the interrupted thread still holds exitsafe's lock;
``lock-unavailable`` another thread cannot take the lock within a second;
``stranded``         before the teardown, with nothing running, a handle still reads
                     as being released (claimed, never released), or borrowed;
``teardown-raised``  the explicit ``teardown()`` raised;
``waited``           the teardown recorded ``leaked_in_use``: it waited for a release or a
                     borrow nobody runs (``IN_FLIGHT_WAIT`` is lowered here to keep such
                     runs short; the evidence is the outcome, not the time);
``not-ended``        after the teardown a handle is still live;
``outcomes``         a handle the program tracked has not exactly one ledger outcome, or
                     a name has more than one, or the counts disagree with the entries;
``double-release``   a release function or a hook ran twice;
``lost-outcome``     a release function ran without a ``released`` /
                     ``release_failed`` outcome, or a ``released`` outcome without it;
``track-contract``   ``track()`` raised, yet the object was released (its documentation:
                     the caller still owns it), unless the interrupt landed as ``track``
                     returned, at the return of its outermost frame: the handle is then
                     handed over (see ``Registry.track``);
``queued-left``      work is still queued after the teardown;
``claims-left``      after the teardown an address is still reserved, or owned by a live
                     handle, in the adapters' table (a pointer there can never be tracked
                     again);
``signals``          SIGINT is left held back, or exitsafe's hold of signals is left broken
                     (the next teardowns would not hold Ctrl-C back);
``stuck-state``      the thread is left marked as running the queued work (queued
                     releases would never run on it again);
``harness``          the harness itself failed (a bug of this file).
"""

from __future__ import annotations

import argparse
import dis
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter

import exitsafe
from exitsafe import _interrupts, _sync, _teardown
from exitsafe._core import CORE
from exitsafe._pointers import addresses
from exitsafe._record import RELEASING
from exitsafe._state import LOST

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, FrameType
    from typing import Any, Callable, Optional

_PKG = os.path.dirname(os.path.abspath(exitsafe.__file__)) + os.sep
#: exitsafe's own tooling, not its runtime: never a place an interrupt is delivered.  So is
#: ``_usage``, the public functions' wrappers that only word the errors of wrong calls: they
#: hold no state, and a call they pass on is the API call (an interrupt as it returns lands
#: at the boundary, as at the return of the function itself).
_NOT_RUNTIME = (
    _PKG + "testing" + os.sep, _PKG + "lab" + os.sep, _PKG + "_usage.py",
)

#: A teardown waits this long (instead of 5 s) for a release or a borrow in flight, so
#: that a run in which it waits for one nobody runs stays short; ``waited`` says so.
_teardown.IN_FLIGHT_WAIT = 0.01

_ours: dict[CodeType, bool] = {}


def ours(code: CodeType) -> bool:
    """Whether ``code`` is exitsafe's runtime code."""
    found = _ours.get(code)
    if found is None:
        name = code.co_filename
        found = _ours[code] = name.startswith(_PKG) and not name.startswith(_NOT_RUNTIME)
    return found


def _at_return(event: str, what: str) -> bool:
    """Whether an event is a frame's return: its ``return`` event, or the instruction
    returning (``RETURN_VALUE``, ``RETURN_CONST`` on 3.12+)."""
    return event == "return" or what in ("opcode RETURN_VALUE", "opcode RETURN_CONST")


def _handing_over(frame: FrameType) -> bool:
    """Whether what ``frame`` returns goes to the program as it is: every frame of
    exitsafe's runtime code calling it returns at once what its call returns
    (``exitsafe.ctypes.track`` returning ``Adapter.track(...)``), so that its return is
    the API's (else it is the outermost frame of an API call itself)."""
    caller = frame.f_back
    while caller is not None and ours(caller.f_code):
        if not _returns_its_call(caller):
            return False
        caller = caller.f_back
    return True


def _registry_hands_over(code: CodeType, event: str, what: str, lasti: int) -> bool:
    """Whether an event is where the registry's track hands the handle it made to its
    caller in exitsafe's code (an adapter's track): the return of ``Registry.track``, or
    the instruction right after a call of ``reg.track(...)`` (the compiled one has no
    frame; CPython acts on a signal right after a C function returns).  An interrupt there
    drops the handle, which is then released as dropped: ``Registry.track``'s documented
    hand-over, which the adapters' track documents too."""
    if _at_return(event, what):
        return getattr(code, "co_qualname", code.co_name) in ("Registry.track", "track") and (
            code.co_filename.endswith("_registry.py")
        )
    if not event.startswith("opcode"):
        return False
    found = _handover_points.get(code)
    if found is None:
        found = _handover_points[code] = _after_registry_track_calls(code)
    return lasti in found


_handover_points: dict[CodeType, frozenset[int]] = {}


def _after_registry_track_calls(code: CodeType) -> frozenset[int]:
    """Offsets of the instructions right after each ``reg.track(...)`` call in ``code``
    (its arguments make no call: the first call after the method's load is it)."""
    offsets = set()
    instructions = list(dis.get_instructions(code))
    for index, ins in enumerate(instructions):
        if not (ins.argval == "track" and index and instructions[index - 1].argval == "reg"):
            continue
        for position in range(index + 1, len(instructions) - 1):
            if instructions[position].opname.startswith("CALL"):
                offsets.add(instructions[position + 1].offset)
                break
    return frozenset(offsets)


def _returns_its_call(frame: FrameType) -> bool:
    """Whether the instruction after the call ``frame`` is making returns (``return
    f(...)``)."""
    lasti = frame.f_lasti  # (a byte offset on every version: 3.10 multiplies its index)
    for following in dis.get_instructions(frame.f_code):  # (3.11+: lasti is the call's
        if following.offset > lasti:  # last cache entry, which this walk skips)
            return following.opname == "RETURN_VALUE"
    return False


# ---------------------------------------------------------------------- the interrupter


_gaps: dict[CodeType, frozenset[int]] = {}


def _outside_its_try(code: CodeType, offset: int) -> bool:
    """Whether the instruction at ``offset`` is a ``NOT_TAKEN`` that the compiler left out
    of the exception table although the conditional jump it follows is in it: CPython
    3.14's compiler inserts ``NOT_TAKEN`` after its exception handlers are assigned
    (python/cpython#137681), and leaves many of them covered by no handler (3.14.10: 80
    in exitsafe; 3.15.2: none), so that an
    exception there, raised by a tracer of instructions (``f_trace_opcodes``, a
    ``sys.monitoring`` INSTRUCTION tool) in which the signal handler runs, leaves the
    frame past every ``try`` of the source.  No Python code can handle it: such a run is
    reported apart (`Sweep.gaps`), not as exitsafe's failure.  (Nothing acts on a signal
    there without such a tracer; a BRANCH_LEFT callback's exception is raised at the
    jump, which is covered.)"""
    found = _gaps.get(code)
    if found is None:
        entries = getattr(dis.Bytecode(code), "exception_entries", ())

        def covered(at: int) -> bool:
            return any(e.start <= at < e.end for e in entries)

        gaps, previous = set(), None
        for ins in dis.get_instructions(code):
            if (
                ins.opname == "NOT_TAKEN"
                and previous is not None
                and covered(previous.offset)
                and not covered(ins.offset)
            ):
                gaps.add(ins.offset)
            previous = ins
        found = _gaps[code] = frozenset(gaps)
    return offset in found


def _settrace_delivers_opcodes() -> bool:
    """Whether ``sys.settrace`` delivers opcode events for a frame that asks for them at
    its first call (CPython 3.12 and 3.13 do not, reliably: the code is instrumented
    late)."""
    seen = []

    def probe() -> int:
        x = 1
        return x + 1

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            seen.append(1)
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is probe.__code__:
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(tracer)
    try:
        probe()
    finally:
        sys.settrace(None)
    return bool(seen)


#: The call instructions of every supported CPython: a signal is acted on right after
#: one returns (CPython 3.10+ checks for signals there, at function entry and on
#: backward jumps, not after every instruction as 3.9 does).
_CALLS = frozenset({
    "CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX",
    "CALL_METHOD", "CALL_NO_KW",
})


class Interrupter:
    """Delivers SIGINT at the ``at``-th event of exitsafe's code (``at=0``: never; it
    then only counts).

    ``mode``: ``"line"`` (every ``sys.settrace`` event), ``"opcode"`` (every
    instruction), ``"calls"`` (function entry and the instruction after each call: where
    CPython 3.10+ acts on a signal with no tracer installed).
    """

    def __init__(self, mode: str, threads: str, use_monitoring: bool) -> None:
        self.mode = mode
        self.threads = threads
        self.use_monitoring = use_monitoring
        self.at = 0
        self.seen = 0
        self.fired: Optional[dict[str, Any]] = None
        self.main = threading.main_thread().ident
        self.active = False
        self._opnames: dict[CodeType, dict[int, str]] = {}
        self._after_calls: dict[CodeType, frozenset[int]] = {}
        self.monitoring: Any = None
        if use_monitoring:
            self._set_up_monitoring()

    # -- start / stop

    def start(self, at: int) -> None:
        self.at, self.seen, self.fired, self.active = at, 0, None, True
        if self.use_monitoring:
            events = self.monitoring.events
            wanted = events.INSTRUCTION
            if self.mode == "calls":
                wanted |= events.PY_START
            self.monitoring.set_events(self.tool, wanted)
        else:
            sys.settrace(self.tracer)
            threading.settrace(self.tracer)

    def stop(self) -> None:
        self.active = False
        if self.use_monitoring:
            self.monitoring.set_events(self.tool, 0)
        else:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]

    # -- sys.settrace

    def tracer(self, frame: FrameType, event: str, arg: object) -> Any:
        if not self.active or not ours(frame.f_code):
            return None
        if self.mode == "line":
            self.event(frame, event)
        else:
            frame.f_trace_opcodes = True
            if self.mode == "calls":
                self.event(frame, "entry")
        return self.local

    def local(self, frame: FrameType, event: str, arg: object) -> Any:
        if not self.active:
            return None
        if self.mode == "line":
            self.event(frame, event)
        elif event == "opcode":
            self.instruction(frame, frame.f_lasti)
        return self.local

    def instruction(self, frame: FrameType, offset: int) -> None:
        if self.mode == "calls" and offset not in self.after_calls(frame.f_code):
            return
        self.event(frame, "opcode", offset)

    # -- sys.monitoring (CPython 3.12+)

    def _set_up_monitoring(self) -> None:
        mon = self.monitoring = sys.monitoring  # type: ignore[attr-defined]
        for tool in (4, 3, 2, 1):
            try:
                mon.use_tool_id(tool, "exitsafe interrupt harness")
            except ValueError:  # (taken)
                continue
            self.tool = tool
            break
        else:
            raise RuntimeError("no free sys.monitoring tool id")
        disable = mon.DISABLE

        def on_instruction(code: CodeType, offset: int) -> Any:
            if not ours(code):
                return disable  # (never of interest: not asked again for this place)
            if self.mode == "calls" and offset not in self.after_calls(code):
                return disable  # (nor is an instruction that does not follow a call)
            if self.active:
                self.event(sys._getframe(1), "opcode", offset)
            return None

        def on_start(code: CodeType, offset: int) -> Any:
            if not ours(code):
                return disable
            if self.active:
                self.event(sys._getframe(1), "entry", offset)
            return None

        mon.register_callback(self.tool, mon.events.INSTRUCTION, on_instruction)
        mon.register_callback(self.tool, mon.events.PY_START, on_start)

    # -- the count, and the delivery

    def event(self, frame: FrameType, event: str, offset: Optional[int] = None) -> None:
        if self.fired is not None:
            return
        if self.threads == "main" and threading.get_ident() != self.main:
            return
        self.seen += 1
        if self.seen != self.at:
            return
        code = frame.f_code
        line = frame.f_lineno
        lasti = frame.f_lasti if offset is None else offset
        if event == "opcode":
            what = "opcode " + self._opname(code, lasti)
            if line is None:  # (an exception handler's instruction has no line: 3.12+)
                line = f"?@{lasti}"
        else:
            what = event
        self.fired = {
            "event": what,
            # (at the return of the outermost frame of exitsafe's code, or of one whose
            # callers in exitsafe's code only return what it returns: the API returns;
            # or as the registry's track hands its handle to an adapter's track)
            "boundary": (_at_return(event, what) and _handing_over(frame))
            or _registry_hands_over(code, event, what, lasti),
            # (as a finalizer starts, before any of its instructions ran: see
            # exitsafe._live.take_lost; on CPython 3.9 and 3.10 a tracer's first ``line``
            # event comes there too, before the try's SETUP_FINALLY at offset 0)
            "finalizer_entry": code.co_name == "__del__"
            and (
                event in ("call", "entry")
                or (event in ("opcode", "line") and lasti == 0)
            ),
            # (an instruction the compiler left out of its try: see _outside_its_try)
            "compiler_gap": event == "opcode" and _outside_its_try(code, lasti),
            "file": os.path.relpath(code.co_filename, _PKG),
            "line": line,
            "function": getattr(code, "co_qualname", code.co_name),
            "thread": "main" if threading.get_ident() == self.main else "other",
        }
        self.active = False  # one delivery per run
        if self.use_monitoring:
            self.monitoring.set_events(self.tool, 0)
        if threading.get_ident() != self.main:
            raise KeyboardInterrupt("harness: raised on a worker thread")
        handler = signal.getsignal(signal.SIGINT)
        if handler is signal.default_int_handler:
            raise KeyboardInterrupt
        self.fired["handler"] = getattr(handler, "__qualname__", repr(handler))
        if callable(handler):  # exitsafe holds signals back: it records this one
            handler(signal.SIGINT, frame)

    def _opname(self, code: CodeType, offset: int) -> str:
        names = self._opnames.get(code)
        if names is None:
            names = self._opnames[code] = {
                ins.offset: ins.opname for ins in dis.get_instructions(code)
            }
        return names.get(offset, f"@{offset}")

    def after_calls(self, code: CodeType) -> frozenset[int]:
        """Offsets of the instructions right after a call in ``code``."""
        found = self._after_calls.get(code)
        if found is None:
            offsets, previous = set(), None
            for ins in dis.get_instructions(code):
                if previous is not None and previous.opname in _CALLS:
                    offsets.add(ins.offset)
                previous = ins
            found = self._after_calls[code] = frozenset(offsets)
        return found


# ---------------------------------------------------------------------- programs

#: name -> times its release function (or hook) ran, in the current run.
CALLS: Counter[str] = Counter()


def record(raw: Any) -> None:
    """Every handle's release function: counts, no exitsafe code.  A name starting with
    ``fail`` stands for a native release that fails (after it ran)."""
    name = raw if type(raw) is str else raw.name
    CALLS[name] += 1
    if name.startswith("fail"):
        raise OSError(f"{name}: device lost")


class Box:
    """A raw object referring to its own handle: a cycle only a collection frees."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handle: Any = None


class Program:
    """One run's program: a new registry, the handles it holds (by name), every name
    it asked to track, those that got a handle, and those whose ``track()`` raised."""

    def __init__(self) -> None:
        self.reg = exitsafe.Registry("sweep", ledger_limit=None)
        self.held: dict[str, exitsafe.Handle] = {}
        self.tracked: list[str] = []  # got a handle: must end with exactly one outcome
        self.refused: list[str] = []  # track() raised: the caller still owns the object
        self.hooks: list[str] = []  # on_teardown() returned their handle
        self.buffers: dict[str, Any] = {}  # the memory of the pointers tracked (by name)

    def track(self, name: str, raw: Any = None, **options: Any) -> exitsafe.Handle:
        try:
            handle = self.reg.track(
                name if raw is None else raw, record, name=name, **options
            )
        except BaseException:
            self.refused.append(name)
            raise
        self.tracked.append(name)
        self.held[name] = handle
        return handle

    def track_pointer(self, name: str) -> exitsafe.Handle:
        """Track a native pointer of its own through ``exitsafe.ctypes.track`` (the
        adapters' address table: a second track of the address is refused)."""
        import ctypes

        import exitsafe.ctypes

        buffer = self.buffers[name] = ctypes.create_string_buffer(8)
        pointer = ctypes.cast(buffer, ctypes.c_void_p)
        try:
            handle = exitsafe.ctypes.track(
                pointer, lambda raw: record(name), name=name, registry=self.reg
            )
        except BaseException:
            self.refused.append(name)
            raise
        self.tracked.append(name)
        self.held[name] = handle
        return handle

    def hook(self, name: str, **options: Any) -> exitsafe.Handle:
        def run() -> None:
            CALLS[name] += 1

        # (on_teardown() promises nothing when it raises: the hook may run or not, with
        # at most one outcome)
        handle = self.reg.on_teardown(run, name=name, **options)
        self.hooks.append(name)
        self.held[name] = handle
        return handle

    def drop(self, name: str) -> None:
        """The program's last reference to a handle goes (its garbage collection)."""
        del self.held[name]


#: name -> set-up(program) returning the action (what the interrupter interrupts).
SECTIONS: dict[str, Callable[[Program], Callable[[], object]]] = {}
#: Sections whose action runs a collection (``gc.collect()``): the garbage of the
#: runs before is collected first, so that every run's action does the same.
COLLECTING: set[str] = set()


def section(
    name: str, collects: bool = False
) -> Callable[[Callable[[Program], Callable[[], object]]], Any]:
    """Register a section: ``@section("name")`` on a function taking the `Program`, making
    the set-up and returning the action.  ``collects``: the action calls ``gc.collect()``."""

    def register(fn: Callable[[Program], Callable[[], object]]) -> Any:
        SECTIONS[name] = fn
        if collects:
            COLLECTING.add(name)
        return fn

    return register


@section("track")
def _track(p: Program) -> Callable[[], object]:
    p.track("parent")

    def action() -> None:
        p.track("simple")  # the hot path
        p.track("child", depends_on=[p.held["parent"]])
        p.track("option", exit_policy="release")  # the compiled core's Python path

    return action


@section("release")
def _release(p: Program) -> Callable[[], object]:
    p.track("simple")
    p.track("option", exit_policy="release")
    p.track("fail-leaf")  # (its release fails: recorded release_failed, then raised)

    def action() -> None:
        p.held["simple"].release()
        p.held["option"].release()
        try:
            p.held["fail-leaf"].release()
        except OSError:  # (its documented error: recorded release_failed)
            pass

    return action


@section("release_chain")
def _release_chain(p: Program) -> Callable[[], object]:
    # a <- b <- c: a and b let go of their owner first (their release waits for c)
    a = p.track("a")
    b = p.track("b", depends_on=[a])
    p.track("c", depends_on=[b])
    a.release()
    b.release()
    # the same through the chain's Python code in both cores: thread affinity (released
    # here, on its owner thread), and a taint (the failed release of "fail-tb" leaves "ta"
    # leaked, never released from under it)
    fa = p.track("fa", affinity="creator")
    fb = p.track("fb", depends_on=[fa], affinity="creator")
    p.track("fc", depends_on=[fb], affinity="creator")
    fa.release()
    fb.release()
    ta = p.track("ta")
    p.track("fail-tb", depends_on=[ta])
    ta.release()

    def action() -> None:
        try:
            p.held["c"].release()
        finally:
            try:
                p.held["fc"].release()
            finally:
                try:
                    p.held["fail-tb"].release()
                except OSError:  # (its documented error: recorded release_failed)
                    pass

    return action


@section("retain")
def _retain(p: Program) -> Callable[[], object]:
    p.track("simple")
    p.track("option", exit_policy="release")

    def action() -> None:
        p.held["simple"].retain()
        p.held["option"].retain()
        p.held["simple"].release()  # one of two owners: nothing released

    return action


@section("borrow")
def _borrow(p: Program) -> Callable[[], object]:
    p.track("a")
    p.track("b", depends_on=[p.held["a"]])
    p.held["a"].release()

    def action() -> None:
        b = p.held["b"]
        with b.borrow():
            pass
        with b.borrow():
            b.release()  # deferred to the end of the borrow, which releases b, then a

    return action


@section("call")
def _call(p: Program) -> Callable[[], object]:
    import exitsafe.ctypes

    p.track("a")
    p.track("b", depends_on=[p.held["a"]])
    p.held["a"].release()

    def action() -> None:
        b = p.held["b"]
        exitsafe.ctypes.call(lambda raw, n, again: None, b, 1, b)  # (two borrows of b)
        # a release during the call: deferred to the borrows' end, which releases b, then a
        exitsafe.ctypes.call(lambda raw: b.release(), b)

    return action


@section("adapter_track")
def _adapter_track(p: Program) -> Callable[[], object]:
    p.track_pointer("first")

    def action() -> None:
        p.track_pointer("second")
        p.held["first"].release()  # (its address forgotten as it is released)

    return action


@section("add_dependency")
def _add_dependency(p: Program) -> Callable[[], object]:
    p.track("a")
    p.track("b")
    p.track("c")

    def action() -> None:
        p.held["b"].add_dependency(p.held["a"])
        p.held["c"].add_dependency(p.held["b"], p.held["a"])

    return action


@section("detach")
def _detach(p: Program) -> Callable[[], object]:
    a = p.track("a")
    p.track("b", depends_on=[a])
    p.track("simple")
    a.release()

    def action() -> None:
        p.held["simple"].detach()
        p.held["b"].detach()  # a was waiting for b only: released now

    return action


@section("on_teardown")
def _on_teardown(p: Program) -> Callable[[], object]:
    p.track("a")

    def action() -> None:
        p.hook("k1", before=[p.held["a"]])
        p.hook("k2").release()  # registered, then cancelled

    return action


@section("teardown")
def _teardown_section(p: Program) -> Callable[[], object]:
    a = p.track("a")
    b = p.track("b", depends_on=[a])
    p.track("c", depends_on=[b], exit_policy="leak")
    p.track("simple")
    p.hook("k", before=[b])

    def action() -> None:
        p.reg.teardown()

    return action


@section("gc", collects=True)
def _gc(p: Program) -> Callable[[], object]:
    a = p.track("a")
    p.track("b", depends_on=[a])
    p.track("simple")
    p.track("fail-dropped")  # (its release fails: recorded release_failed, and logged)
    a.release()
    del a
    box = Box("cyclic")
    box.handle = p.track("cyclic", raw=box)
    del box

    def action() -> None:
        p.drop("simple")  # its finalizer releases it
        p.drop("fail-dropped")
        p.drop("b")  # its finalizer releases b, then a
        p.drop("cyclic")
        gc.collect()  # (the only way the cycle goes)

    return action


# ---------------------------------------------------------------------- one run


class Prober:
    """Another thread, asked after each run to take exitsafe's lock within a second (one
    thread for every run: starting one per run cost more than the runs)."""

    def __init__(self) -> None:
        self.ask = threading.Event()
        self.done = threading.Event()
        self.got = False
        threading.Thread(target=self._serve, name="lock prober", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.ask.wait()
            self.ask.clear()
            self.got = bool(_sync.acquire(True, 1.0))
            if self.got:
                _sync.release()
            self.done.set()

    def other_thread_takes_lock(self) -> bool:
        self.done.clear()
        self.ask.set()
        if not self.done.wait(5.0):
            return False
        return self.got


_prober: list[Prober] = []


def other_thread_takes_lock() -> bool:
    if not _prober:
        _prober.append(Prober())
    return _prober[0].other_thread_takes_lock()


def stranded(p: Program) -> list[str]:
    """Handles the program still holds that read as being released, or borrowed, while
    nothing runs (the action is over, on the only thread that ran it)."""
    out = []
    for name, h in p.held.items():
        if h._state == RELEASING:
            out.append(f"{name} left releasing")
        if h._borrows:
            out.append(f"{name} left borrowed ({h._borrows})")
    return out


def stuck_state() -> list[tuple[str, str]]:
    """exitsafe's process-wide state an interrupt must not leave behind (each is reset
    here once reported, so that the next run starts clean): signals held back for good,
    or the hold of signals broken for the next teardowns; this thread marked as running
    the queue (queued releases would never run on it again)."""
    out = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        out.append(("signals", "SIGINT is still held back (Ctrl-C only recorded)"))
        signal.signal(signal.SIGINT, signal.default_int_handler)
    depth = _interrupts._state["depth"]
    if depth:
        out.append(("signals", f"the hold of signals is left at depth {depth}"))
        _interrupts._state.update(depth=0, at_exit=False, drop=False, thread=0)
        _interrupts._saved.clear()
        _interrupts._pending.clear()
    if _sync._draining:
        out.append(("stuck-state", "this thread is left marked as running the queued work"))
        _sync._draining.clear()
    return out


def run_once(name: str, inter: Optional[Interrupter], at: int) -> dict[str, Any]:
    """Set-up, the action interrupted at ``at`` (0: not), the checks."""
    CALLS.clear()
    p = Program()
    action = SECTIONS[name](p)
    if name in COLLECTING:
        gc.collect()  # (its action collects: not another run's garbage, then)
    gc.disable()  # no collection of another run's garbage inside the counted action
    raised: Optional[str] = None
    try:
        if inter is not None:
            inter.start(at)
        try:
            action()
        except KeyboardInterrupt:
            raised = "KeyboardInterrupt"
        except Exception as exc:  # what the interrupt turned into (an exitsafe error)
            raised = repr(exc)
        finally:
            if inter is not None:
                inter.stop()
    finally:
        gc.enable()
    del action
    fired = inter.fired if inter is not None else None
    seen = inter.seen if inter is not None else 0
    failures: list[tuple[str, str]] = []

    if _sync.reentered():
        failures.append(("lock-held", "the interrupted thread still holds the lock"))
        while _sync.reentered():
            _sync.release()
    if not other_thread_takes_lock():
        failures.append(("lock-unavailable", "another thread waited 1 s for the lock"))
    for what in stranded(p):
        failures.append(("stranded", what))
    failures.extend(stuck_state())

    # A KeyboardInterrupt that exitsafe held back and delivered when its hold ended may
    # still be pending (CPython acts on it after a call): let it land here, outside the
    # teardown that the checks below run.
    try:
        for _ in range(3):
            time.sleep(0)
    except KeyboardInterrupt:
        pass
    try:
        p.reg.teardown()
    except BaseException as exc:
        failures.append(("teardown-raised", repr(exc)))
    if _sync.reentered():
        failures.append(("lock-held", "after the teardown"))
        while _sync.reentered():
            _sync.release()
    if _sync.pending():
        failures.append(("queued-left", f"{len(_sync.deferred)} item(s)"))
    claims, reserved = addresses.shared_with_core()
    # (an entry left to a handle that ended is harmless: a new track of the address finds
    # no live owner; a reservation, or a live owner, refuses every track of it for good)
    refusing = [key for key, entry in claims.items()
                if entry is reserved or addresses.get(key) is not None]
    if refusing:
        failures.append(("claims-left", f"{len(refusing)} address(es) still claimed"))
    claims.clear()

    entries = p.reg.ledger()
    counts = p.reg.ledger_counts()
    per_name: dict[str, list[str]] = {}
    for e in entries:
        per_name.setdefault(e.name, []).append(e.outcome)
    if sum(counts.values()) != len(entries):
        failures.append(("outcomes", f"counts {counts} vs {len(entries)} entries"))
    for n, outs in sorted(per_name.items()):
        if len(outs) > 1:
            failures.append(("outcomes", f"{n} has {len(outs)} outcomes {outs}"))
        if "leaked_in_use" in outs:
            failures.append(("waited", f"{n} ended leaked_in_use"))
    missing = [n for n in p.tracked + p.hooks if n not in per_name]
    lost = [e for e in entries if e.outcome == "leaked_interrupted" and e.detail == LOST]
    # The one loss exitsafe cannot prevent, recorded instead: an interrupt as the pure
    # core's finalizer starts (see exitsafe._live.take_lost).
    excused = bool((fired or {}).get("finalizer_entry")) and len(lost) == len(missing) <= 1
    if lost and not excused:
        failures.append(("outcomes", f"{len(lost)} lost finalizer(s), missing {missing}"))
    for n in [] if excused else missing:
        failures.append(("outcomes", f"{n} has no outcome"))
    for n, h in p.held.items():
        if h.state == "live":
            failures.append(("not-ended", f"{n} still live after the teardown"))
    for n, times in sorted(CALLS.items()):
        if times > 1:
            failures.append(("double-release", f"{n} ran {times} times"))
    for n in set(per_name) | set(CALLS):
        outs = per_name.get(n, [])
        ran = CALLS.get(n, 0)
        released = any(o in ("released", "released_at_exit", "hook_ran") for o in outs)
        failed = any(o in ("release_failed", "hook_failed") for o in outs)
        if ran and not (released or failed):
            failures.append(("lost-outcome", f"{n} ran, outcome {outs}"))
        if released and not ran:
            failures.append(("lost-outcome", f"{n} recorded {outs} but never ran"))
        if n in p.refused and n not in p.tracked and ran and not (fired or {}).get("boundary"):
            failures.append(("track-contract", f"track({n!r}) raised, yet {n} was released"))
    p.held.clear()
    return {
        "at": at,
        "seen": seen,
        "fired": fired,
        "raised": raised,
        "failures": failures,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("section")
    ap.add_argument("mode", choices=("line", "opcode", "calls"))
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument(
        "--budget", type=int, default=0,
        help="at most about this many runs: the stride is chosen from the number of "
        "events (0: --stride as given)",
    )
    ap.add_argument("--threads", choices=("main", "all"), default="main")
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    unraisable: list[str] = []
    sys.unraisablehook = lambda u: unraisable.append(
        f"{type(u.exc_value).__name__} in {u.object!r}"
    )
    use_monitoring = args.mode != "line" and not _settrace_delivers_opcodes()
    inter = Interrupter(args.mode, args.threads, use_monitoring)
    out = sys.stdout

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    # The uninterrupted run: how many events there are (every run is the same until
    # its delivery), and that the section itself is sound.  Twice: the first run does
    # what only a first run does (imports, caches), the counted runs are all alike.
    run_once(args.section, inter, 0)
    base = run_once(args.section, inter, 0)
    total = base["seen"]
    if base["failures"] or base["raised"]:
        emit({"at": 0, "fired": None, "failures": [["harness", f"uninterrupted run: {base}"]]})
    stride = max(1, args.stride)
    if args.budget > 0:
        stride = max(stride, -(-total // args.budget))
    points = list(range(1, total + 1, stride))
    if total and points[-1] != total:
        points.append(total)
    points.append(total + 1)  # must end without a delivery
    fired = 0
    for at in points:
        unraisable.clear()
        try:
            result = run_once(args.section, inter, at)
        except BaseException:
            emit({"at": at, "fired": inter.fired,
                  "failures": [["harness", traceback.format_exc()]]})
            continue
        if result["fired"] is None:
            if at <= total:
                result["failures"].append(["harness", f"no delivery at {at} of {total}"])
                emit(result)
            break
        fired += 1
        if unraisable:
            result["unraisable"] = list(unraisable)
        if result["failures"]:
            emit(result)
    emit({
        "done": True,
        "section": args.section,
        "mode": args.mode,
        "monitoring": use_monitoring,
        "core": CORE,
        "python": sys.version.split()[0],
        "events": total,
        "runs": fired,
        "stride": stride,
    })


if __name__ == "__main__":
    main()

"""Threads at exit: the borrow gate, parking, declared workers, thread-affine releases.

The registry calls these when a teardown has begun (or, for thread-affine handles,
when a release becomes due on a thread that does not own the handle).  Nothing here
holds exitsafe's lock while it waits.

* **Borrows held by a thread.**  Each thread keeps the handles it is borrowing, so a
  teardown never waits for a borrow held by its own thread.
* **Parking.**  Once a registry's teardown has begun, a ``borrow()`` on a thread that
  is not the teardown's must not enter native code any more.  A daemon thread (the
  kind that is still running at exit, and any thread native code created) is parked:
  it blocks, with every signal masked, until the process ends; it holds no lock and
  not the GIL, so the exit goes on.  A non-daemon thread, which the interpreter would
  wait for, gets [`HandleClosedError`][exitsafe.HandleClosedError] instead.
* **Workers.**  ``exitsafe.worker(thread, stop=..., uses=[...])`` is a teardown hook
  that runs before any handle the thread uses is released: it asks the thread to stop
  and joins it, bounded.
* **Thread-affine handles.**  A release that becomes due on another thread is queued
  for the owning thread, which runs it at its next exitsafe call or
  ``exitsafe.lowlevel.run_pending()``.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (built in; typeshed has no stub)
import _thread
import sys

from ._record import Record as Node
from ._record import queue_for

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn, Optional

_get_ident = _thread.get_ident

# ---------------------------------------------------------------------- borrows held

_local = _thread._local()


def held() -> list[Node]:
    """The handles the calling thread is borrowing right now (innermost last)."""
    try:
        stack: list[Node] = _local.held
    except AttributeError:
        stack = _local.held = []
    return stack


def forget_held(node: Node) -> None:
    stack = held()
    if stack and stack[-1] is node:
        stack.pop()
    else:
        try:
            stack.remove(node)
        except ValueError:  # entered before a fork on another thread: nothing to forget
            pass


def borrowing_in(state: object) -> bool:
    """Whether the calling thread is borrowing a handle of the registry whose state is
    ``state``: it is inside a call that registry's teardown waits for."""
    try:
        stack: list[Node] = _local.held
    except AttributeError:
        return False
    return any(node._registry is state for node in stack)


def held_here(node: Node) -> int:
    """How many borrows of ``node`` the calling thread holds."""
    try:
        return int(_local.held.count(node))
    except AttributeError:
        return 0


# ---------------------------------------------------------------------- parking


#: CPython 3.12+: the main thread's ident, kept right across a fork.
_main_thread_ident = getattr(_thread, "_get_main_thread_ident", None)
#: Before 3.12, where ``threading`` is not loaded (or already cleared, late in the exit):
#: the main thread's ident as last known (see `note_main_thread`), else None.
_known_main: list[Optional[int]] = [None]


def note_main_thread() -> None:
    """Remember the main thread's ident while it can still be asked (the exit teardown
    calls this on the main thread, before the interpreter clears ``threading``)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        _known_main[0] = threading.main_thread().ident


def main_ident() -> Optional[int]:
    """The main thread's ident, or ``None`` when it cannot be told (see `is_main_thread`)."""
    if _main_thread_ident is not None:
        return int(_main_thread_ident())
    threading = sys.modules.get("threading")
    return threading.main_thread().ident if threading is not None else _known_main[0]


def is_main_thread() -> bool:
    """Whether the calling thread is the main thread (True when that cannot be told: the
    caller then never parks it).  Imports nothing, and still right late in the exit, when
    the interpreter may have cleared ``threading`` from ``sys.modules`` (the main thread
    then runs the modules' finalizers)."""
    if _main_thread_ident is not None:
        return bool(_get_ident() == _main_thread_ident())
    threading = sys.modules.get("threading")
    main = threading.main_thread().ident if threading is not None else _known_main[0]
    return main is None or bool(_get_ident() == main)


def is_daemon_thread() -> bool:
    """Whether the calling thread is one the interpreter does not wait for at exit.

    Never the main thread.  Imports nothing (see `park`): without ``threading`` loaded,
    another thread was started with ``_thread``, which the interpreter never waits for.
    """
    if is_main_thread():
        return False
    threading = sys.modules.get("threading")
    return threading is None or bool(threading.current_thread().daemon)


#: The idents of the threads parked for good (by a borrow refused in the exit, by quiesce).
_parked: set[int] = set()

#: The idents of exitsafe's own service threads (the signal watcher, `exitsafe._watcher`):
#: they run none of the program's code and use no handle, so they are never quiesced and
#: never counted as running elsewhere.
own: set[int] = set()


def running_elsewhere() -> list[int]:
    """The idents of the other threads that may still run Python or native code: every
    thread with a Python frame but this one and the parked ones.  A thread idle in a wait
    counts (it may wake); a native thread that never entered Python is not seen."""
    me = _get_ident()
    return [
        ident
        for ident in sys._current_frames()
        if ident != me and ident not in _parked and ident not in own
    ]


def park() -> NoReturn:
    """Block the calling thread until the process ends.  Never returns.

    Every signal is masked first (POSIX), so a signal can never wake the thread: it
    would have to run Python code again, which late in an exit ends or hangs it.
    Nothing is imported on the way (``_signal`` is built in and loaded at start-up): a
    thread parked during the exit may be frozen at any moment, and one frozen inside an
    import holds the import locks that the main thread's finalization still takes (a
    hang at exit, seen on CPython 3.15).
    """
    _parked.add(_get_ident())  # (a set's add: nothing imported, no lock of exitsafe)
    try:
        if hasattr(_signal, "pthread_sigmask"):
            _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    except (OSError, ValueError):  # masking is best effort; parking itself still holds
        pass
    lock = _thread.allocate_lock()
    lock.acquire()
    while True:
        lock.acquire()  # never released: blocks without holding the GIL


# ---------------------------------------------------------------------- workers


class StillRunning(Exception):
    """A step that bounds itself ran out of time (a worker that did not stop)."""


def poll(busy: Callable[[], Any], bound: float) -> Any:
    """Call ``busy()`` until what it returns is empty or ``bound`` seconds have passed,
    pausing between calls (0.5 ms, doubling up to 10 ms); return its last result (what
    was still busy at the bound).  For waits with nothing to wait on: threads to park,
    sections to end."""
    from time import monotonic, sleep

    deadline = monotonic() + bound
    pause = 0.0005
    while True:
        found = busy()
        if not found or monotonic() >= deadline:
            return found
        sleep(pause)
        pause = min(pause * 2, 0.01)


def joinable(thread: Any) -> Optional[str]:
    """How to wait for ``thread``: ``"join"`` (``join(timeout)`` and ``is_alive()``: a
    ``threading.Thread``, a ``multiprocessing.Process``), ``"wait"`` (``wait(ms)`` and
    ``isRunning()``: Qt's ``QThread``), or ``None`` (neither)."""
    if callable(getattr(thread, "join", None)) and callable(getattr(thread, "is_alive", None)):
        return "join"
    if callable(getattr(thread, "wait", None)) and callable(getattr(thread, "isRunning", None)):
        return "wait"
    return None


def worker_label(thread: Any) -> str:
    """The name a worker is shown by: its ``name``, Qt's ``objectName()``, or its type."""
    name = getattr(thread, "name", None)
    if isinstance(name, str) and name:
        return name
    object_name = getattr(thread, "objectName", None)
    if callable(object_name):
        try:
            label = object_name()
        except Exception:  # (a label is cosmetic: a broken objectName falls back)
            label = None
        if isinstance(label, str) and label:
            return label
    return type(thread).__name__


class WorkerStop:
    """The hook of ``exitsafe.worker``: ask the thread to stop (and wake it), then wait
    for it to end, bounded."""

    __slots__ = ("failure", "requested", "stop", "thread", "timeout", "waits_by", "wake")

    def __init__(self, thread: Any, stop: Any, timeout: float, wake: Any = None) -> None:
        self.thread = thread
        self.stop = stop
        self.timeout = timeout
        self.wake = wake
        self.waits_by = joinable(thread)
        self.requested = False
        #: What the stop request or the wake action raised (the hook raises it after
        #: the wait, so the ledger records it even when the early phase made the request).
        self.failure: Optional[BaseException] = None

    def request_stop(self) -> None:
        """Ask once: set the event, or call the stop function; then the wake action
        (run even if the stop request raised)."""
        if self.requested:
            return
        self.requested = True
        try:
            stop = self.stop
            if stop is not None:
                setter = getattr(stop, "set", None)
                if callable(setter):
                    setter()
                else:
                    stop()
        except BaseException as exc:
            self.failure = exc
        try:
            if self.wake is not None:
                self.wake()
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
        if self.failure is not None:
            raise self.failure

    def __call__(self) -> None:
        try:
            self.request_stop()
        except BaseException:  # (kept in self.failure: raised once the wait is over)
            pass
        try:
            self._wait()
        finally:
            failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _wait(self) -> None:
        thread = self.thread
        bound = min(self.timeout, _thread.TIMEOUT_MAX)  # (beyond: OverflowError)
        if self.waits_by == "join":
            if getattr(thread, "ident", 0) is None or getattr(thread, "ident", 0) == _get_ident():
                return  # never started, or the teardown runs on the worker itself
            thread.join(bound)
            alive = thread.is_alive()
        else:
            if not thread.isRunning():
                return  # never started, or already ended
            thread.wait(max(1, int(bound * 1000)))  # (Qt: milliseconds)
            alive = thread.isRunning()
        if alive:
            raise StillRunning(
                f"worker {worker_label(thread)!r} still running {self.timeout:.3g} s after it "
                f"was asked to stop; it is parked at its next borrow"
            )


# ---------------------------------------------------------------------- thread affinity

#: owner thread (a threading.Thread, not its ident: idents are reused once a thread
#: ends) -> releases queued for it (guarded by exitsafe's lock).
pending: dict[Any, list[Node]] = {}


def affinity_owner(affinity: object) -> Any:
    """The thread ``affinity`` names: ``"creator"``, ``"main"`` or ``None``."""
    if affinity is None:
        return None
    if affinity in ("creator", "main"):
        import threading

        return threading.current_thread() if affinity == "creator" else threading.main_thread()
    if isinstance(affinity, str):
        raise ValueError(f"affinity must be 'creator', 'main' or None, got {affinity!r}")
    raise TypeError(f"affinity must be 'creator', 'main' or None, got {affinity!r}")


def on_owner_thread(node: Node) -> bool:
    """Whether the calling thread may run ``node``'s release (it has no affinity, or
    this is its owner)."""
    owner = node._affinity
    if owner is None:
        return True
    import threading

    return owner is threading.current_thread()


def queue_for_owner(node: Node) -> None:
    """Queue ``node`` (claimed) for its owning thread, named as its releaser from then on
    (the caller holds the lock).  Queued once, even when called again after an
    interrupt."""
    owner = node._affinity
    queue = pending.setdefault(owner, [])
    if node not in queue:
        queue.append(node)
    queue_for(node, owner.ident or 0)


def take_mine() -> list[Node]:
    """The releases queued for the calling thread (the caller holds the lock)."""
    import threading

    return pending.pop(threading.current_thread(), [])


def take_registry(registry: object) -> list[Node]:
    """Remove and return every queued release of ``registry`` (a registry's state; the
    caller holds the lock)."""
    taken: list[Node] = []
    for owner in list(pending):
        mine = [n for n in pending[owner] if n._registry is registry]
        if mine:
            rest = [n for n in pending[owner] if n._registry is not registry]
            if rest:
                pending[owner] = rest
            else:
                del pending[owner]
            taken += mine
    return taken


class CpuWatch:
    """Whether threads are computing, told from their scheduler statistics (Linux:
    ``/proc/self/task/<tid>/schedstat``: the nanoseconds a thread ran, the nanoseconds it
    waited for a CPU, and how many times it was given one).  Over a look of at least
    `LOOK` seconds, a thread *computes* when it was runnable (running, or ready to run and
    waiting for a CPU) for at least `SHARE` of the wall time, each time it ran for at
    least `SLICE` seconds on average; or when it is runnable at the look's end and ran that
    long a time: the kernel counts a wait for a CPU only once the wait ends, so a thread
    starved of a CPU for the end of the look, or all of it, shows too little.  A thread
    blocked in a wait (a lock, a queue, ``select``) runs only for its wake-ups, tens of
    microseconds each, however often it wakes (an event loop polling every half
    millisecond) and however long it then waits for a CPU on a loaded machine, and is
    runnable only during them; one in a long C call that is not a wait (a hash, a
    compression) runs for whole time slices, milliseconds, and is runnable all the time
    (measured on a 2-core machine with 4 busy processes: 1 to 4 ms per slice, runnable
    90-100 %; an event loop polling every 0.5 ms: 0.03 ms per slice).  Where no
    statistics can be read (another platform, a thread ``threading`` does not know),
    `computing` is ``None``: the caller decides without it.  Reads one or two files per
    thread and look; takes no lock but ``threading``'s own (``threading.enumerate``),
    which no thread it watches can hold in its own code."""

    SHARE = 0.5
    SLICE = 0.00025
    LOOK = 0.02

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, tuple[int, int, int]]] = {}

    def computing(self, ident: int, final: bool = False) -> Optional[bool]:
        """Whether thread ``ident`` computes; ``True`` too while the look is shorter
        than `LOOK` (ask again).  ``final`` (the caller's bound is hit, no later look will
        come): judged on whatever look there is, ``None`` without one."""
        from time import monotonic

        stats = schedstat(ident)
        if stats is None:
            return None
        now = monotonic()
        seen = self._seen.get(ident)
        if seen is None or stats[0] < seen[1][0]:  # (the first look, or another thread's)
            self._seen[ident] = (now, stats)
            return None if final else True
        wall = now - seen[0]
        if wall < self.LOOK and not (final and wall > 0):
            return True  # (too short a look to tell: ask again)
        self._seen[ident] = (now, stats)
        ran, waited, slices = (new - old for new, old in zip(stats, seen[1]))
        if ran + waited >= self.SHARE * wall * 1e9 and ran >= self.SLICE * 1e9 * max(slices, 1):
            return True
        # The kernel adds a wait for a CPU to the statistics only once the thread gets
        # one: a thread runnable and still waiting for a CPU at the look's end shows too
        # little (nothing at all when starved the whole look).  A hash thread on a loaded
        # machine was judged idle, and released under, twice in CI (once starved the whole
        # look, once part of it).  Its state tells: runnable ("R"), or asleep in a wait;
        # a waiting thread caught runnable in a wake-up (a poller) still ran only tens of
        # microseconds a time.
        return (slices == 0 or ran >= self.SLICE * 1e9 * slices) and state(ident) == "R"


def schedstat(ident: int) -> Optional[tuple[int, int, int]]:
    """Thread ``ident``'s scheduler statistics: (nanoseconds it ran, nanoseconds it
    waited for a CPU, how many times it was given one), from
    ``/proc/self/task/<tid>/schedstat``; ``None`` where they cannot be read (not Linux,
    a kernel without them, a thread ``threading`` does not know, or gone).  Takes no lock
    but ``threading``'s own (``threading.enumerate``)."""
    raw = _task_file(ident, "schedstat")
    if raw is None:
        return None
    try:
        ran, waited, slices = raw.split()[:3]
        return int(ran), int(waited), int(slices)
    except ValueError:  # (no schedstat in this kernel)
        return None


def state(ident: int) -> Optional[str]:
    """Thread ``ident``'s scheduler state, from ``/proc/self/task/<tid>/stat``: ``"R"``
    running or runnable, ``"S"`` asleep (a wait), ``"D"``...; ``None`` where it cannot be
    read (as `schedstat`)."""
    raw = _task_file(ident, "stat")
    fields = raw.rsplit(b")", 1)[-1].split() if raw is not None else []
    return fields[0].decode("ascii", "replace") if fields else None


def _task_file(ident: int, name: str) -> Optional[bytes]:
    """The file ``name`` of thread ``ident`` under ``/proc/self/task/<tid>/``; ``None`` off
    Linux, for a thread ``threading`` does not know, or one gone."""
    if not sys.platform.startswith("linux"):
        return None
    import threading

    native = None
    for thread in threading.enumerate():
        if thread.ident == ident:
            native = getattr(thread, "native_id", None)
    if native is None:
        return None
    try:
        with open(f"/proc/self/task/{native}/{name}", "rb") as file:
            return file.read()
    except OSError:  # (gone)
        return None


def thread_name(ident: int) -> str:
    import threading

    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return f"thread {ident}"


def after_fork_in_child() -> None:
    """The parent's other threads do not exist in a child: their queues go."""
    pending.clear()
    _parked.clear()
    own.clear()


def name_of(fn: Callable[..., Any]) -> Optional[str]:
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else None

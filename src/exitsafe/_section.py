"""Native sections with no object: ``with exitsafe.native("cv2"):``.

A stateless native library (OpenCV's functions, a codec's module functions, a numpy C
loop) has no object to borrow, yet a thread inside it when the process ends aborts or
crashes it.  A *section* is a gate with no object: one handle per ``(registry, name)``,
made on first use, whose release does nothing (kind ``"native section"``, named
``"native <name>"``).  Entering a section borrows it; so the exit teardown waits (bounded)
for the sections in flight before its first release, and a later entry on a daemon thread at
exit parks that thread before it gets in (on any other thread, or after an explicit
teardown, it raises `HandleClosedError`).
"""

from __future__ import annotations

from ._adopt import registry_arg
from ._gate import Borrow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from ._handle import Handle
    from ._registry import Registry

__all__ = ["native"]

#: (registry, name) -> the section's handle.  Filled with ``setdefault`` (atomic, also on
#: a free-threaded build): two threads making the same gate at once keep one.
_gates: dict[tuple[object, str], Handle] = {}
#: registry -> its first gate (the registry's wait hook is registered once).
_waits: dict[object, Handle] = {}


def _nothing(_raw: object) -> None:
    """A section holds no native object: its release does nothing."""


def native(name: str, *, registry: Optional[Registry] = None) -> Borrow:
    """A section of native code with no object: ``with exitsafe.native("cv2"): ...``.

    Inside the block the thread is *in* the library named ``name``: the exit teardown
    waits for every section in flight to end (bounded by the step timeout, or 5 seconds,
    then the section is recorded ``leaked_in_use``), and a thread entering a section
    after that parks there at exit if it is a daemon thread (it never gets in), or gets
    `HandleClosedError`.  The section's ledger entry is ``"native <name>"``.  Sections
    nest and may be entered from any number of threads at once; entering costs one
    borrow (no lock held while the block runs).

    Args:
        name: the library's name (any non-empty string; one gate per name and registry).
        registry: the registry of the gate; `None`: the default registry.

    Returns:
        A context manager (its `__enter__` returns `None`).

    Raises:
        HandleClosedError: on entering, once the gate's teardown began (but on a daemon
            thread at exit, which parks instead).

    Example:
        ```python
        import exitsafe

        with exitsafe.native("cv2"):
            pass  # cv2.GaussianBlur(frame, (5, 5), 0)
        ```
    """
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"exitsafe.native() needs a library name (a non-empty str), got {name!r}: "
            f"write with exitsafe.native('cv2'): ..."
        )
    reg = registry_arg(registry)
    key = (reg, name)
    gate = _gates.get(key)
    if gate is None:
        gate = _make_gate(reg, key, name)
    return gate.borrow()


def _make_gate(reg: Registry, key: tuple[object, str], name: str) -> Handle:
    made = reg.track(None, _nothing, kind="native section", name=f"native {name}")
    gate = _gates.setdefault(key, made)
    if gate is not made:
        made.release()  # (another thread made it first: ours goes, releasing nothing)
        return gate
    if _waits.setdefault(reg, made) is made:  # (the registry's first section)
        reg.on_teardown(_SectionsWait(reg), name="native sections")
    return gate


class _SectionsWait:
    """A registry's first teardown step: wait until no thread is inside one of its
    sections (bounded).  A hook with no dependency, so it runs before every handle's
    step; the gates are closed by then, so no thread gets in any more."""

    __slots__ = ("registry",)

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def __call__(self) -> None:
        from . import _config, _process, _threads
        from ._teardown import IN_FLIGHT_WAIT

        reg = self.registry
        step = reg.step_timeout or _config.seconds("EXITSAFE_STEP_TIMEOUT")
        # Under a step timeout this hook runs on a worker abandoned at that bound: it
        # decides a little before, so that what it found is what the ledger says.
        bound = step * 0.8 if step is not None else IN_FLIGHT_WAIT
        busy: list[str] = _threads.poll(
            lambda: [g.name for (r, _), g in list(_gates.items()) if r is reg and g.borrowed],
            bound,
        )
        if busy:
            detail = (
                f"still inside native section(s) {', '.join(busy)} after {bound:.3g} s "
                f"(a thread in a native library may use anything)"
            )
            _process.set_threads_running(detail)  # (every later step leaks: see _teardown)
            from ._threads import StillRunning

            raise StillRunning(detail)

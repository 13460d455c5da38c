"""Ready-made exit policies and a way to combine them.

An exit policy decides, at teardown, whether a live handle is released
natively (``"release"``) or deliberately leaked (``"leak"``: no native call,
the OS reclaims the memory at process exit).  A policy is ``"release"``,
``"leak"`` or a callable taking an
[`exitsafe.lowlevel.HandleInfo`][exitsafe.lowlevel.HandleInfo] (a read-only
snapshot of the handle: ``raw``, ``kind``, ``name``, ``thread_id``,
``created_on_main_thread``, ``inherited``...) and returning one of the two
strings; it runs on the thread doing the teardown, outside exitsafe's lock,
under the same time bound as the release it decides (the step timeout), and
a policy that raises or answers anything else leaks the handle.
``EXITSAFE_AT_EXIT=release|leak`` overrides every policy of every registry.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Union

    from ._handle import HandleInfo

    Policy = Union[str, Callable[[HandleInfo], str]]

__all__ = ["any_leak", "leak_if_foreign_thread", "leak_in_forked_child"]


def leak_if_foreign_thread(info: HandleInfo) -> str:
    """Leak a handle created on a thread other than the main thread; release the rest.

    ONNX Runtime's Node.js binding fixed its exit crash this way: objects born on worker
    threads may belong to per-thread runtime state that is already gone at exit.

    Args:
        info: the handle being decided; its
            [`created_on_main_thread`][exitsafe.lowlevel.HandleInfo] is what counts.

    Returns:
        `"release"` for a handle created on the main thread, `"leak"` otherwise.

    Example:
        ```python
        from exitsafe.policies import leak_if_foreign_thread

        session = exitsafe.track(ptr, lib.session_free, exit_policy=leak_if_foreign_thread)
        ```
    """
    return "release" if info.created_on_main_thread else "leak"


def leak_in_forked_child(info: HandleInfo) -> str:
    """Leak every handle when the teardown runs in a process produced by `os.fork()`.

    Handles *inherited* from the parent are never released in a child in any case; this
    policy also leaks the handles the child created itself, for runtimes that are not
    fork-safe at all.

    Args:
        info: the handle being decided (not consulted: only the process matters).

    Returns:
        `"leak"` in a forked child, `"release"` in the process that imported exitsafe.
    """
    from . import _sync

    return "leak" if _sync.generation else "release"


def any_leak(*policies: Policy) -> Callable[[HandleInfo], str]:
    """Combine policies: leak when any of them says leak, release otherwise.

    Args:
        *policies: each `"release"`, `"leak"` or a callable policy.  At teardown they are
            consulted in order, on the teardown thread, and the first `"leak"` wins (the
            later ones are not called).

    Returns:
        A policy (a callable taking a [`HandleInfo`][exitsafe.lowlevel.HandleInfo]) to pass as
            `exit_policy`; its `__name__` lists the combined policies.

    Raises:
        ValueError: an element is neither `"release"`, `"leak"` nor callable.

    Example:
        ```python
        from exitsafe.policies import any_leak, leak_if_foreign_thread, leak_in_forked_child

        registry = exitsafe.Registry(
            "gpu", exit_policy=any_leak(leak_if_foreign_thread, leak_in_forked_child))
        ```
    """
    for policy in policies:
        if policy not in ("release", "leak") and not callable(policy):
            raise ValueError(f"not an exit policy: {policy!r}")

    def combined(info: HandleInfo) -> str:
        for policy in policies:
            verdict = policy if isinstance(policy, str) else policy(info)
            if verdict == "leak":
                return "leak"
        return "release"

    combined.__name__ = (
        "any_leak("
        + ", ".join(p if isinstance(p, str) else getattr(p, "__name__", repr(p)) for p in policies)
        + ")"
    )
    return combined

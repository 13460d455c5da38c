"""Running one teardown step with a time limit.

Without a limit a step runs inline, on the thread doing the teardown.  With a
limit it runs on a daemon worker thread while the tearing-down thread waits; a
step that overruns is *abandoned*: its worker is left blocked (a daemon thread
never keeps the process alive) and a fresh worker runs the next step.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


class _Worker:
    __slots__ = ("_done", "_error", "_go", "_task")

    def __init__(self) -> None:
        import threading

        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._task: Optional[tuple[Callable[[Any], object], Any]] = None
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._loop, name="exitsafe-teardown-step", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            task = self._task
            if task is None:
                return
            fn, arg = task
            try:
                fn(arg)
                self._error = None
            except BaseException as exc:  # handed back to the tearing-down thread as data
                self._error = exc
            self._done.release()

    def start(self, fn: Callable[[Any], object], arg: Any) -> None:
        self._task = (fn, arg)
        self._go.release()

    def wait(self, timeout: float) -> bool:
        return self._done.acquire(True, timeout)

    def stop(self) -> None:
        self._task = None
        self._go.release()


class StepRunner:
    """Calls ``fn(arg)`` inline, or on a worker thread when a timeout applies."""

    __slots__ = ("_worker",)

    def __init__(self) -> None:
        self._worker: Optional[_Worker] = None

    def call(
        self, fn: Callable[[Any], object], arg: Any, timeout: Optional[float]
    ) -> tuple[bool, Optional[BaseException]]:
        """Run the step; return ``(finished, error)``.

        ``finished`` is ``False`` when the step overran ``timeout`` and was
        abandoned; ``error`` is the exception it raised, if it finished by raising.
        """
        if timeout is None:
            try:
                fn(arg)
            except BaseException as exc:  # the caller records it and teardown goes on
                return True, exc
            return True, None
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker()
        worker.start(fn, arg)
        if worker.wait(max(timeout, 0.0)):
            return True, worker._error
        self._worker = None  # abandoned: it stays blocked in the step
        return False, None

    def close(self) -> None:
        """Let the idle worker thread (if any) end."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

"""The audit's settings and its one mutable state.

`state` is shared by every copy of the audit in a process: ``exitsafe run``'s start-up hook
loads this package from its files under another name (``exitsafe_boot_audit``) before the
program runs, and when the program then imports exitsafe, ``exitsafe._audit`` takes the
state the start-up hook's copy installed, so that the window exitsafe's exit hook opens is
the one it installed.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: Top-level modules of bindings whose objects release native resources when collected.
#: ``EXITSAFE_AUDIT_MODULES`` (comma-separated) adds to it.
KNOWN_BINDINGS = frozenset(
    {
        "wgpu", "onnxruntime", "pyopencl", "pycuda", "cupy", "soundfile", "sounddevice",
        "pyaudio", "pygit2", "glfw", "sdl2", "vulkan", "moderngl", "av", "pyvips", "cairo",
        "cairocffi", "pymupdf", "fitz", "pyarrow", "zmq", "grpc", "sqlite3", "lmdb", "h5py",
        "netCDF4", "rasterio", "pyrealsense2", "usb", "hid", "serial", "pyglet", "duckdb",
        "jpype", "cv2", "PySide6", "PyQt6", "PyQt5", "shiboken6",
    }
)
#: Frames kept per creation site (``EXITSAFE_AUDIT_FRAMES`` changes it).
DEFAULT_FRAMES = 4
#: The name the start-up hook loads this package under.
BOOT_NAME = "exitsafe_boot_audit"

_TRUE = ("1", "true", "yes", "on")


def flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def enabled() -> bool:
    """Whether ``EXITSAFE_AUDIT`` asks for the audit."""
    return flag("EXITSAFE_AUDIT")


class State:
    def __init__(self) -> None:
        self.installed = False
        self.window = False  # releases are being recorded
        self.threads_listed = False
        self.fallback = False
        self.booted = False  # exitsafe run's start-up hook registered the fallback first
        self.phase_written = False
        self.seq = 0
        self.known: frozenset[str] = KNOWN_BINDINGS
        self.since = "none"
        self.frames = DEFAULT_FRAMES
        #: id(object) -> the number of its creation site (instances, finalizers)
        self.sites: dict[int, int] = {}
        #: (id(code), instruction, ...) of a creation site -> its number
        self.places: dict[tuple[int, ...], int] = {}
        #: number -> (code, instruction, code, instruction ...), innermost first
        self.place_sites: list[tuple[Any, ...]] = []
        #: id(ffi.gc result) -> the number of its creation site (pruned as it grows)
        self.gc_sites: dict[int, int] = {}
        #: (id(code), instruction, ...) of a place ffi.gc is called from -> its number
        self.gc_places: dict[tuple[int, ...], int] = {}
        #: number -> (code, instruction, code, instruction)
        self.gc_place_sites: list[tuple[Any, ...]] = []
        self.prune_at = 1 << 20
        self.hooked: list[str] = []


def _booted_state() -> Optional[State]:
    """The state of the copy the start-up hook loaded, when this is another copy."""
    booted = sys.modules.get(BOOT_NAME + "._state")
    if booted is None or booted is sys.modules.get(__name__):
        return None
    shared: State = booted.state
    return shared


#: Whether `state` is the start-up hook's (this copy then installs nothing itself).
SHARED = _booted_state() is not None
state: State = _booted_state() or State()

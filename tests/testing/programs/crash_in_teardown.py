"""A release exitsafe runs at exit crashes (it reads freed memory)."""

import ctypes

import exitsafe

buffer = exitsafe.track(1, lambda raw: None, kind="buffer", name="buf0")
device = exitsafe.track(2, lambda raw: ctypes.string_at(0), kind="device", name="dev0")
print("ready", flush=True)

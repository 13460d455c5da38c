"""A release exitsafe runs at exit blocks for ever: a lost device (run without
EXITSAFE_STEP_TIMEOUT)."""

import threading

import exitsafe

never = threading.Event()
buffer = exitsafe.track(1, lambda raw: None, kind="buffer", name="buf0")
device = exitsafe.track(2, lambda raw: never.wait(), kind="device", name="dev0")
print("ready", flush=True)

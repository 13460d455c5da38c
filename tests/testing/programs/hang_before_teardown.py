"""A server thread nobody stops: the interpreter joins it (non-daemon) before any exit hook,
exitsafe's teardown included.  The shape of a grpc server whose streaming handler never
ends."""

import threading

import exitsafe

device = exitsafe.track(1, lambda raw: None, kind="device", name="dev0")
never = threading.Event()
threading.Thread(target=never.wait, name="grpc-server").start()
print("serving", flush=True)

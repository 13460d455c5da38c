"""UNPROTECTED: a grpc server whose server-streaming handler never ends; the main thread ends.

The handler runs on a worker of the server's ``concurrent.futures.ThreadPoolExecutor``.
When the main thread finishes, the interpreter first runs ``threading._shutdown()``:
``concurrent.futures``' exit hook (registered with ``threading._register_atexit``) joins
the executor's workers, and the streaming handler never returns, so the process hangs
there forever.  No ``atexit`` callback runs before that join, so an atexit-based
teardown (``server.stop()`` registered with ``atexit``) never gets a chance.

No .proto file: the service is declared with grpc's generic handler API and raw bytes.
The server listens on 127.0.0.1 (an ephemeral port); the client is in this process.
"""

import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/exitsafe.Ticker/Ticks"
handler_running = threading.Event()


def ticks(request: bytes, context: grpc.ServicerContext):
    handler_running.set()
    n = 0
    while True:  # a subscription that only ends when the client goes away... never here
        n += 1
        yield n.to_bytes(8, "little")
        time.sleep(0.05)


def identity(b: bytes) -> bytes:
    return b


handler = grpc.method_handlers_generic_handler(
    "exitsafe.Ticker",
    {
        "Ticks": grpc.unary_stream_rpc_method_handler(
            ticks, request_deserializer=identity, response_serializer=identity
        )
    },
)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()

channel = grpc.insecure_channel(f"127.0.0.1:{port}")
stream = channel.unary_stream(METHOD, request_serializer=identity,
                              response_deserializer=identity)(b"")


def consume() -> None:
    for _ in stream:
        pass


threading.Thread(target=consume, name="client", daemon=True).start()
handler_running.wait(10)
print("stream open; main thread ends", flush=True)
sys.exit(0)

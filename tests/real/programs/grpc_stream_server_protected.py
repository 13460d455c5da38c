"""PROTECTED: grpc_stream_server.py with an early-phase hook that stops the server.

``exitsafe.on_early_exit`` runs before the interpreter joins non-daemon threads and
before ``concurrent.futures`` joins the server's executor: the hook cancels the
client's stream, stops the server (cancelling the handler's call) and closes the
channel, so the joins that hung the unprotected program return.  Exit 0.
"""


import sys
import threading
import time
from concurrent import futures

import grpc

import exitsafe

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
    try:
        for _ in stream:
            pass
    except grpc.RpcError as exc:  # cancelled at exit, on purpose
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise


def stop_server() -> None:
    # The early phase: before the interpreter joins the executor's workers.
    stream.cancel()
    server.stop(None).wait(5)  # no grace period: 3.12.0-3.12.2 cannot start its thread
    channel.close()


exitsafe.on_early_exit(stop_server, timeout=10)


threading.Thread(target=consume, name="client", daemon=True).start()
handler_running.wait(10)
print("stream open; main thread ends", flush=True)
sys.exit(0)

"""A stand-in for a messaging library whose context waits, at exit, for its sockets."""

import atexit
import threading


class Socket:
    def __init__(self) -> None:
        self.closed = threading.Event()
        self.pending = []

    def send(self, data: bytes) -> None:
        self.pending.append(data)


class Context:
    def __init__(self) -> None:
        self.sockets: list = []
        atexit.register(self._terminate)

    def socket(self) -> Socket:
        sock = Socket()
        self.sockets.append(sock)
        return sock

    def _terminate(self) -> None:
        # zmq_ctx_term: blocks until every socket is closed (linger: forever)
        for sock in self.sockets:
            if sock.pending:
                sock.closed.wait()

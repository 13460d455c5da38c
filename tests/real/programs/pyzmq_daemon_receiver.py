"""UNPROTECTED: a daemon thread receives on a ZeroMQ socket, blocked in ``recv()`` with no
timeout, while the main thread ends; the program destroys its context at exit, as
pyzmq's docs ask (``Context.destroy``: close every socket, then terminate).

The receiver is inside libzmq's ``recv`` when the exit begins, and ``destroy`` closes its
socket from the exiting thread under it: libzmq asserts ("Assertion failed: pfd.revents &
POLLIN (src/signaler.cpp:...)") and the process aborts (SIGABRT), 10 runs of 10 on CPython
3.9 and 3.13 (pyzmq 27.3, libzmq 4.3.5); sometimes the receiver gets ``ContextTerminated``
instead (printed); once in CI, after that, ``term()`` waited for ever for the socket whose
close raced with the receiver.  Without the ``destroy``, the socket is never
closed; with ``ctx.term()`` instead, the exit waits for ever for the receiver's socket.
"""

import atexit
import sys
import threading
import time

import zmq

ctx = zmq.Context()
atexit.register(ctx.destroy, linger=0)
pull = ctx.socket(zmq.PULL)
pull.bind("inproc://results")
push = ctx.socket(zmq.PUSH)
push.connect("inproc://results")
got = threading.Event()


def receive() -> None:
    while True:  # the thread's own code: it never checks a stop flag
        message = pull.recv()
        print("received", message.decode(), flush=True)
        got.set()


receiver = threading.Thread(target=receive, name="receiver", daemon=True)
receiver.start()
push.send(b"result 1")
got.wait()
# (the receiver back at its recv() before the exit begins: on a loaded machine the exit
# could otherwise come first, and close the socket before the receiver runs again)
while sys._current_frames()[receiver.ident].f_lineno != receive.__code__.co_firstlineno + 2:
    time.sleep(0.001)
print("main thread ends", flush=True)
sys.exit(0)

"""PROTECTED: pyzmq_daemon_receiver.py plus
``exitsafe.quiesce(wake=lambda: push.send(b""))``.

At exit, before any ``atexit`` callback (the context's ``destroy`` included), the
receiver is set to park at its next call or return from a C function made from this
program's code; then the wake action sends it an empty message.  Its ``recv`` returns and
the receiver parks right there, before its loop sees the message.  ``destroy`` then
closes the sockets with no thread inside libzmq: no traceback.  Exit 0.
"""

import atexit
import sys
import threading
import time

import zmq

import exitsafe

ctx = zmq.Context()
atexit.register(ctx.destroy, linger=0)
pull = ctx.socket(zmq.PULL)
pull.bind("inproc://results")
push = ctx.socket(zmq.PUSH)
push.connect("inproc://results")
exitsafe.quiesce(wake=lambda: push.send(b""))  # the one line
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

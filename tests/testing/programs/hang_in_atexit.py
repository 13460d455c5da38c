"""A library's own exit handler blocks: the shape of pyzmq's ``Context.term()`` waiting for a
socket with unsent messages, or JPype's ``_JTerminate`` waiting for the JVM's threads.

``zmqlike`` (a module beside this file) registers ``_terminate`` with ``atexit``; the socket
it waits for is never closed, so the handler never returns.
"""

import zmqlike

context = zmqlike.Context()
socket = context.socket()
socket.send(b"never delivered")
print("sent", flush=True)

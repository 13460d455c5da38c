"""Not an exit hang: the program is still running its own code at the timeout."""

import threading

print("waiting for work", flush=True)
threading.Event().wait()

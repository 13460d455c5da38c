"""UNPROTECTED: a Qt program hashes files on a ``QThread`` (a subclass whose ``run()``
loops, checking ``isInterruptionRequested()`` as Qt's documentation shows, and reports
progress by a signal); the main thread's event loop shows the progress and quits once the
first report has arrived, and the program ends while the worker still runs.

Nothing asks the worker to stop or waits for it: the ``QThread`` is destroyed with the
module's globals while its thread runs, Qt prints "QThread: Destroyed while thread 'hasher'
is still running" and aborts the process (SIGABRT).  Measured (PySide6-Essentials 6.10.3 on
CPython 3.9, 6.12.0 on 3.10-3.13): 140 runs of 140 on each of 3.9-3.13; twice in those 700
a SIGSEGV followed Qt's line instead of the abort; in 4 runs of about 800 (on 3.9, 3.10
and 3.11) PySide6 invalidated the wrapper first and the worker's ``run()`` raised
"Internal C++ object (Hasher) already deleted" instead (its traceback printed, exit
status 0).
"""

import hashlib
import sys

from PySide6.QtCore import QCoreApplication, QThread, QTimer, Signal


class Hasher(QThread):
    progress = Signal(int, str)

    def run(self) -> None:  # the thread's own code, as Qt's documentation writes it
        block = bytes(range(256)) * 4096  # stands for a file read from disk
        done = 0
        while not self.isInterruptionRequested():
            digest = hashlib.sha256(block * 4).hexdigest()
            done += 1
            self.progress.emit(done, digest[:12])


def show(done: int, digest: str) -> None:
    print(f"hashed {done}: {digest}", flush=True)
    app.quit()  # the user closed the window: the program ends


app = QCoreApplication(sys.argv)
hasher = Hasher()
hasher.setObjectName("hasher")
hasher.progress.connect(show)
hasher.start()
QTimer.singleShot(10_000, app.quit)  # (never reached: the first report quits)
app.exec()
print("main thread ends", flush=True)
sys.exit(0)

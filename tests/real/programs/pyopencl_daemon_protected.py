"""PROTECTED: pyopencl_daemon.py with the command queue borrowed around each batch.

The queue is adopted by exitsafe and the worker borrows it around every enqueue +
``finish()``.  At exit the teardown waits for the batch in flight, then the worker
parks at its next borrow: no thread is inside the OpenCL runtime when the
interpreter finalizes.  Exit 0.
"""


import sys
import threading

import numpy as np
import pyopencl as cl

import exitsafe

N = 1 << 14  # short batches: the worker re-enters Python many times while the interpreter finalizes
SOURCE = """
__kernel void relax(__global float *a) {
    int i = get_global_id(0);
    float v = a[i];
    for (int k = 0; k < 64; k++) v = v * 0.999f + 0.001f;
    a[i] = v;
}
"""

platform = cl.get_platforms()[0]
ctx = cl.Context(platform.get_devices())
queue = cl.CommandQueue(ctx)
program = cl.Program(ctx, SOURCE).build()
host = np.ones(N, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
kernel = cl.Kernel(program, "relax")
kernel.set_arg(0, buf)
handle = exitsafe.adopt(queue, close=None, kind="command queue")
started = threading.Event()


def compute_forever() -> None:
    while True:
        with handle.borrow() as q:  # never inside the runtime once the teardown began
            cl.enqueue_nd_range_kernel(q, kernel, (N,), None)
            q.finish()
        started.set()


threading.Thread(target=compute_forever, name="opencl", daemon=True).start()
started.wait()
print("kernels running; main thread ends", flush=True)
sys.exit(0)

"""UNPROTECTED: a daemon thread enqueues OpenCL kernels (pyopencl over pocl, on the CPU)
in a loop while the main thread ends.

The worker spends most of its time in ``queue.finish()`` / the kernel enqueue, native
code with the GIL released, and its batches are short, so it comes back into Python
many times while the interpreter finalizes.  The first such return ends it with
``pthread_exit()`` on CPython <= 3.13 (forced unwinding through pyopencl's
C++/nanobind frames: "terminate called without an active exception", SIGABRT), and
pyopencl's own objects (context, queue, buffers) are released by module
finalization while the worker may still be inside pocl.
"""

import sys
import threading

import numpy as np
import pyopencl as cl

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
started = threading.Event()


def compute_forever() -> None:
    while True:
        cl.enqueue_nd_range_kernel(queue, kernel, (N,), None)
        queue.finish()
        started.set()


threading.Thread(target=compute_forever, name="opencl", daemon=True).start()
started.wait()
print("kernels running; main thread ends", flush=True)
sys.exit(0)

"""UNPROTECTED: a daemon thread runs onnxruntime inference in a loop while the main thread ends.

Nothing stops the worker at exit.  The interpreter finalizes while the worker is inside
``InferenceSession.run()`` (native C++ code, GIL released).  When the call returns, the
worker tries to take the GIL back: on CPython <= 3.13 it is ended with ``pthread_exit()``,
whose forced unwinding runs through onnxruntime's / pybind11's C++ frames and ends in
``std::terminate`` ("terminate called without an active exception", SIGABRT); on 3.14+
the thread is parked forever instead (gh-87135) while the main thread unloads the
runtime under it.

The model is built here with the ``onnx`` helper API: no download.  It is a chain of
MatMul + Tanh nodes over a 256x256 input, so one ``run()`` lasts long enough (a few ms)
for the worker to be inside native code when the main thread finishes.
"""

import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SIZE = 256
LAYERS = 8


def build_model() -> bytes:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(LAYERS):
        w = numpy_helper.from_array(
            (rng.standard_normal((SIZE, SIZE)) / SIZE).astype(np.float32), name=f"w{i}"
        )
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]))
        prev = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SIZE, SIZE])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [SIZE, SIZE])],
        initializer=inits,
    )
    # opset 13 / IR 7 load on every onnxruntime that has wheels for CPython 3.9-3.13
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model.SerializeToString()


session = ort.InferenceSession(build_model(), providers=["CPUExecutionProvider"])
x = np.ones((SIZE, SIZE), dtype=np.float32)
started = threading.Event()


def infer_forever() -> None:
    while True:
        session.run(None, {"x": x})
        started.set()


threading.Thread(target=infer_forever, name="inference", daemon=True).start()
started.wait()
print("inference running; main thread ends", flush=True)
sys.exit(0)

"""PROTECTED: onnxruntime_daemon.py with exitsafe's daemon-inference recipe.

The session is adopted by exitsafe and the worker borrows it around every
``session.run()``.  At exit the teardown waits (bounded) for the run in flight to
return, and from then on the worker's next ``borrow()`` parks it (a daemon thread:
blocked with its signals masked until the process ends), so no thread is inside
onnxruntime when the interpreter finalizes.  Exit 0.
"""


import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import exitsafe

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
# The session becomes a handle; dropping it is all its "release" does.
handle = exitsafe.adopt(session, close=None, kind="session")
x = np.ones((SIZE, SIZE), dtype=np.float32)
started = threading.Event()


def infer_forever() -> None:
    while True:
        # The documented recipe: borrow the session around each native call.  At exit
        # the teardown waits for the call in flight; the next borrow parks this thread.
        with handle.borrow() as s:
            s.run(None, {"x": x})
        started.set()


threading.Thread(target=infer_forever, name="inference", daemon=True).start()
started.wait()
print("inference running; main thread ends", flush=True)
sys.exit(0)

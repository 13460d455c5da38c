"""Real third-party bindings that fail at exit without exitsafe (pytest marker ``real``).

Each case is a standalone program under ``programs/`` that a user could have written:
onnxruntime and pyopencl inference/compute on a daemon thread while the main thread ends
(SIGABRT from ``pthread_exit()`` unwinding through C++ on CPython <= 3.13), a grpc server
whose streaming handler never ends (hang in ``threading._shutdown``), and wgpu after
``os.fork()`` (the child's normal exit hangs in the Vulkan driver).  The tests run each
program under every CPython that ``.ci/install-real`` prepared an environment for
(``.venv-real/<X.Y>``) and assert that it really fails, the way the case describes, in at
least one of N runs.  ``measure.py`` runs every case N times and prints the failure rates.
"""

"""The stderr parsers: exitsafe's teardown trace, fatal errors, "Exception ignored" blocks.

The samples are what CPython 3.9-3.14 and exitsafe print; each test checks what a user
reads off the parsed data.
"""

from __future__ import annotations

import textwrap

import pytest

from exitsafe.testing import ExitResult
from exitsafe.testing.parsers import parse_fatal_errors, parse_uncaught, parse_unraisable
from exitsafe.testing.trace import parse_line, parse_trace, summarize

TRACE = """\
some output of the program
exitsafe: teardown-begin registry="default" reason="atexit" live=5 hooks=1
exitsafe: plan registry="default" steps=6
exitsafe: step registry="default" index=1 of=6 action=hook kind="hook" name="flush queue" outcome=hook_ran ms=0.010
exitsafe: step registry="default" index=2 of=6 action=release kind="buffer" name="buf \\"0\\"" outcome=released_at_exit ms=0.004
exitsafe: release of buffer 'buf1' failed at teardown: RuntimeError('lost device')
exitsafe: step registry="default" index=3 of=6 action=release kind="buffer" name="buf1" outcome=release_failed ms=0.2 error="RuntimeError('lost device')"
exitsafe: step registry="default" index=4 of=6 action=leak kind="device" name="dev0" outcome=leaked_dependent ms=0.001 error="buffer 'buf1' depending on it ended release_failed"
exitsafe: step registry="default" index=5 of=6 action=leak kind="instance" name="inst" outcome=leaked_dependent ms=0.001
exitsafe: step registry="default" index=6 of=6 action=release kind="library" name="libgpu.so" outcome=released_at_exit ms=0.3
exitsafe: teardown-end registry="default" released=2 leaked=2 failed=1 ms=1.234
exitsafe: late-release registry="default" kind="buffer" name="buf \\"0\\""
"""  # noqa: E501


# ----------------------------------------------------------------- trace


def test_trace_events_are_parsed_in_order() -> None:
    steps = parse_trace(TRACE)
    assert [s.event for s in steps] == [
        "teardown-begin", "plan", "step", "step", "message", "step", "step", "step", "step",
        "teardown-end", "late-release",
    ]  # fmt: skip
    hook, buf0 = steps[2], steps[3]
    assert (hook.index, hook.of, hook.action, hook.kind, hook.name, hook.outcome) == (
        1, 6, "hook", "hook", "flush queue", "hook_ran",
    )  # fmt: skip
    assert buf0.name == 'buf "0"'  # JSON escapes decoded
    assert buf0.ms == pytest.approx(0.004)
    assert buf0.registry == "default"
    failed = steps[5]
    assert failed.failed
    assert failed.error == "RuntimeError('lost device')"
    assert not buf0.failed
    assert steps[4].fields == {"text": "release of buffer 'buf1' failed at teardown: "
                                       "RuntimeError('lost device')"}


def test_bare_and_quoted_values_both_work() -> None:
    step = parse_line(
        "exitsafe: step registry=default index=3 of=6 action=release kind=device "
        "name=dev0 outcome=released_at_exit ms=0.012"
    )
    assert step is not None
    assert (step.registry, step.index, step.kind, step.name, step.ms) == (
        "default", 3, "device", "dev0", pytest.approx(0.012),
    )  # fmt: skip


def test_unknown_events_and_keys_are_kept() -> None:
    step = parse_line('exitsafe: pin-held registry="gpu" library="libfoo.so" refs=3 new_key=x')
    assert step is not None
    assert step.event == "pin-held"
    assert step.fields == {"registry": "gpu", "library": "libfoo.so", "refs": "3", "new_key": "x"}
    step = parse_line('exitsafe: step registry="r" index=1 of=1 outcome=some_new_outcome thread=7')
    assert step is not None and step.outcome == "some_new_outcome" and step.get("thread") == "7"


@pytest.mark.parametrize(
    "line",
    [
        "exitsafe:",
        "exitsafe: ",
        "exitsafe: =x",
        "exitsafe: step index=",
        'exitsafe: step name="unterminated',
        "exitsafe: step index=abc of=?? ms=fast",
        "exitsafe: step \x00\x01 garbage",
        'exitsafe: step name="bad \\q escape"',
    ],
)
def test_malformed_lines_never_raise(line: str) -> None:
    step = parse_line(line)
    if step is None:
        return
    assert step.index is None or isinstance(step.index, int)
    assert step.ms is None or isinstance(step.ms, float)
    assert isinstance(step.describe(), str)


def test_bad_numbers_read_as_none() -> None:
    step = parse_line("exitsafe: step index=abc of=?? ms=fast")
    assert step is not None
    assert (step.index, step.of, step.ms) == (None, None, None)


def test_lines_without_the_prefix_are_ignored() -> None:
    assert parse_line("Exception ignored in: <x>") is None
    assert parse_trace("nothing here\n  exitsafe: indented is not a trace line\n") == []


def test_summary_of_a_finished_teardown() -> None:
    (default,) = summarize(parse_trace(TRACE))
    assert default.registry == "default"
    assert default.finished
    assert (default.reason, default.live, default.hooks, default.planned) == ("atexit", 5, 1, 6)
    assert (default.released, default.leaked, default.failed) == (2, 2, 1)
    assert default.late_releases == 1
    assert default.outcomes == {
        "hook_ran": 1, "released_at_exit": 2, "release_failed": 1, "leaked_dependent": 2,
    }  # fmt: skip
    assert "released 2, leaked 2, failed 1" in default.describe()


def test_summary_of_a_teardown_cut_short_by_a_crash() -> None:
    cut = "\n".join(TRACE.splitlines()[:5])  # begin, plan, two steps, then the crash
    (default,) = summarize(parse_trace(cut))
    assert not default.finished
    assert len(default.steps) == 2
    assert "did NOT finish: 2 of 6 steps completed" in default.describe()


def test_summary_keeps_registries_and_repeated_teardowns_apart() -> None:
    text = (
        'exitsafe: teardown-begin registry="lib" reason="atexit" live=1 hooks=0\n'
        'exitsafe: teardown-end registry="lib" released=1 leaked=0 failed=0 ms=0.1\n'
        'exitsafe: teardown-begin registry="default" reason="atexit" live=0 hooks=0\n'
        'exitsafe: teardown-end registry="default" released=0 leaked=0 failed=0 ms=0.1\n'
        'exitsafe: teardown-begin registry="lib" reason="signal" live=2 hooks=0\n'
    )
    summaries = summarize(parse_trace(text))
    assert [(s.registry, s.reason, s.finished) for s in summaries] == [
        ("lib", "atexit", True),
        ("default", "atexit", True),
        ("lib", "signal", False),
    ]


# ----------------------------------------------------------------- fatal errors

SEGV_TWO_THREADS = """\
Fatal Python error: Segmentation fault

Thread 0x00007fb5dcc386c0 (most recent call first):
  File "<string>", line 3 in f
  File "/usr/lib/python3.9/threading.py", line 917 in run
  File "/usr/lib/python3.9/threading.py", line 980 in _bootstrap_inner
  File "/usr/lib/python3.9/threading.py", line 937 in _bootstrap

Current thread 0x00007fb5dd451b80 (most recent call first):
  File "<string>", line 6 in g
  File "<string>", line 7 in <module>

Extension modules: _cffi_backend, numpy.core._multiarray_umath (total: 2)
"""

PY_FATAL_AT_SHUTDOWN = """\
Fatal Python error: _enter_buffered_busy: could not acquire lock for <_io.BufferedWriter name='<stdout>'> at interpreter shutdown, possibly due to daemon threads
Python runtime state: finalizing (tstate=0x0000563f3c0a1e40)

Current thread 0x00007f0c3f9ff6c0 (most recent call first):
  File "app.py", line 8 in log_forever
  File "/usr/lib/python3.11/threading.py", line 975 in run
  ...

Thread 0x00007f0c40a45740 (most recent call first):
  <no Python frame>
"""  # noqa: E501

PY_FATAL_WITH_EXCEPTION = """\
Fatal Python error: init_import_site: Failed to import the site module
Python runtime state: initialized
Traceback (most recent call last):
  File "/usr/lib/python3.12/site.py", line 73, in <module>
    import os
ModuleNotFoundError: No module named 'os'

Current thread 0x00007f1 [MainThread] (most recent call first):
  Garbage-collecting
  File "x.py", line ??? in <module>
"""


def test_faulthandler_dump_with_two_threads() -> None:
    (fatal,) = parse_fatal_errors("noise before\n" + SEGV_TWO_THREADS + "more noise\n")
    assert fatal.message == "Segmentation fault"
    assert not fatal.windows
    assert [t.thread_id for t in fatal.threads] == ["0x00007fb5dcc386c0", "0x00007fb5dd451b80"]
    assert [t.current for t in fatal.threads] == [False, True]
    crashed = fatal.current_thread
    assert crashed is not None and crashed.thread_id == "0x00007fb5dd451b80"
    assert [(f.file, f.line, f.function) for f in fatal.top_frames] == [
        ("<string>", 6, "g"),
        ("<string>", 7, "<module>"),
    ]
    assert fatal.threads[0].frames[1].function == "run"
    assert fatal.extension_modules == ("_cffi_backend", "numpy.core._multiarray_umath")
    assert fatal.text.startswith("Fatal Python error: Segmentation fault")
    assert "more noise" not in fatal.text


#: CPython 3.14+: faulthandler adds the crashing thread's C stack after the Python stacks.
SEGV_WITH_C_STACK = """\
Fatal Python error: Segmentation fault

Current thread 0x00007fd0532a6200 [python] (most recent call first):
  File "/usr/lib/python3.14/ctypes/__init__.py", line 624 in string_at
  File "crash.py", line 3 in <module>

Current thread's C stack trace (most recent call first):
  Binary file "/venv/bin/python", at _Py_DumpStack+0x4a [0x49b2f9]
  Binary file "/usr/lib/x86_64-linux-gnu/libc.so.6", at +0x406b0 [0x7fd0532e76b0]
  Binary file "/usr/lib/x86_64-linux-gnu/libffi.so.8", at ffi_call+0x155 [0x7fd052eaafe5]
  <truncated rest of calls>

Extension modules: _ctypes (total: 1)
"""


def test_the_c_stack_of_cpython_3_14_is_part_of_the_block() -> None:
    (fatal,) = parse_fatal_errors(SEGV_WITH_C_STACK + "work done\n")
    (thread,) = fatal.threads
    assert [f.function for f in thread.frames] == ["string_at", "<module>"]
    assert thread.notes == ()  # (the C stack is not the Python thread's)
    assert fatal.extension_modules == ("_ctypes",)
    assert "ffi_call+0x155" in fatal.text
    assert "work done" not in fatal.text


def test_py_fatal_error_during_finalization() -> None:
    (fatal,) = parse_fatal_errors(PY_FATAL_AT_SHUTDOWN)
    assert fatal.message.startswith("_enter_buffered_busy: could not acquire lock")
    assert fatal.runtime_state == "finalizing (tstate=0x0000563f3c0a1e40)"
    assert fatal.during_finalization
    current, other = fatal.threads
    assert current.current and current.frames[0].function == "log_forever"
    assert current.notes == ("...",)  # a truncated stack
    assert other.frames == () and other.notes == ("<no Python frame>",)


def test_py_fatal_error_with_pending_exception_and_thread_names() -> None:
    (fatal,) = parse_fatal_errors(PY_FATAL_WITH_EXCEPTION)
    assert fatal.runtime_state == "initialized"
    assert not fatal.during_finalization
    (thread,) = fatal.threads
    assert thread.name == "MainThread"
    assert thread.notes == ("Garbage-collecting",)
    assert thread.frames[0].line is None  # printed as ???


def test_stack_dump_without_threads_and_windows_header() -> None:
    text = (
        "Windows fatal exception: stack overflow\n\n"
        "Stack (most recent call first):\n"
        '  File "C:\\\\app\\\\r.py", line 2 in recurse\n'
    )
    (fatal,) = parse_fatal_errors(text)
    assert fatal.windows and fatal.message == "stack overflow"
    (stack,) = fatal.threads
    assert stack.thread_id is None and stack.current
    assert stack.frames[0].function == "recurse"


def test_two_fatal_errors_and_none() -> None:
    errors = parse_fatal_errors(SEGV_TWO_THREADS + PY_FATAL_AT_SHUTDOWN)
    assert [e.message.split(":")[0] for e in errors] == [
        "Segmentation fault",
        "_enter_buffered_busy",
    ]
    assert parse_fatal_errors("all fine\n") == []
    assert parse_fatal_errors("Fatal Python error: \n")[0].threads == ()


# ----------------------------------------------------------------- unraisable exceptions

UNRAISABLE_39 = """\
Exception ignored in: <function Device.__del__ at 0x7f3f5eec0820>
Traceback (most recent call last):
  File "app.py", line 12, in __del__
    lib.device_release(self._ptr)
AttributeError: 'NoneType' object has no attribute 'device_release'
"""

UNRAISABLE_313_ATEXIT = """\
Exception ignored in atexit callback <function shutdown at 0x7f16faa540e0>:
Traceback (most recent call last):
  File "app.py", line 6, in shutdown
ValueError: boom
"""

UNRAISABLE_314 = """\
Exception ignored while calling deallocator <function Buffer.__del__ at 0x7f16faa545e0>:
Traceback (most recent call last):
  File "app.py", line 3, in __del__
    1/0
    ~^~
ZeroDivisionError: division by zero
"""

ATEXIT_OLD = """\
Error in atexit._run_exitfuncs:
Traceback (most recent call last):
  File "app.py", line 6, in shutdown
ValueError: boom
"""


def test_unraisable_in_del() -> None:
    (report,) = parse_unraisable(UNRAISABLE_39)
    assert report.object == "<function Device.__del__ at 0x7f3f5eec0820>"
    assert report.where == "<function Device.__del__>"
    assert report.exc_type == "AttributeError"
    assert report.message == "'NoneType' object has no attribute 'device_release'"
    assert report.traceback.startswith("Traceback (most recent call last):")
    assert 'File "app.py", line 12, in __del__' in report.traceback
    assert report.describe() == (
        "AttributeError: 'NoneType' object has no attribute 'device_release'"
        " in <function Device.__del__>"
    )


def test_unraisable_formats_of_newer_pythons() -> None:
    atexit, dealloc = parse_unraisable(UNRAISABLE_313_ATEXIT + UNRAISABLE_314)
    assert atexit.object == "<function shutdown at 0x7f16faa540e0>"
    assert atexit.context.startswith("in atexit callback")
    assert (atexit.exc_type, atexit.message) == ("ValueError", "boom")
    assert dealloc.where == "<function Buffer.__del__>"
    assert dealloc.exc_type == "ZeroDivisionError"


def test_atexit_error_of_older_pythons_counts_as_unraisable() -> None:
    (report,) = parse_unraisable(ATEXIT_OLD)
    assert report.context == "atexit._run_exitfuncs"
    assert report.object is None
    assert report.exc_type == "ValueError"


def test_unraisable_without_traceback_or_exception_line() -> None:
    text = (
        "Exception ignored in: <_io.TextIOWrapper name='<stdout>'>\n"
        "BrokenPipeError: [Errno 32] Broken pipe\n"
        "Exception ignored on threading shutdown:\n"
        'exitsafe: plan registry="default" steps=0\n'
    )
    first, second = parse_unraisable(text)
    assert first.object == "<_io.TextIOWrapper name='<stdout>'>"
    assert (first.exc_type, first.traceback) == ("BrokenPipeError", "")
    assert second.exc_type is None  # the trace line is not mistaken for an exception
    assert second.describe().startswith("an exception in")


def test_uncaught_exception_is_the_last_one() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "a.py", line 1, in <module>\n'
        "KeyError: 'x'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "a.py", line 3, in <module>\n'
        "RuntimeError: no device\n"
    )
    report = parse_uncaught(UNRAISABLE_39 + text)
    assert report is not None
    assert (report.exc_type, report.message) == ("RuntimeError", "no device")
    assert report.describe() == "RuntimeError: no device"
    assert parse_uncaught(UNRAISABLE_39) is None


# ----------------------------------------------------------------- a whole stderr


def test_result_from_a_crash_during_teardown() -> None:
    cut = "\n".join(TRACE.splitlines()[:5])
    stderr = cut + "\n" + SEGV_TWO_THREADS
    result = ExitResult.from_output(["python", "app.py"], -11, "", stderr, duration=0.5)
    assert result == ExitResult.from_output(["python", "app.py"], -11, "", stderr, duration=0.5)
    assert len({result, result}) == 1  # results are frozen and hashable
    assert result.signal == "SIGSEGV"
    assert len(result.teardown) == 4
    (registry,) = result.registries
    assert not registry.finished
    report = result.report()
    assert report.splitlines()[0] == (
        "NOT CLEAN [crash-in-teardown]: crash inside exitsafe's teardown, in step 3/6;"
        " SIGSEGV (signal 11); Fatal Python error: Segmentation fault"
    )
    assert result.diagnosis is not None and result.diagnosis.kind == "crash-in-teardown"
    assert "teardown did NOT finish: 2 of 6 steps completed" in report
    assert "step 2/6 release buffer 'buf \"0\"' -> released_at_exit" in report
    assert "the process ended during step 3/6" in report
    assert 'File "<string>", line 6 in g' in report


def test_result_to_dict_is_json_ready() -> None:
    import json

    stderr = TRACE + UNRAISABLE_39 + SEGV_TWO_THREADS
    result = ExitResult.from_output(["python", "app.py"], 3221225477, "out", stderr)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["ntstatus"] == {
        "name": "STATUS_ACCESS_VIOLATION", "hex": "0xC0000005", "code": 0xC0000005
    }
    assert data["fatal_error"]["threads"][1]["frames"][0] == {
        "file": "<string>", "line": 6, "function": "g",
    }  # fmt: skip
    assert data["unraisable"][0]["type"] == "AttributeError"
    assert data["teardown"][0] == {
        "event": "teardown-begin", "registry": "default", "reason": "atexit",
        "live": 5, "hooks": 1,
    }  # fmt: skip
    assert data["clean"] is False


def test_thread_exceptions_and_native_lines_are_parsed() -> None:
    from exitsafe.testing.parsers import parse_native_fatal, parse_thread_exceptions

    stderr = textwrap.dedent(
        """\
        Exception in thread report-query:
        Traceback (most recent call last):
          File "app.py", line 3, in report
        RuntimeError: Connection already closed!
        QThread: Destroyed while thread is still running
        Assertion failed: !more (src/socket_base.cpp:1432)
        python: prog.c:12: main: Assertion `x' failed.
        double free or corruption (out)
        thread '<unnamed>' panicked at src/lib.rs:10:5:
        this line is ordinary output: FATAL: not at the start
        """
    )
    (report,) = parse_thread_exceptions(stderr)
    assert (report.object, report.exc_type, report.message) == (
        "report-query", "RuntimeError", "Connection already closed!"
    )
    sources = [line.source for line in parse_native_fatal(stderr)]
    assert sources == ["Qt", "assertion", "assertion", "glibc", "Rust"]
    result = ExitResult.from_output(["app"], 0, "", stderr)
    assert not result.clean  # exit status 0, and still not clean
    assert result.uncaught is None  # a thread's traceback is not the program's


def test_a_trace_line_written_into_another_line_is_untangled() -> None:
    from exitsafe.testing.parsers import untangle

    tangled = (
        'Exception in thread exitsafe: thread ident=0x1 name="w" daemon=false\n'
        "report-query:\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in report\n'
        "RuntimeError: closed\n"
    )
    assert untangle(tangled).splitlines()[:2] == [
        'exitsafe: thread ident=0x1 name="w" daemon=false',
        "Exception in thread report-query:",
    ]
    result = ExitResult.from_output(["app"], 0, "", tangled)
    assert [r.object for r in result.thread_exceptions] == ["report-query"]
    assert [s.get("name") for s in result.trace if s.event == "thread"] == ["w"]
    assert untangle("plain text, exitsafe: not a trace line\n") == (
        "plain text, exitsafe: not a trace line\n"
    )


def test_trace_lines_written_between_the_lines_of_a_traceback_are_stepped_over() -> None:
    # The exiting thread lists the other threads (whole trace lines) while one of them
    # prints its uncaught exception: the block is still read whole (CI, CPython 3.14).
    interleaved = (
        "Exception in thread report-query:\n"
        'exitsafe: thread ident=0x1 name="report-query" daemon=false\n'
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in report\n'
        'exitsafe: thread ident=0x2 name="MainThread" daemon=false\n'
        "    connection.query()\n"
        "RuntimeError: Connection already closed!\n"
    )
    result = ExitResult.from_output(["app"], 0, "", interleaved)
    (report,) = result.thread_exceptions
    assert (report.exc_type, report.message) == ("RuntimeError", "Connection already closed!")
    assert "exitsafe:" not in report.traceback
    assert [s.get("name") for s in result.trace if s.event == "thread"] == [
        "report-query", "MainThread",
    ]


# Two threads writing to stderr at exit: a daemon thread's uncaught exception and a
# finalizer's "Exception ignored" block, the second header written before the first's
# newline.
GLUED = (
    "Exception in thread writer:Exception ignored in: <function Writer.__del__ at 0x7f00>\n"
    "Traceback (most recent call last):\n"
    '  File "app.py", line 9, in __del__\n'
    "    self.stream.close()\n"
    "ValueError: I/O operation on closed file.\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/threading.py", line 1073, in _bootstrap_inner\n'
    "    self.run()\n"
    "RuntimeError: cannot schedule new futures after interpreter shutdown\n"
)


def test_a_thread_header_and_an_unraisable_header_on_one_line_are_both_read() -> None:
    from exitsafe.testing.parsers import parse_thread_exceptions

    (thread,) = parse_thread_exceptions(GLUED)
    assert (thread.object, thread.exc_type) == ("writer", "RuntimeError")
    assert "_bootstrap_inner" in thread.traceback  # its own traceback, after the other block
    (ignored,) = parse_unraisable(GLUED)
    assert (ignored.where, ignored.exc_type) == ("<function Writer.__del__>", "ValueError")
    assert parse_uncaught(GLUED) is None  # the thread's traceback is not the program's
    result = ExitResult.from_output(["app"], 0, "", GLUED)
    assert not result.clean
    assert result.diagnosis is not None and result.diagnosis.kind == "thread-exception"
    assert result.summary().startswith("NOT CLEAN [thread-exception]: thread 'writer'")
    assert "1 unraisable exception at exit" in result.summary()


def test_headers_written_after_other_text_on_the_line_are_read() -> None:
    thread = (
        "some output without newlineException in thread worker:\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 4, in run\n'
        "KeyError: 'x'\n"
    )
    result = ExitResult.from_output(["app"], 0, "", thread)
    assert [(r.object, r.exc_type) for r in result.thread_exceptions] == [("worker", "KeyError")]
    assert result.diagnosis is not None and result.diagnosis.kind == "thread-exception"
    assert result.uncaught is None
    ignored = (
        "progress 99%Exception ignored in: <function Device.__del__ at 0x7f3f5eec0820>\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 12, in __del__\n'
        "AttributeError: 'NoneType' object has no attribute 'device_release'\n"
    )
    result = ExitResult.from_output(["app"], 0, "", ignored)
    assert [r.where for r in result.unraisable] == ["<function Device.__del__>"]
    assert result.diagnosis is not None and result.diagnosis.kind == "unraisable-at-exit"


@pytest.mark.parametrize(
    "line",
    [
        'INFO app: the log said "Exception in thread worker:" once',
        "WARNING app: retrying after Exception in thread worker:",  # no traceback follows
        "INFO app: 'Exception ignored in: <function f>' is harmless",
        "INFO app: Exception ignored in: <function f>",  # nor an exception line
    ],
)
def test_a_log_line_quoting_a_header_is_not_a_block(line: str) -> None:
    from exitsafe.testing.parsers import parse_thread_exceptions

    stderr = line + "\nretrying\ndone in 3 s\n"
    assert parse_thread_exceptions(stderr) == []
    assert parse_unraisable(stderr) == []
    assert ExitResult.from_output(["app"], 0, "", stderr).clean


@pytest.mark.parametrize("tail", ["Exception in thread ", "Exception in thread recei",
                                  "Exception in thread"])
def test_a_thread_header_cut_off_by_the_end_of_the_process_is_not_clean(tail):
    # pyzmq on CPython 3.13: the receiver's ContextTerminated was being printed when the
    # process ended; stderr stops inside the header (the run was called CLEAN)
    stderr = 'exitsafe: thread ident=0x1 name="receiver" daemon=true when="exit"\n' + tail
    result = ExitResult.from_output(["python", "recv.py"], 0, "", stderr)
    assert not result.clean
    assert result.diagnosis is not None and result.diagnosis.kind == "thread-exception"
    assert "cut off when the process ended" in result.summary()


@pytest.mark.parametrize("text", [
    "Exception in thread worker\nmore output\n",  # not at the end
    "print('Exception in thread ')",  # quoted
    "log: Exception in thread ",  # not at the start of the line
])
def test_a_mention_of_a_thread_header_elsewhere_is_not_a_cut_report(text):
    assert ExitResult.from_output(["python", "x.py"], 0, text, text).clean

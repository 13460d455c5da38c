"""adopt(obj, close=type(obj).__del__): the destructor runs once, not again at collection."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import exitsafe

PROGRAM = textwrap.dedent(
    """
    import gc, sys
    import exitsafe

    class Reader{bases}:
        {slots}
        def __del__(self):
            print("__del__ ran", flush=True)  # stands for a read-back or a free

    reader = Reader()
    handle = exitsafe.adopt(reader, close=type(reader).__del__)
    if sys.argv[1] == "release":
        handle.release()
        print(isinstance(reader, Reader), type(reader).__name__, flush=True)
        del reader
        gc.collect()
        print("collected", flush=True)
    """
)


@pytest.mark.parametrize("how", ["exit", "release"])
@pytest.mark.parametrize(
    ("bases", "slots"), [("", "pass"), ("", "__slots__ = ('fd',)"), ("(dict)", "pass")],
    ids=["plain", "slots", "builtin-base"],
)
def test_the_destructor_adopted_as_the_close_runs_once(how, bases, slots):
    code = PROGRAM.format(bases=bases, slots=slots)
    proc = subprocess.run(
        [sys.executable, "-c", code, how], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("__del__ ran") == 1, proc.stdout
    assert "may run again" not in proc.stderr
    if how == "release":
        assert proc.stdout.splitlines() == ["__del__ ran", "True Reader", "collected"]


def test_a_class_that_refuses_a_twin_is_reported():
    class Meta(type):
        def __new__(mcs, name, bases, namespace, **kwargs):
            if bases and any(isinstance(b, Meta) for b in bases):
                raise TypeError("final: no subclass of this class")
            return super().__new__(mcs, name, bases, namespace)

    ran = []

    class Final(metaclass=Meta):
        def __del__(self):
            ran.append(1)

    registry = exitsafe.Registry()
    obj = Final()
    handle = exitsafe.adopt(obj, close=type(obj).__del__, registry=registry)
    from exitsafe import _report

    records = []

    class Catch(__import__("logging").Handler):
        def emit(self, record):
            records.append(record.getMessage())

    catcher = Catch()
    _report.log().addHandler(catcher)
    try:
        handle.release()
    finally:
        _report.log().removeHandler(catcher)
    assert ran == [1]
    assert type(obj) is Final
    assert any("Final.__del__ ran as the close" in r and "may run again" in r for r in records)
    registry.teardown()

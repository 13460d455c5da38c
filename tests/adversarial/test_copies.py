"""A handle cannot be copied, deep-copied or pickled, in either core.

A copy of a handle is a second live handle of the same native object: the pure-Python
core accepted ``copy.copy`` and ``copy.deepcopy`` (deepcopy cloned the registry too), and
each copy released the object again ("released dev / released dev", two ledger outcomes),
while the compiled core refused with "cannot pickle 'Handle' object".  Both refuse now with
a TypeError that names the way to share a handle: ``retain()``.
"""

from __future__ import annotations

import pytest

from ..support import assert_clean, run_program

CORES = {"compiled": "0", "python": "1"}


@pytest.mark.parametrize("core", list(CORES))
def test_copy_deepcopy_and_pickle_of_a_handle_are_refused_naming_retain(tmp_path, core):
    body = """
        import copy, ctypes, pickle
        import exitsafe.ctypes as es_ctypes

        buf = ctypes.create_string_buffer(8)
        handles = {
            "tracked": exitsafe.track("dev", record, name="dev"),
            "with options": exitsafe.track("opt", record, name="opt", exit_policy="release"),
            "hook": exitsafe.on_teardown(lambda: None, name="hook"),
            "ctypes": es_ctypes.track(ctypes.addressof(buf), lambda p: record("ptr"), name="ptr"),
        }
        ways = {
            "copy": copy.copy,
            "deepcopy": copy.deepcopy,
            "deepcopy in a list": lambda h: copy.deepcopy([h]),
        }
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            ways[f"pickle {protocol}"] = lambda h, p=protocol: pickle.dumps(h, protocol=p)
        for label, handle in handles.items():
            for way, fn in ways.items():
                try:
                    fn(handle)
                except TypeError as exc:
                    assert "retain()" in str(exc), (label, way, str(exc))
                    print(label, way, "refused")
                else:
                    print(label, way, "ACCEPTED")
        print(exitsafe.lowlevel.CORE)
        for label in ("tracked", "with options", "ctypes"):
            handles[label].release()
        handles.clear()
        gc.collect()
        print(sorted((e.name, e.outcome) for e in exitsafe.lowlevel.default_registry().ledger()))
    """
    run = run_program(body, tmp_path, env={"EXITSAFE_PURE_PYTHON": CORES[core]})
    assert_clean(run)
    lines = run.stdout.splitlines()
    assert lines[-2] == core
    refusals = lines[:-2]
    assert refusals and all(line.endswith(" refused") for line in refusals), run.describe()
    assert len(refusals) == 4 * (3 + 6), run.describe()  # (pickle protocols 0-5)
    # each native object released once, by its one handle: no copy released it again
    assert sorted(run.order) == ["dev", "opt", "ptr"], run.describe()
    assert lines[-1] == "[('dev', 'released'), ('opt', 'released'), ('ptr', 'released')]"


@pytest.mark.parametrize("core", list(CORES))
def test_the_refusal_leaves_the_handle_and_its_registry_untouched(tmp_path, core):
    """A refused deepcopy clones nothing: the registry still has one live handle, and the
    exit releases the object once."""
    body = """
        import copy
        reg = exitsafe.Registry("own")
        h = reg.track("dev", record, name="dev")
        for fn in (copy.copy, copy.deepcopy):
            try:
                fn(h)
            except TypeError:
                pass
        print(len(reg), [i.name for i in reg.live_handles()], h.owners, h.state)
        other = h.retain()
        print(other is h, h.owners)
    """
    run = run_program(body, tmp_path, env={"EXITSAFE_PURE_PYTHON": CORES[core]}, ledger=True)
    assert_clean(run)
    assert run.stdout.splitlines() == ["1 ['dev'] 1 live", "True 2"], run.describe()
    assert run.order == ["dev"], run.describe()
    assert run.outcomes("own") == {"dev": "released_at_exit"}

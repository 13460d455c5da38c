"""The program generator itself (:mod:`tests.adversarial.fuzz.scenario`) draws only programs
exitsafe accepts: hook graphs without a cycle.

It drew hooks whose ``before=`` / ``after=`` edges closed a cycle through two hooks (``k1``
before ``h1``, ``h1`` before ``k2``, ``k2`` before ``h4``, ``h4`` before ``k1``): the program
died on a correct DependencyCycleError at its ``on_teardown`` and tested nothing else
(``EXITSAFE_FUZZ_SEED=914287`` failed on its first example).  No subprocess here: each
drawn graph is registered in a registry of this process.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import exitsafe

from .fuzz.scenario import HandleSpec, HookSpec, handle_specs, hook_specs, is_acyclic, scenarios

#: The cycle the generator drew: five handles, three hooks.
CYCLIC_HANDLES = (
    HandleSpec("h0", (), None, 0),
    HandleSpec("h1", (0,), None, 0),
    HandleSpec("h2", (0, 1), None, 0),
    HandleSpec("h3", (0, 1, 2), None, 0),
    HandleSpec("h4", (), None, 0),
)
CYCLIC_HOOKS = (
    HookSpec("k0", (3,), ()),
    HookSpec("k1", (1, 3), (4,)),
    HookSpec("k2", (0, 4), (1,)),
)

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register(handles: tuple[HandleSpec, ...], hooks: tuple[HookSpec, ...]) -> None:
    """Declare the graph to exitsafe, as the rendered program does (raises
    DependencyCycleError for a cycle); then tear it down."""
    reg = exitsafe.Registry("generated-graph")
    made: list[exitsafe.Handle] = []
    try:
        for spec in handles:
            made.append(
                reg.track(spec.name, lambda raw: None, name=spec.name,
                          depends_on=[made[p] for p in spec.parents])
            )
        for hook in hooks:
            reg.on_teardown(
                lambda: None,
                before=[made[i] for i in hook.before],
                after=[made[i] for i in hook.after],
                name=hook.name,
            )
    finally:
        reg.teardown()


def test_the_cycle_check_agrees_with_exitsafe_on_the_drawn_cycle():
    assert not is_acyclic(CYCLIC_HANDLES, CYCLIC_HOOKS)
    with pytest.raises(exitsafe.lowlevel.DependencyCycleError):
        register(CYCLIC_HANDLES, CYCLIC_HOOKS)
    assert is_acyclic(CYCLIC_HANDLES, CYCLIC_HOOKS[:2])
    register(CYCLIC_HANDLES, CYCLIC_HOOKS[:2])


@settings(
    max_examples=1000, deadline=None, database=None, derandomize=True,
    suppress_health_check=_QUIET,
)
@given(handle_specs().flatmap(lambda handles: st.tuples(st.just(handles), hook_specs(handles))))
def test_hook_graphs_drawn_are_acyclic_and_accepted(graph):
    handles, hooks = graph
    assert is_acyclic(handles, hooks), graph
    register(handles, hooks)  # no DependencyCycleError


def _series(seed_value: int | None, examples: int):  # type: ignore[no-untyped-def]
    """The scenarios ``test_generated_programs`` draws with ``EXITSAFE_FUZZ_SEED``
    (``None``: its default, derandomized series)."""
    drawn = []

    @settings(
        max_examples=examples, deadline=None, database=None,
        derandomize=seed_value is None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=_QUIET,
    )
    @given(scenarios())
    def draw(s):  # type: ignore[no-untyped-def]
        drawn.append(s)

    if seed_value is not None:
        draw = seed(seed_value)(draw)
    draw()
    return drawn


@pytest.mark.parametrize("seed_value", [None, 914287])
def test_the_generated_programs_series_have_acyclic_hook_graphs(seed_value):
    for s in _series(seed_value, 100):
        assert is_acyclic(s.handles, s.hooks), s
        register(s.handles, s.hooks)

"""Generated programs (see :mod:`tests.adversarial.fuzz`): each runs in a fresh interpreter
and must satisfy every invariant of :mod:`tests.adversarial.fuzz.check`.

CI draws a fixed series of ``EXITSAFE_FUZZ_EXAMPLES`` programs (default 25) and writes no
hypothesis database; ``EXITSAFE_FUZZ_EXAMPLES=500`` is the long local run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, seed, settings

from ..support import run_program
from .fuzz.check import check
from .fuzz.model import expect
from .fuzz.render import render
from .fuzz.scenario import Scenario, scenarios

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the programs fork")

EXAMPLES = int(os.environ.get("EXITSAFE_FUZZ_EXAMPLES", "25"))
SEED = os.environ.get("EXITSAFE_FUZZ_SEED")
#: Shrinking reruns programs for minutes; ask for it when minimizing a failure.
SHRINK = os.environ.get("EXITSAFE_FUZZ_SHRINK") == "1"

#: A hang is killed after this; a healthy program takes well under a second.
HARD_TIMEOUT = 60.0


def run_scenario(s: Scenario, tmp: Path) -> None:
    """Run one scenario's program and check it; a failure shows the program."""
    text = render(s)
    run = run_program(
        text,
        tmp,
        env={"EXITSAFE_LEDGER": str(tmp / "ledger-{pid}.json")},
        timeout=HARD_TIMEOUT,
    )
    try:
        check(s, expect(s), run, tmp)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- scenario\n{s}\n--- program\n{text}\n{run.describe()}"
        ) from None


_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=SEED is None,
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else []),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_settings
@given(scenarios())
def _generated(s: Scenario) -> None:
    # What was drawn (pytest --hypothesis-show-statistics).
    event(f"exit={s.exit}")
    event(f"fork={s.child.exit if s.child else None}")
    event(f"borrows={sorted('forever' if b.forever else 'transient' for b in s.borrows)}")
    event(f"hooks={len(s.hooks)} handles={len(s.handles)}")
    with tempfile.TemporaryDirectory(prefix="exitsafe-fuzz-") as tmp:
        run_scenario(s, Path(tmp))


if SEED is not None:
    _generated = seed(int(SEED))(_generated)


def test_generated_programs_keep_every_invariant() -> None:
    _generated()

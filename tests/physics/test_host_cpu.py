"""The shared host's rules (wansim.stages.host_cpu): the processor-sharing rate and the
mean-value stretch, against hand-worked values and a Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.stages.host_cpu import mean_stretch, share_rate, stage_stretches


def test_share_rate_by_hand():
    assert share_rate(1, 2) == 1.0
    assert share_rate(2, 2) == 1.0
    assert share_rate(3, 2) == pytest.approx(2 / 3, rel=1e-15)
    assert share_rate(4, 1) == 0.25


def test_stretch_is_one_when_the_cores_cover_every_slot():
    for slots in (1, 2, 3):
        for computing in (0.0, 0.5, float(slots)):
            assert mean_stretch(computing, slots, cores=slots) == 1.0
    assert mean_stretch(0.9, 1, cores=1) == 1.0  # one pass in flight: never shares


def test_stretch_by_hand():
    # 2 slots, 1 core, half the time computing: the other slot computes with q = 0.5,
    # so the stretch is 0.5 * 1 + 0.5 * 2 = 1.5
    assert mean_stretch(1.0, 2, cores=1) == pytest.approx(1.5, rel=1e-15)
    # 4 slots, 2 cores, always computing: (1 + 3) / 2 = 2
    assert mean_stretch(4.0, 4, cores=2) == pytest.approx(2.0, rel=1e-15)
    # nothing else computing: 1
    assert mean_stretch(0.0, 4, cores=2) == 1.0


@pytest.mark.parametrize(("computing", "slots", "cores"), [(1.3, 4, 2), (2.2, 6, 2), (0.7, 3, 1)])
def test_stretch_matches_a_monte_carlo(computing, slots, cores):
    """Draw the other slots' states independently (probability computing / slots each) and
    average max(1, (1 + busy others) / cores). 400,000 draws: the estimate's standard error is
    below 0.002 (the stretch's sd is below 1.5), so 0.01 is over 5 standard errors."""
    rng = np.random.default_rng(7)
    q = computing / slots
    others = (rng.random((400_000, slots - 1)) < q).sum(axis=1)
    mc = np.maximum(1.0, (1.0 + others) / cores).mean()
    assert mean_stretch(computing, slots, cores) == pytest.approx(mc, abs=0.01)


def test_stage_stretches_by_hand():
    """Each stage sees the other passes compute with q_i = (m - rho_i) / (slots - rho_i):
    - 2 slots, 1 core, both stages always computing: q = 1, each pass shares: 2, 2;
    - 3 slots, 2 cores, a saturated stage 0 (rho 1, 0.5, 0.5; m = 2): q_0 = 1 / 2, so both
      others compute with 1/4: 1 + 1/4 * 1/2 = 1.125; q_1 = 1.5 / 2.5 = 0.6: 1 + 0.36 / 2;
    - the cores covering every slot: 1."""
    assert stage_stretches([1.0, 1.0], 2, 1) == pytest.approx([2.0, 2.0], rel=1e-15)
    got = stage_stretches([1.0, 0.5, 0.5], 3, 2)
    assert got == pytest.approx([1.125, 1.18, 1.18], rel=1e-12)
    assert list(stage_stretches([0.9, 0.4], 2, 2)) == [1.0, 1.0]
    # all stages saturated: every pass shares with every slot: slots / cores
    assert stage_stretches([1.0] * 4, 4, 2) == pytest.approx([2.0] * 4, rel=1e-12)

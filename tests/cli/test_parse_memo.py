"""The parse memo (``parsing_memoised``, used by the grid's per-value validation) changes no
outcome: every scenario loaded inside it equals the one loaded without it, and every bad value
fails with the same one-line message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REFERENCE
from wansim.analytical.grid import evaluate_grid
from wansim.config.scenario import load_scenario, scenario_to_dict
from wansim.config.validation import parsing_memoised
from wansim.errors import WansimInputError

FIELDS = (
    "stages",
    "speculation.k",
    "speculation.policy",
    "network.latency_ms",
    "network.bandwidth_mbps",
    "network.loss_rate",
    "payload.activation_bits",
    "model.compute.base_ms",
    "drafter.acceptance.alpha",
    "drafter.draft_ms",
    "workload.concurrency",
    "schedule.max_inflight_blocks",
)
# values that compare equal in Python but parse differently (1, 1.0, True; 0.0, -0.0; "1")
VALUES = st.one_of(
    st.sampled_from([0, 1, 1.0, True, False, 0.0, -0.0, "1", "none", None, 3, 3.0, 1e-12]),
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _outcome(raw, overrides):
    try:
        return "ok", load_scenario(data=raw, overrides=overrides)
    except WansimInputError as err:
        return "error", str(err)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=3), max_size=12))
def test_memoised_loads_equal_plain_loads(overrides_list):
    raw = scenario_to_dict(load_scenario(REFERENCE))
    plain = [_outcome(raw, o) for o in overrides_list]
    with parsing_memoised():
        memoised = [_outcome(raw, o) for o in overrides_list]
    assert memoised == plain


def test_confusable_values_are_not_shared():
    """``True`` equals ``1`` and hashes alike, but only 1 is a valid stage count."""
    raw = scenario_to_dict(load_scenario(REFERENCE))
    with parsing_memoised():
        assert load_scenario(data=raw, overrides={"stages": 1}).stages == 1
        with pytest.raises(WansimInputError, match="stages: must be an integer"):
            load_scenario(data=raw, overrides={"stages": True})
        ok = load_scenario(data=raw, overrides={"network.latency_ms": 1})
        with pytest.raises(WansimInputError, match=r"network\.latency_ms: must be a number"):
            load_scenario(data=raw, overrides={"network.latency_ms": True})
    assert ok.network.latency_ms == 1.0


def test_the_memo_ends_with_its_block():
    from wansim.config import validation

    with parsing_memoised():
        load_scenario(REFERENCE)
        assert validation._MEMO.get()
    assert validation._MEMO.get() is None


def test_grid_reports_the_first_bad_value_as_before():
    sc = load_scenario(REFERENCE)
    for grid, message in (
        ({"network.latency_ms": [1.0, 2.0, -1.0]}, "network.latency_ms"),
        ({"stages": [2, 3], "speculation.k": [1, 0]}, "speculation.k"),
    ):
        with pytest.raises(WansimInputError) as memoised:
            evaluate_grid(sc, grid)
        raw = scenario_to_dict(sc)
        with pytest.raises(WansimInputError) as plain:
            for key, values in grid.items():
                for v in values:
                    load_scenario(data=raw, overrides={key: v})
        assert str(memoised.value) == str(plain.value)
        assert message in str(plain.value)

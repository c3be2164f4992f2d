"""What the paths that compute a run without events are checked with against the per-event
engine (``simulate(..., per_event=True)``): equality to the bit of every metric and every
array of the run record, and the random per-hop links their hypothesis tests draw."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

RECORD_ARRAYS = (
    "arrival_ms",
    "admitted_ms",
    "first_token_ms",
    "finish_ms",
    "decode_tokens",
    "committed",
    "passes",
    "laps_ms",
    "lap_request",
    "lap_tokens",
    "stage_busy_ms",
    "link_messages",
    "link_bytes",
    "link_bytes_decode",
    "failed",
)
RECORD_TOTALS = ("verify_passes", "tokens_verified", "tokens_committed", "target_exact")
JITTERS = [
    {"kind": "normal", "std_ms": 3.0},
    {"kind": "lognormal", "std_ms": 2.0},
    {"kind": "pareto", "shape": 2.5, "std_ms": 1.0},
    {"kind": "empirical", "samples_ms": [0.0, 0.5, 4.0, 11.0]},
]


def identical(a, b) -> bool:
    """Equal to the bit (NaN equal to NaN), through lists, tuples and dicts."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    return a == b


def assert_same_result(fast, slow) -> None:
    """Two results of one scenario: the same metrics, record arrays (values, dtypes, shapes),
    totals and interval method."""
    assert fast.metrics.keys() == slow.metrics.keys()
    for name, value in slow.metrics.items():
        assert identical(fast.metrics[name], value), (name, fast.metrics[name], value)
    a, b = fast.details["record"], slow.details["record"]
    for name in RECORD_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y), name  # same values, exactly
    for name in RECORD_TOTALS:
        assert getattr(a, name) == getattr(b, name), name
    assert a.cancelled_stage_tokens == b.cancelled_stage_tokens
    assert fast.details["ci_method"] == slow.details["ci_method"]


def hops(jitters: list[dict]):
    """A per-hop override drawn from a few values of each of its fields."""
    return st.fixed_dictionaries(
        {},
        optional={
            "latency_ms": st.sampled_from([0.0, 2.5, 60.0]),
            "bandwidth_mbps": st.sampled_from([2.0, 300.0]),
            "loss_rate": st.sampled_from([0.0, 0.1]),
            "per_message_ms": st.sampled_from([0.0, 0.7]),
            "codec_ms_per_mb": st.sampled_from([0.0, 3.0]),
            "jitter": st.sampled_from(jitters),
        },
    )

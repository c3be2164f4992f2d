"""How many sequences fit: the one rule every caller (``wansim plan``, a deployment run as a
scenario, an engine's memory-aware admission) uses.

A stage's memory is affine in the batch b: ``fixed_gb + b * per_sequence_gb`` (weights,
drafter, runtime reserve fixed; KV cache and activations per sequence), so the largest batch
every stage holds is min over stages of floor((capacity - fixed) / per_sequence), 0 when a
stage cannot hold one sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_BATCH = 1 << 20  # a stage whose per-sequence memory is ~0 still admits a bounded batch


def largest_batch(
    capacity_gb: Sequence[float], fixed_gb: Sequence[float], per_sequence_gb: Sequence[float]
) -> int:
    """The most sequences every stage can hold (per-stage lists of equal length)."""
    best = MAX_BATCH
    for cap, fixed, per in zip(capacity_gb, fixed_gb, per_sequence_gb, strict=True):
        room = cap - fixed
        if room < 0:
            return 0
        if per > 0:
            b = math.floor(room / per)
            # guard the floor against rounding at an exact fit
            while b > 0 and fixed + b * per > cap:
                b -= 1
            while fixed + (b + 1) * per <= cap and b < MAX_BATCH:
                b += 1
            best = min(best, b)
    return int(best)

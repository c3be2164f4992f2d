"""What one analytical model answers for a scalar scenario: its mean metrics, percentiles,
per-stage utilisation, details and the lap and TPOT distributions (shared by the models in
:mod:`wansim.analytical.engine` and the modules it dispatches to)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from wansim.analytical.decode_tails import DecodeParts


@dataclasses.dataclass(frozen=True)
class Percentiles:
    """A request's lap and TPOT percentiles (ms)."""

    lap_ms_p50: float
    lap_ms_p99: float
    tpot_ms_p50: float
    tpot_ms_p99: float


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one model gives for a scalar scenario: the mean metrics (the keys of
    :func:`wansim.analytical.sync.sync_metrics`, scalars), the percentiles, the per-stage
    utilisation and the model's details."""

    means: dict[str, float]
    percentiles: Percentiles
    utilization: list[float]
    details: dict[str, Any]
    lap_values_ms: np.ndarray  # one request's lap distribution on a uniform grid
    lap_pmf: np.ndarray
    decode: DecodeParts | None = None  # TPOT's parts (wansim.analytical.decode_tails)

"""Bounds on reported metrics: ``METRIC<=VALUE`` / ``METRIC>=VALUE`` (``wansim capacity --slo``,
``wansim optimize --constraint``), parsed once and checked against a metrics dict."""

from __future__ import annotations

import dataclasses
import math
import re

from wansim.errors import WansimInputError
from wansim.results.metric_names import FAULT_METRICS, METRICS

# metrics a bound may name: every scalar number both engines report (the faults' with faults)
NOT_BOUNDABLE = ("stage_utilization", "tokens_per_s_ci95", "target_exact")
BOUNDABLE = tuple(name for name in {**METRICS, **FAULT_METRICS} if name not in NOT_BOUNDABLE)

_BOUND = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*(\S+)\s*$")


@dataclasses.dataclass(frozen=True)
class Bound:
    """``metric op value``: op ``<=`` (an upper bound) or ``>=`` (a lower bound)."""

    metric: str
    op: str
    value: float

    def holds(self, metrics: dict) -> bool:
        """Whether the metrics meet it (a missing or non-finite value never does)."""
        got = metrics.get(self.metric)
        if got is None or isinstance(got, (list, tuple)):
            return False
        got = float(got)
        if not math.isfinite(got):
            return False
        return got <= self.value if self.op == "<=" else got >= self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_bound(flag: str, text: str) -> Bound:
    """'tpot_ms_p99<=60' -> Bound; bad input is one line naming the flag, the value and what
    is allowed (the known metrics for an unknown one)."""
    m = _BOUND.match(str(text))
    if not m:
        raise WansimInputError(flag, "expected METRIC<=VALUE or METRIC>=VALUE", text)
    name, op, raw = m.groups()
    if name not in BOUNDABLE:
        raise WansimInputError(
            flag, f"unknown metric {name!r} (known: {', '.join(BOUNDABLE)})", text
        )
    try:
        value = float(raw)
    except ValueError:
        raise WansimInputError(flag, "the bound must be a number", text) from None
    if not math.isfinite(value):
        raise WansimInputError(flag, "the bound must be a finite number", text)
    return Bound(name, op, value)

"""What an engine returns: the scenario, the metrics dict, and optional detail tables."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from wansim.config.scenario import Scenario
from wansim.results.metric_names import scalar_metrics
from wansim.results.strict_json import non_finite_paths, plain

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class Result:
    scenario: Scenario
    engine: str  # "des" | "analytical"
    metrics: dict[str, Any]
    details: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    # analytical results: {"regime", "validated", "error_band"} (wansim.analytical.regime)
    approximation: dict[str, Any] | None = dataclasses.field(
        default=None, hash=False, compare=False
    )

    @classmethod
    def analytical(
        cls, scenario: Scenario, metrics: dict, details: dict, approximation: dict | None
    ) -> Result:
        """An analytical engine's result (``approximation``: its regime, validity and band)."""
        return cls(scenario, "analytical", metrics, details, approximation)

    def to_frame(self) -> pd.DataFrame:
        """One row: the scenario name, the engine and every metric as a scalar column."""
        import pandas as pd  # (imported here: a CLI run that prints JSON never needs it)

        row = {"scenario": self.scenario.name, "engine": self.engine}
        row.update(scalar_metrics(self.metrics))
        return pd.DataFrame([row])

    def undefined(self) -> dict[str, str]:
        """Metric name -> why it has no value (``null`` in JSON): the engine's reason, else
        "not a finite number"."""
        reasons = self.details.get("undefined", {})
        return {
            name: reasons.get(name, "not a finite number")
            for name, value in self.metrics.items()
            if value is None
            or non_finite_paths(value)
            or (isinstance(value, (list, tuple)) and None in value)  # an unbounded side
        }

    def to_json(self) -> dict:
        """Strict-JSON-ready: ``metrics`` with non-finite values as ``None``, and an
        ``undefined`` mapping (metric -> reason) when any metric has no value."""
        out = {
            "scenario": self.scenario.name,
            "engine": self.engine,
            "metrics": jsonable(self.metrics),
        }
        if undefined := self.undefined():
            out["undefined"] = undefined
        if self.approximation is not None:
            out["approximation"] = jsonable(self.approximation)
        return out


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays -> plain Python, non-finite floats -> None (strict JSON)."""
    return plain(obj)

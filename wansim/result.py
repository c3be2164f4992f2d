"""What an engine returns: the scenario, the metrics dict, and optional detail tables."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from wansim.metrics import scalar_metrics
from wansim.scenario import Scenario

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class Result:
    scenario: Scenario
    engine: str  # "des" | "analytical"
    metrics: dict[str, Any]
    details: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def to_frame(self) -> pd.DataFrame:
        """One row: the scenario name, the engine and every metric as a scalar column."""
        import pandas as pd  # (imported here: a CLI run that prints JSON never needs it)

        row = {"scenario": self.scenario.name, "engine": self.engine}
        row.update(scalar_metrics(self.metrics))
        return pd.DataFrame([row])

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario.name,
            "engine": self.engine,
            "metrics": jsonable(self.metrics),
        }


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays -> plain Python for json.dumps."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj

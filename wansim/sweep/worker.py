"""What a worker runs: a batch of (run id, scenario) -> scalar metrics, whatever the backend.

Kept import-light and free of state so every backend (in-process, process pool, Dask worker)
runs exactly the same code on the same pickled scenarios.
"""

from __future__ import annotations

import traceback
from typing import Any

from wansim.config.scenario import Scenario
from wansim.errors import WansimInputError
from wansim.results.metric_names import scalar_metrics


def run_one(engine: str, scenario: Scenario) -> dict[str, Any]:
    if engine == "analytical":
        from wansim.analytical import analyze

        result = analyze(scenario)
    elif engine == "des":
        from wansim import simulate

        result = simulate(scenario)
    else:  # the spec parser only lets des | analytical through
        raise ValueError(f"unknown engine {engine!r}")
    return scalar_metrics(result.metrics)


def run_batch(engine: str, runs: list[tuple[int, Scenario]]) -> list[tuple[int, Any, Any]]:
    """[(run id, metrics, None)] or, for the first run that fails, [.., (run id, None, error)]
    with error = ("input", message) for bad input or ("crash", traceback) for a bug. The batch
    stops at a failure: the sweep does too."""
    out: list[tuple[int, Any, Any]] = []
    for run_id, scenario in runs:
        try:
            out.append((run_id, run_one(engine, scenario), None))
        except WansimInputError as err:
            out.append((run_id, None, ("input", str(err))))
            break
        except Exception:
            out.append((run_id, None, ("crash", traceback.format_exc())))
            break
    return out

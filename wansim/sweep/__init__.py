"""Sweeps: grids of scenarios from YAML, run on a local pool or a Dask cluster, resumable.

``wansim sweep SWEEP.yaml --out DIR`` (see :mod:`wansim.sweep.spec` for the file format,
:mod:`wansim.sweep.store` for the results layout, :mod:`wansim.sweep.executors` for backends).
Python: ``run_sweep("scenarios/x-sweep.yaml", "out/x").table``.
"""

from wansim.sweep.runner import SweepOutcome, SweepRunError, run_sweep
from wansim.sweep.spec import Plan, Sweep, SweepError, load_sweep, parse_sweep, plan

__all__ = [
    "Plan",
    "Sweep",
    "SweepError",
    "SweepOutcome",
    "SweepRunError",
    "load_sweep",
    "parse_sweep",
    "plan",
    "run_sweep",
]

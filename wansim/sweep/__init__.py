"""Sweeps: grids of scenarios from YAML, run on a local pool or a Dask cluster, resumable.

``wansim sweep SWEEP.yaml --out DIR`` (see :mod:`wansim.sweep.spec` for the file format,
:mod:`wansim.sweep.store` for the results layout, :mod:`wansim.sweep.executors` for backends).
Python: ``run_sweep("scenarios/x-sweep.yaml", "out/x").table``.

Names are imported on first use: importing one submodule (a CLI command's) does not pull
in the others' dependencies (pandas, scipy).
"""

from __future__ import annotations

from wansim.support.lazy import lazy_exports

_EXPORTS = {
    "SweepOutcome": "wansim.sweep.runner",
    "SweepRunError": "wansim.sweep.runner",
    "run_sweep": "wansim.sweep.runner",
    "Plan": "wansim.sweep.spec",
    "Sweep": "wansim.sweep.spec",
    "SweepError": "wansim.sweep.spec",
    "load_sweep": "wansim.sweep.spec",
    "parse_sweep": "wansim.sweep.spec",
    "plan": "wansim.sweep.spec",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

"""Analytical engine: closed forms, vectorised over parameter grids (never imports simpy).

Names are imported on first use: importing one submodule (a CLI command's) does not pull
in the others' dependencies (pandas, scipy).
"""

from __future__ import annotations

from wansim.support.lazy import lazy_exports

_EXPORTS = {
    "analyze": "wansim.analytical.engine",
    "check_supported": "wansim.analytical.coverage",
    "evaluate_grid": "wansim.analytical.grid",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

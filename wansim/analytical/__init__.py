"""Analytical engine: closed forms, vectorised over parameter grids (never imports simpy).

Names are imported on first use: importing one submodule (a CLI command's) does not pull
in the others' dependencies (pandas, scipy).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "analyze": "wansim.analytical.engine",
    "check_supported": "wansim.analytical.engine",
    "evaluate_grid": "wansim.analytical.grid",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the defining module on first use (module ``__getattr__``, PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

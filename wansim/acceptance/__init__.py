"""Acceptance: profiles, closed forms, per-prompt difficulty, domain shift, sampling.

Names are imported on first use: importing one submodule (a CLI command's) does not pull
in the others' dependencies (pandas, scipy).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "implied_tau": "wansim.acceptance.closed_form",
    "outcome_pmf": "wansim.acceptance.closed_form",
    "tau": "wansim.acceptance.closed_form",
    "tau_constant": "wansim.acceptance.closed_form",
    "AcceptanceModel": "wansim.acceptance.model",
    "acceptance_model": "wansim.acceptance.model",
    "Profile": "wansim.acceptance.profile",
    "WorkloadProfile": "wansim.acceptance.profile",
    "load_profile": "wansim.acceptance.profile",
    "write_profile": "wansim.acceptance.profile",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the defining module on first use (module ``__getattr__``, PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""Acceptance: profiles, closed forms, per-prompt difficulty, domain shift, sampling.

Names are imported on first use: importing one submodule (a CLI command's) does not pull
in the others' dependencies (pandas, scipy).
"""

from __future__ import annotations

from wansim.support.lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)

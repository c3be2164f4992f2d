"""Acceptance: profiles, closed forms, per-prompt difficulty, domain shift, sampling."""

from wansim.acceptance.closed_form import implied_tau, outcome_pmf, tau, tau_constant
from wansim.acceptance.model import AcceptanceModel, acceptance_model
from wansim.acceptance.profile import Profile, WorkloadProfile, load_profile, write_profile

__all__ = [
    "AcceptanceModel",
    "Profile",
    "WorkloadProfile",
    "acceptance_model",
    "implied_tau",
    "load_profile",
    "outcome_pmf",
    "tau",
    "tau_constant",
    "write_profile",
]

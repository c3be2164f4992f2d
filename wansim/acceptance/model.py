"""The acceptance model both engines draw from: per-position rates, difficulty, domain shift.

A model holds conditional rates q_1..q_Kmax at median difficulty, the logit-normal spread sigma
of per-request difficulty (see :mod:`wansim.acceptance.heterogeneity`) and a domain-shift factor
g in (0, 1] that multiplies every conditional rate (Literature review, Pluralis, compiled August–October 2026, Part IX: a generic drafter loses
28-38% of its acceptance out of domain; on a fine-tuned target tau ~ 1.2). "Acceptance" can be
read three ways, each a different g: the first-position rate p_1 (g = 0.62-0.72 directly),
tokens per pass tau or accepted drafts per pass tau - 1 (on the reference math profile
g ~ 0.80-0.86 and 0.85-0.90); :func:`wansim.analytical.tree_sizing.domain_shift_for` solves
for g under each reading.

Request with difficulty Z:  p_i(Z) = g * sigmoid(logit(q_i) + sigma Z).

Beyond the measured positions, ``extrapolate`` holds the last measured rate.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np

from wansim.acceptance import closed_form, heterogeneity
from wansim.acceptance.activation_quality import BitQuality, load_table, quality_at
from wansim.acceptance.profile import load_profile
from wansim.config.drafter import AcceptanceSpec
from wansim.errors import ScenarioError


@dataclasses.dataclass(frozen=True)
class AcceptanceModel:
    rates: tuple[float, ...]  # q_1..q_Kmax at median difficulty, before domain shift
    sigma: float = 0.0  # logit-normal per-request difficulty spread
    domain_shift: float = 1.0
    extrapolate: bool = False
    label: str = ""
    # the profile's measured guess: P(A >= K + 1 | A >= K) at K = len(rates), pooled
    # (wansim.acceptance.bet); None: the last rate is held for the guess
    guess_rate: float | None = None

    @property
    def measured_positions(self) -> int:
        return len(self.rates)

    def base_rates(self, k: int) -> np.ndarray:
        """q_1..q_k (holding the last rate beyond the measured positions when allowed)."""
        q = np.asarray(self.rates, dtype=float)
        if k <= len(q):
            return q[:k]
        if not self.extrapolate:
            raise ScenarioError(
                "speculation.k",
                f"acceptance measured positions 1..{len(q)} (set drafter.acceptance.extrapolate"
                " to hold the last rate)",
                k,
            )
        return np.concatenate([q, np.full(k - len(q), q[-1])])

    def nodes(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Quadrature over difficulty: (weights (Q,), rates (Q, k)) after domain shift.

        Q = 1 when there is no heterogeneity. Expectations over requests are
        ``weights @ f(rates)``.
        """
        q = self.base_rates(k)
        if self.sigma == 0:
            return np.ones(1), self.domain_shift * q[None, :]
        z, w = heterogeneity.quadrature()
        return w, self.domain_shift * heterogeneity.node_rates(q, self.sigma, z)

    def request_rates(self, rng: np.random.Generator, n_requests: int, k: int) -> np.ndarray:
        """Per-request conditional rates (n_requests, k): one difficulty draw per request."""
        q = self.base_rates(k)
        if self.sigma == 0:
            return np.broadcast_to(self.domain_shift * q, (n_requests, k)).copy()
        z = rng.standard_normal(n_requests)
        return self.domain_shift * heterogeneity.node_rates(q, self.sigma, z)

    def pooled_rates(self, k: int) -> np.ndarray:
        """Step-weighted pooled conditional rates p_1..p_k (what a profile reports)."""
        w, rates = self.nodes(k)
        surv = closed_form.survival(rates)
        omega = w / (1.0 + surv.sum(axis=1))
        pooled_surv = (omega / omega.sum()) @ surv
        prev = np.concatenate([[1.0], pooled_surv[:-1]])
        return pooled_surv / prev

    def tau(self, k: int) -> float:
        """Step-weighted tokens per verify pass for blocks of k (long outputs)."""
        w, rates = self.nodes(k)
        per_node = closed_form.tau(rates)
        return float(1.0 / (w @ (1.0 / per_node)))


def acceptance_model(spec: AcceptanceSpec) -> AcceptanceModel:
    """Build the model a scenario's ``drafter.acceptance`` describes."""
    return _build(spec)


@lru_cache(maxsize=256)
def _build(spec: AcceptanceSpec) -> AcceptanceModel:
    guess = None
    if spec.profile is not None:
        prof = load_profile(spec.profile)
        wl_name = spec.workload or prof.default_workload
        wl = prof.workload(wl_name)
        pooled = wl.per_position
        dispersion = wl.dispersion if spec.dispersion is None else spec.dispersion
        label = f"{prof.header.drafter}/{wl_name}"
        guess = wl.guess_rate
    elif spec.per_position is not None:
        pooled = spec.per_position
        dispersion = spec.dispersion or 0.0
        label = "per_position"
    else:
        alpha = AcceptanceSpec.DEFAULT_ALPHA if spec.alpha is None else spec.alpha
        pooled = (alpha,) * 64
        dispersion = spec.dispersion or 0.0
        label = f"alpha={alpha:g}"
    try:
        q, sigma = heterogeneity.fit(tuple(float(x) for x in pooled), float(dispersion))
    except ValueError as exc:
        raise ScenarioError("drafter.acceptance.dispersion", str(exc), dispersion) from None
    return AcceptanceModel(
        rates=q,
        sigma=sigma,
        domain_shift=spec.domain_shift,
        extrapolate=spec.extrapolate or spec.source == "alpha",
        label=label,
        guess_rate=guess,
    )


def quality_for(spec: AcceptanceSpec, bits: int) -> BitQuality:
    """What activations of ``bits`` cost under this acceptance: the table named by
    ``activation_quality``, else the profile's, else none (:func:`quality_at`)."""
    return _quality_for(spec.activation_quality, spec.profile, int(bits))


@lru_cache(maxsize=256)
def _quality_for(table_file: str | None, profile: str | None, bits: int) -> BitQuality:
    table = None
    if table_file is not None:
        table = load_table(table_file)
    elif profile is not None:
        table = load_profile(profile).activation_quality
    return quality_at(table, bits)

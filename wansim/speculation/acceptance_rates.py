"""The acceptance a speculation policy draws from: the chain model's rates shifted to the
verifier rule, plus the sibling (rank r > 1) logit offsets a tree needs.

Per request with difficulty Z (logit-normal, :mod:`wansim.acceptance.heterogeneity`):

    P0_{d,r}(Z) = sigmoid(logit q_d + delta_v + sigma Z - Delta_r),   Delta_1 = 0
    m_{d,r} = g m0_{d,r}   (marginals, :func:`wansim.acceptance.trees.rate_matrix`)

q_d the fitted median-difficulty chain rates, Delta_r the sibling logit offsets (the profile's
``sibling_logit_offsets``, or measured ``siblings`` converted at depth 1, or
``drafter.acceptance.sibling_logit_offsets``), delta_v the verifier rule's logit shift (0 for the
rule the profile was measured under, else the profile's ``verifier_logit_shift``; missing: an
error, never a silent constant), g the domain shift.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
from scipy.special import expit, logit

from wansim.acceptance import heterogeneity
from wansim.acceptance import trees as tr
from wansim.acceptance.model import AcceptanceModel, acceptance_model
from wansim.acceptance.profile import load_profile
from wansim.config.drafter import AcceptanceSpec
from wansim.errors import ScenarioError


@dataclasses.dataclass(frozen=True)
class SpecAcceptance:
    """The acceptance a policy draws from: chain model (verifier applied) + sibling offsets."""

    model: AcceptanceModel  # rates already shifted to the verifier rule
    offsets: tuple[float, ...]  # Delta_2..Delta_R (empty: no sibling rates known)
    verifier: str
    verifier_shift: float

    @property
    def ranks(self) -> int:
        return 1 + len(self.offsets)

    @property
    def target_exact(self) -> bool:
        return self.verifier != "typical"

    def depth_cap(self, wanted: int) -> int:
        """Depth a tree may reach: ``wanted``, limited to the measured positions unless the
        model extrapolates."""
        if self.model.extrapolate:
            return wanted
        return min(wanted, self.model.measured_positions)

    def chain_logits(self, depth: int, z: np.ndarray | None = None) -> np.ndarray:
        """logit q_d + sigma z for d = 1..depth: (depth,) or (len(z), depth)."""
        q = np.clip(self.model.base_rates(depth), 1e-12, 1 - 1e-12)
        base = logit(q)
        if z is None:
            return base
        return base[None, :] + self.model.sigma * np.asarray(z, dtype=float)[:, None]

    def rates(self, depth: int, z: np.ndarray | None = None) -> np.ndarray:
        """P_{d,r}: (depth, R) at median difficulty, or (len(z), depth, R)."""
        return tr.rate_matrix(self.chain_logits(depth, z), self.offsets, self.model.domain_shift)

    def nodes(self, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Difficulty quadrature: (weights (Q,), rates (Q, depth, R))."""
        if self.model.sigma == 0:
            return np.ones(1), self.rates(depth)[None]
        z, w = heterogeneity.quadrature()
        return w, self.rates(depth, z)

    def pooled_rates(self, depth: int) -> np.ndarray:
        """(depth, R) design rates: the step-weighted pooled chain rates (what a profile
        reports, domain shift included) with the sibling offsets applied to their logits."""
        pooled = dataclasses.replace(self.model, domain_shift=1.0).pooled_rates(depth)
        pooled = np.clip(pooled, 1e-12, 1 - 1e-12)
        return tr.rate_matrix(logit(pooled), self.offsets, self.model.domain_shift)

    def request_rates(self, rng: np.random.Generator, n: int, depth: int) -> np.ndarray:
        """Per-request P_{d,r}: (n, depth, R), one difficulty draw per request. The rank-1
        column equals ``AcceptanceModel.request_rates`` for the same generator state."""
        if self.model.sigma == 0:
            return np.broadcast_to(self.rates(depth), (n, depth, self.ranks)).copy()
        return self.rates(depth, rng.standard_normal(n))


def acceptance(spec: AcceptanceSpec, verifier: str = "lossless") -> SpecAcceptance:
    """Resolve a scenario's acceptance for a verifier rule (scalar fields only)."""
    return _acceptance(spec, verifier)


@lru_cache(maxsize=256)
def _acceptance(spec: AcceptanceSpec, verifier: str) -> SpecAcceptance:
    base = acceptance_model(spec)
    shift = 0.0
    offsets: tuple[float, ...] = ()
    if spec.profile is not None:
        prof = load_profile(spec.profile)
        wl_name = spec.workload or prof.default_workload
        wl = prof.workload(wl_name)
        found = prof.header.verifier_shift(verifier)
        if found is None:
            raise ScenarioError(
                "speculation.verifier",
                f"the profile was measured under {prof.header.verifier} and gives no"
                f" verifier_logit_shift for {verifier}",
                verifier,
            )
        shift = float(found)
        if wl.sibling_logit_offsets is not None:
            offsets = tuple(float(x) for x in wl.sibling_logit_offsets)
        elif wl.siblings is not None:
            p1 = float(np.clip(wl.per_position[0], 1e-9, 1 - 1e-9))
            sib = np.clip(np.asarray(wl.siblings, dtype=float), 1e-9, 1 - 1e-9)
            offsets = tuple(float(x) for x in logit(p1) - logit(sib))
    if spec.sibling_logit_offsets is not None:
        offsets = tuple(float(x) for x in spec.sibling_logit_offsets)
    model = base
    if shift:
        q = np.clip(np.asarray(base.rates, dtype=float), 1e-12, 1 - 1e-12)
        model = dataclasses.replace(base, rates=tuple(float(x) for x in expit(logit(q) + shift)))
    return SpecAcceptance(model=model, offsets=offsets, verifier=verifier, verifier_shift=shift)

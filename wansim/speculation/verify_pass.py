"""One verify pass of a speculation policy: its shape (tokens verified per sequence, the most
drafts it can accept) and the law of the accepted drafts A (survival S_d = P(A >= d)).

=======  ===================  =========================================================
policy   tokens per pass      accepted drafts A
=======  ===================  =========================================================
none     1                    0
chain    K + 1                P(A >= k) = S_k = prod_{i<=k} p_i
tree     N + 1 (N nodes)      P(A >= d) = S_d = sum of pi(i) over depth-d nodes
=======  ===================  =========================================================

(see :mod:`wansim.acceptance.trees` for pi and S_d). Built by
:func:`wansim.speculation.policies.policy`; trees by :mod:`wansim.speculation.tree_verification`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.acceptance import closed_form
from wansim.acceptance import trees as tr
from wansim.speculation.acceptance_rates import SpecAcceptance


@dataclasses.dataclass(frozen=True)
class Policy:
    """Everything about one scalar point's speculation that both engines need.

    Build with :func:`policy`. ``tree`` is the fixed tree (static, sequoia) or None (chain,
    none, dynamic: one tree per request). ``depth`` is the most drafts a pass can accept,
    ``nodes`` the drafts verified per sequence (K or N; 0 for none).
    """

    kind: str  # none | chain | tree
    tree_kind: str | None
    nodes: int
    depth: int
    acceptance: SpecAcceptance | None
    tree: tr.Tree | None = None

    # -- shape and cost --------------------------------------------------------------------
    def tokens_per_pass(self) -> int:
        """Tokens verified per sequence per pass (K + 1, N + 1, or 1)."""
        return self.nodes + 1

    @property
    def target_exact(self) -> bool:
        return True if self.acceptance is None else self.acceptance.target_exact

    # -- acceptance ------------------------------------------------------------------------
    def _tree_for(self, rates: np.ndarray) -> tr.Tree:
        """The tree verified for a request with rates (depth, R)."""
        if self.tree is not None:
            return self.tree
        return tr.greedy_tree(rates, self.nodes)

    def survival_of(self, rates: np.ndarray) -> np.ndarray:
        """S_1..S_depth per row of request rates ((..., depth, R) -> (..., depth))."""
        rates = np.asarray(rates, dtype=float)
        if self.kind == "none":
            return np.zeros((*rates.shape[:-2], 0))
        if self.kind == "chain":
            return closed_form.survival(rates[..., 0])
        out = np.zeros((*rates.shape[:-2], self.depth))
        flat = rates.reshape(-1, *rates.shape[-2:])
        out2 = out.reshape(-1, self.depth)
        if self.tree is not None:
            s = tr.survival(self.tree, flat)
            out2[:, : s.shape[-1]] = s
        else:
            for i, row in enumerate(flat):
                t = tr.greedy_tree(row, self.nodes)
                s = tr.survival(t, row)
                out2[i, : len(s)] = s
        return out2.reshape(out.shape)

    def difficulty_nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(weights (Q,), survival (Q, depth)): expected acceptance per difficulty node."""
        if self.acceptance is None:
            return np.ones(1), np.zeros((1, 0))
        w, rates = self.acceptance.nodes(self.depth)
        return w, self.survival_of(rates)

    def request_rates(self, rng: np.random.Generator, n_requests: int) -> np.ndarray:
        """Per-request rates (n, depth, R) (one difficulty draw each; none: (n, 0, 1))."""
        if self.acceptance is None:
            return np.zeros((n_requests, 0, 1))
        return self.acceptance.request_rates(rng, n_requests, self.depth)

    def survival(self, rates: np.ndarray) -> np.ndarray:
        """Alias of :meth:`survival_of` (the DES verifier's name)."""
        return self.survival_of(rates)

    def draw(self, rng: np.random.Generator, rates: np.ndarray, size: int) -> np.ndarray:
        """Accepted drafts for ``size`` passes per request row ((n, depth, R) -> (n, size)),
        one uniform per pass against the request's survival (exact in law for trees: see
        :func:`wansim.acceptance.trees.sample_survival`)."""
        rates = np.asarray(rates, dtype=float)
        if self.kind == "none":
            return np.zeros((rates.shape[0], size), dtype=np.int64)
        return tr.sample_survival(rng, self.survival_of(rates), size)

    def walk(self, rng: np.random.Generator, rates: np.ndarray, size: int) -> np.ndarray:
        """Like :meth:`draw` but by simulating the verifier's walk over the tree (per candidate
        Bernoulli draws): slower, used to check :meth:`draw`."""
        rates = np.asarray(rates, dtype=float)
        if self.kind == "none":
            return np.zeros((rates.shape[0], size), dtype=np.int64)
        out = np.empty((rates.shape[0], size), dtype=np.int64)
        for i, row in enumerate(rates):
            t = tr.Tree.chain(self.nodes) if self.kind == "chain" else self._tree_for(row)
            out[i] = tr.sample_walk(rng, t, row, size)
        return out

"""Speculation policies in one place: what a verify pass carries, what drafting costs, what rides
the wire, and how many drafts a pass accepts. Both engines call this module; its functions are
pure (a scenario in, numbers out) and the random ones take the caller's generator.

Policies (``speculation.policy``), per sequence and verify pass:

=======  ===================  =========================================================
policy   tokens per pass      accepted drafts A
=======  ===================  =========================================================
none     1                    0
chain    K + 1                P(A >= k) = S_k = prod_{i<=k} p_i
tree     N + 1 (N nodes)      P(A >= d) = S_d = sum of pi(i) over depth-d nodes
=======  ===================  =========================================================

(see :mod:`wansim.acceptance.trees` for pi and S_d). Trees: ``static`` uses
``speculation.tree.branching`` (children per node at each depth; ``budget_nodes`` is not used);
``sequoia`` is the optimal tree for the *pooled* rates, built once (offline, as Sequoia does);
``dynamic`` is the confidence-shaped greedy tree built per request from that request's own rates.
Depth cap: ``tree.max_depth``, else the positions the acceptance covers (all N with
``extrapolate`` or ``alpha``).

Hedge branches (``schedule.hedge_branches`` = H with policy chain, sync schedule): the chain of K
plus H alternative continuations at its H likeliest rejection points (the rank-2 candidate at
that depth, re-drafted on to depth K; :func:`wansim.acceptance.trees.hedged_chain`), chosen from
the pooled rates. They cost verify width and bytes (they are verified as a tree: N + 1 tokens,
the mask, the drafter's width cost) and save laps (tau rises).

Acceptance, per request with difficulty Z (logit-normal, :mod:`wansim.acceptance.heterogeneity`):

    P0_{d,r}(Z) = sigmoid(logit q_d + delta_v + sigma Z - Delta_r),   Delta_1 = 0
    m_{d,r} = g m0_{d,r}   (marginals, :func:`wansim.acceptance.trees.rate_matrix`)

so P_{d,1} = g P0_{d,1} is the chain model's rate and the top-r coverage of every r shrinks by
the domain shift g (out of domain the whole candidate list is right less often, not only its
first entry). q_d the fitted median-difficulty chain rates, Delta_r the sibling logit
offsets (the profile's ``sibling_logit_offsets``, or measured ``siblings`` converted at depth 1,
or ``drafter.acceptance.sibling_logit_offsets``), delta_v the verifier rule's logit shift: 0 for
the rule the profile was measured under, else the profile's ``verifier_logit_shift`` (missing:
an error, never a silent constant). ``alpha``/``per_position`` rates are taken as the rates of
the scenario's rule. ``typical`` acceptance is lossy: results carry ``target_exact: false``.

Costs per lap for a batch of b sequences (b = ``workload.concurrency`` when ``schedule.batching``
is ``continuous``, else 1; the analytical engine's lockstep batch):

- verify pass: b * tokens_per_pass tokens in every stage (``compute.stage_ms``);
- drafter: ``compute.drafter_tree_ms(drafter, depth, nodes, b)`` (chain: depth = nodes = K);
- forward hop: header + b * (tokens_per_pass * s_act + mask) bytes, mask =
  ``wire.tree_mask_bytes(N)`` for trees, 0 otherwise;
- return hop: b * ``wire.verdict_bytes(...)``: ``return_bytes``, the verified ids and next drafts
  at ``return_token_bytes`` each, the next tree (drafter on last stage), draft features.
- extra tensors (``payload.extra_tensors``) add e_h bytes per token on the hops that carry them.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
from scipy.special import expit, logit

from wansim.acceptance import closed_form, heterogeneity
from wansim.acceptance import trees as tr
from wansim.acceptance.activation_quality import BitQuality
from wansim.acceptance.model import AcceptanceModel, acceptance_model, quality_for
from wansim.acceptance.profile import load_profile
from wansim.compute import drafter_tree_ms
from wansim.errors import ScenarioError
from wansim.scenario import FLUSH_ON_FULL_ACCEPTANCE, AcceptanceSpec, Scenario
from wansim.wire import (
    activation_bytes_per_token,
    extra_bytes_per_token,
    tree_mask_bytes,
    verdict_bytes,
)

MAX_TREE_NODES = 4096
# bounded work: Sequoia's dynamic programme costs D R (N+2)^2 steps (~2e7 a second here)
MAX_SEQUOIA_STEPS = 200_000_000


# ----------------------------------------------------------------------------- acceptance
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


# ----------------------------------------------------------------------------- policy (one point)
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


def bit_quality(scenario: Scenario) -> BitQuality:
    """What the scenario's activation width costs (scalar ``payload.activation_bits``):
    :mod:`wansim.acceptance.activation_quality`."""
    return quality_for(scenario.drafter.acceptance, int(scenario.payload.activation_bits))


def effective_acceptance(scenario: Scenario) -> AcceptanceSpec:
    """The scenario's acceptance with the activation width's factor f_b composed into the
    domain shift (p_i -> g f_b p_i; the factor of the scenario's verifier rule)."""
    acc = scenario.drafter.acceptance
    if scenario.speculation.policy == "none":
        return acc
    f = bit_quality(scenario).factor(scenario.speculation.verifier)
    return acc if f == 1.0 else dataclasses.replace(acc, domain_shift=acc.domain_shift * f)


def policy(scenario: Scenario) -> Policy:
    """The speculation policy of a scenario whose fields are scalars (the activation width's
    acceptance factor applied: :func:`effective_acceptance`)."""
    spec = scenario.speculation
    if spec.policy == "none":
        if scenario.schedule.hedge_branches:
            raise ScenarioError(
                "schedule.hedge_branches",
                "needs speculation (policy chain)",
                scenario.schedule.hedge_branches,
            )
        return Policy("none", None, 0, 0, None)
    acc = acceptance(effective_acceptance(scenario), spec.verifier)
    hedges = int(scenario.schedule.hedge_branches)
    if spec.policy == "chain" and hedges:
        return _hedged_policy(acc, int(spec.k), hedges)
    if spec.policy == "chain":
        return Policy("chain", None, int(spec.k), int(spec.k), acc)
    if hedges:
        raise ScenarioError(
            "schedule.hedge_branches",
            "hedges a chain (policy chain); a tree already branches",
            hedges,
        )
    return _tree_policy(
        acc, spec.tree.kind, spec.tree.budget_nodes, spec.tree.branching, spec.tree.max_depth
    )


@lru_cache(maxsize=256)
def _hedged_policy(acc: SpecAcceptance, k: int, hedges: int) -> Policy:
    if hedges > k:
        raise ScenarioError(
            "schedule.hedge_branches", f"at most one per drafted position (K = {k})", hedges
        )
    if not acc.offsets:
        raise ScenarioError(
            "schedule.hedge_branches",
            "a hedge needs rank-2 rates: a profile with siblings or sibling_logit_offsets, or"
            " drafter.acceptance.sibling_logit_offsets",
            hedges,
        )
    tree = tr.hedged_chain(acc.pooled_rates(k), k, hedges)
    return Policy("tree", "hedged-chain", tree.nodes, tree.max_depth, acc, tree)


@lru_cache(maxsize=512)
def _tree_policy(
    acc: SpecAcceptance,
    kind: str,
    budget: int,
    branching: tuple[int, ...],
    max_depth: int | None,
) -> Policy:
    if not acc.offsets and not (kind == "static" and branching and max(branching) == 1):
        raise ScenarioError(
            "speculation.policy",
            "a tree needs sibling rates: a profile with siblings or sibling_logit_offsets, or"
            " drafter.acceptance.sibling_logit_offsets",
            "tree",
        )
    if kind == "static":
        for i, b in enumerate(branching):
            if b > acc.ranks:
                raise ScenarioError(
                    f"speculation.tree.branching[{i}]",
                    f"the acceptance gives sibling rates for ranks 1..{acc.ranks}",
                    b,
                )
        nodes = tr.static_nodes(branching)
        if nodes > MAX_TREE_NODES:
            raise ScenarioError(
                "speculation.tree.branching",
                f"makes {nodes} nodes (at most {MAX_TREE_NODES})",
                list(branching),
            )
        depth = acc.depth_cap(len(branching))
        if depth < len(branching):
            raise ScenarioError(
                "speculation.tree.branching",
                f"is {len(branching)} deep; the acceptance covers positions 1..{depth} (set"
                " drafter.acceptance.extrapolate to hold the last rate)",
                list(branching),
            )
        tree = tr.static_tree(branching)
        return Policy("tree", kind, tree.nodes, tree.max_depth, acc, tree)
    depth = acc.depth_cap(min(budget, max_depth or budget))
    if kind == "sequoia":
        steps = tr.optimal_tree_steps(acc.pooled_rates(depth), budget)
        if steps > MAX_SEQUOIA_STEPS:
            raise ScenarioError(
                "speculation.tree.budget_nodes",
                f"a sequoia tree of {budget} nodes up to depth {depth} over {acc.ranks} ranks"
                f" takes {steps:.2g} steps to optimise (at most {MAX_SEQUOIA_STEPS:.0e}, ~10 s):"
                " lower budget_nodes or tree.max_depth, or use kind: dynamic",
                budget,
            )
        tree, _ = tr.optimal_tree(acc.pooled_rates(depth), budget)
        return Policy("tree", kind, tree.nodes, tree.max_depth, acc, tree)
    # dynamic: the greedy tree always fills min(budget, capacity) nodes
    capacity = sum(acc.ranks**d for d in range(1, depth + 1)) if acc.ranks > 1 else depth
    nodes = int(min(budget, capacity))
    return Policy("tree", kind, nodes, depth, acc, None)


# ----------------------------------------------------------------------------- costs (vectorised)
def batch_size(scenario: Scenario) -> np.ndarray:
    """Sequences sharing every pass: ``workload.concurrency`` (at most ``workload.requests``)
    with continuous batching, else 1."""
    if scenario.schedule.batching == "continuous":
        wl = scenario.workload
        return np.minimum(np.asarray(wl.concurrency), np.asarray(wl.requests))
    return np.asarray(1)


def forward_message_bytes(
    scenario: Scenario, tokens_per_pass, nodes_if_tree, batch, hop=None
) -> np.ndarray:
    """One forward message for the batch: header + b (tokens (s_act + e_hop) + tree mask), e_hop
    the extra tensors hop ``hop`` carries (:func:`wansim.wire.extra_bytes_per_token`; hop None:
    none)."""
    payload = scenario.payload
    s_act = activation_bytes_per_token(
        scenario.model.hidden_size, payload.activation_bits, payload.quant_group_size
    )
    if hop is not None and payload.extra_tensors:
        s_act = s_act + extra_bytes_per_token(payload, hop, int(scenario.stages))
    mask = tree_mask_bytes(nodes_if_tree)
    return np.asarray(payload.header_bytes, dtype=float) + np.asarray(batch) * (
        np.asarray(tokens_per_pass) * s_act + mask
    )


def forward_message_bytes_hops(scenario: Scenario, tokens_per_pass, nodes_if_tree, batch):
    """Per forward hop (P - 1 of them) the message of :func:`forward_message_bytes`, when
    ``payload.extra_tensors`` makes hops differ; None when every hop carries the same bytes."""
    if not scenario.payload.extra_tensors:
        return None
    return tuple(
        forward_message_bytes(scenario, tokens_per_pass, nodes_if_tree, batch, hop)
        for hop in range(int(scenario.stages) - 1)
    )


def return_message_bytes(
    scenario: Scenario, nodes_if_tree, batch, tokens_per_pass=0, nodes=0
) -> np.ndarray:
    """The verdicts of the batch on the return hop (:func:`wansim.wire.verdict_bytes`): per
    sequence the ids of the ``tokens_per_pass`` verified positions, and with the drafter on
    the last stage the next drafts (a chain's ``nodes`` ids, or the tree)."""
    last = scenario.drafter.placement == "last_stage"
    chain_drafts = np.asarray(nodes) - np.asarray(nodes_if_tree)
    return np.asarray(batch) * verdict_bytes(
        scenario.payload,
        nodes_if_tree,
        last,
        tokens_per_pass,
        chain_drafts,
        scenario.stages if scenario.payload.extra_tensors else None,
    )


# ----------------------------------------------------------------------------- per point terms
def _columns(scenario: Scenario, m_tokens) -> list[np.ndarray]:
    spec = scenario.speculation
    acc = scenario.drafter.acceptance
    return [
        np.asarray(spec.k),
        np.asarray(spec.tree.budget_nodes),
        np.asarray(acc.domain_shift, dtype=float),
        np.asarray(-1.0 if acc.alpha is None else acc.alpha, dtype=float),
        np.asarray(m_tokens),
        np.asarray(scenario.payload.activation_bits),
    ]


def point_scenario(scenario: Scenario, k, budget, shift, alpha, bits=None) -> Scenario:
    """A scalar copy of ``scenario`` with one point's speculation, acceptance and activation
    width (``bits``: kept as is when None)."""
    acc = dataclasses.replace(
        scenario.drafter.acceptance,
        domain_shift=float(shift),
        alpha=None if alpha < 0 else float(alpha),
    )
    spec = scenario.speculation
    spec = dataclasses.replace(
        spec, k=int(k), tree=dataclasses.replace(spec.tree, budget_nodes=int(budget))
    )
    payload = scenario.payload
    if bits is not None:
        payload = dataclasses.replace(payload, activation_bits=int(bits))
    return dataclasses.replace(
        scenario,
        speculation=spec,
        drafter=dataclasses.replace(scenario.drafter, acceptance=acc),
        payload=payload,
    )


def policy_terms(scenario: Scenario, m_tokens) -> dict[str, np.ndarray]:
    """Per point (fields may be arrays): the policy's shape and its acceptance terms.

    tokens (per sequence per pass), nodes, depth, tree_nodes (N for trees, else 0),
    passes (expected verify passes for M tokens, step-weighted over difficulty), tau = M /
    passes, rate_factor = E_w[M / E[N_Z] (1 + Var N_Z / E[N_Z]^2)] and lap_noise_factor =
    E_w[M / E[N_Z]^2] (the delta expansion of the rate: :mod:`wansim.analytical.sync`).
    Evaluated once per distinct (k, budget, domain_shift, alpha, M) and mapped back; the
    per-node values stay per distinct row: node_row (per point: its row) indexes the (rows, Q)
    tables node_weights w, node_passes E[N_Z] and node_passes_var Var N_Z (Q nodes, padded
    with zero weights).
    """
    cols = _columns(scenario, m_tokens)
    shape = np.broadcast_shapes(*(c.shape for c in cols))
    rows, inverse = distinct_rows(cols, shape)
    names = (
        "tokens",
        "nodes",
        "depth",
        "tree_nodes",
        "passes",
        "rate_factor",
        "lap_noise_factor",
        "rate_factor_delta",
    )
    out = {n: np.empty(len(rows)) for n in names}
    per_node: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pols, nodes = [], []
    for k, budget, shift, alpha, _m, bits in rows:
        pol = policy(point_scenario(scenario, k, budget, shift, alpha, bits))
        w, surv = pol.difficulty_nodes()
        pols.append(pol)
        nodes.append((w, commit_survival(scenario, surv)))
    # every row's pass-count recurrences at once (the same values as one row at a time)
    chains = [i for i, (_, surv) in enumerate(nodes) if surv.shape[1]]
    moments = closed_form.passes_moments_many(
        [nodes[i][1] for i in chains], [rows[i][4] for i in chains]
    )
    moments_of = dict(zip(chains, moments, strict=True))
    for i, (_k, _budget, _shift, _alpha, m, _bits) in enumerate(rows):
        pol = pols[i]
        w, surv = nodes[i]
        depth = surv.shape[1]
        if depth:
            n_mean, n_var = moments_of[i]
        else:
            n_mean, n_var = np.full(len(w), float(m)), np.zeros(len(w))
        out["tokens"][i] = pol.tokens_per_pass()
        out["nodes"][i] = pol.nodes
        out["depth"][i] = pol.depth
        out["tree_nodes"][i] = pol.nodes if pol.kind == "tree" else 0
        out["passes"][i] = w @ n_mean
        out["rate_factor_delta"][i] = w @ (m / n_mean * (1.0 + n_var / n_mean**2))
        exact = closed_form.inverse_pass_moments(surv, m) if depth else None
        if exact is not None:  # short outputs: E[M / N] exactly
            out["rate_factor"][i] = w @ (m * exact[0])
            out["lap_noise_factor"][i] = w @ (m * exact[1])
        else:
            out["rate_factor"][i] = w @ (m / n_mean * (1.0 + n_var / n_mean**2))
            out["lap_noise_factor"][i] = w @ (m / n_mean**2)
        per_node.append((w, n_mean, n_var))
    res = {n: v[inverse].reshape(shape) for n, v in out.items()}
    res["node_row"] = np.asarray(inverse).reshape(shape)
    q = max(len(w) for w, _, _ in per_node)
    for j, name in enumerate(("node_weights", "node_passes", "node_passes_var")):
        pad = 0.0 if j != 1 else 1.0  # padded nodes: weight 0, one pass (finite rates)
        table = np.full((len(rows), q), pad)
        for i, node in enumerate(per_node):
            table[i, : len(node[j])] = node[j]
        res[name] = table
    res["tau"] = np.asarray(m_tokens) / res["passes"]
    return res


def commit_survival(scenario: Scenario, survival: np.ndarray) -> np.ndarray:
    """P(committed - 1 >= d), d = 1.., per pass under the schedule's commit rule (both engines:
    the DES verifier draws from it, the closed forms count passes with it).

    Every schedule but one commits A + 1 for A accepted drafts (the bonus or correction
    token): the acceptance's own S_1..S_D. ``schedule.async_protocol:
    flush_on_full_acceptance`` commits a block's K drafts when all K are accepted (no bonus
    token), else the target's one token at the divergence: committed - 1 is K - 1 with
    probability S_K, else 0, i.e. the survival (S_K, ..., S_K) of depth K - 1."""
    if scenario.schedule.async_protocol != FLUSH_ON_FULL_ACCEPTANCE:
        return survival
    s = np.asarray(survival, dtype=float)
    return np.repeat(s[..., -1:], max(s.shape[-1] - 1, 0), axis=-1)


def drafter_ms(scenario: Scenario, terms: dict, batch) -> np.ndarray:
    """Drafter time per lap for the batch (0 without speculation)."""
    return drafter_tree_ms(scenario.drafter, terms["depth"], terms["nodes"], batch)


def target_exact(scenario: Scenario):
    """Whether the output is the trained target's: not with typical acceptance (a lossy rule),
    not with activations below 16 bits on the wire (a lossy codec perturbs the target; see
    :mod:`wansim.acceptance.activation_quality`). ``payload.activation_bits`` may be an array
    (the analytical grid): the answer is then an array of the same shape."""
    rule = scenario.speculation.policy == "none" or scenario.speculation.verifier != "typical"
    bits = np.asarray(scenario.payload.activation_bits)
    acc = scenario.drafter.acceptance
    exact = np.vectorize(lambda b: quality_for(acc, int(b)).target_exact, otypes=[bool])(bits)
    out = np.logical_and(rule, exact)
    return bool(out) if out.ndim == 0 else out


def distinct_rows(columns: list[np.ndarray], shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of broadcast columns and each point's row index."""
    size = int(np.prod(shape))
    if all(col.ndim == 0 for col in columns):
        return np.array([[col.item() for col in columns]]), np.zeros(size, dtype=np.int64)
    code = np.zeros(size, dtype=np.int64)
    for col in columns:
        if col.ndim == 0:
            continue
        _, inv = np.unique(np.broadcast_to(col, shape).ravel(), return_inverse=True)
        code = code * (inv.max() + 1) + inv
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rows = np.empty((len(first), len(columns)))
    for j, col in enumerate(columns):
        rows[:, j] = col.item() if col.ndim == 0 else np.broadcast_to(col, shape).ravel()[first]
    return rows, inverse

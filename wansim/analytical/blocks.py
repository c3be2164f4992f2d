"""Approximations for the block schedule: async in-pipe speculation and the overlapped drafter
(the max(.) law), one request at a time. The DES protocol is in :mod:`wansim.sim.async_speculation`.

Model (vectorised over grid points and the difficulty quadrature):

- A *chain* starts when drafting can restart from a committed token, with the drafter (and S0)
  free. Its blocks k = 0, 1, ... are issued as if every bet wins (S0 cannot know otherwise):

    no overlap (S0 drafts and computes):  start_k = max(E_{k-1}, V_{k-B}),  E_k = start_k + d_k + c0
    overlap (drafter device, one ahead): drafting of k starts when k-1 is released,
        D_k = rel_{k-1} + d_k,  rel_k = max(D_k, V_{k-B}),  start_k = max(rel_k, E_{k-1}),
        E_k = start_k + c0
    V_k = E_k + R   (the verdict of block k reaches the drafter)

  with d_k the drafter's time for block k (d for the chain's first block, drafted from a verified
  token; d' for the blocks drafted on a bet, one more pass for the guess:
  :func:`wansim.speculation.block_schedule.bet_draft_ms`; without overlap and B = 1 no block is
  drafted on a bet), c0 S0's compute, B the window (``max_inflight_blocks``; 1 for
  sync), and R the rest of the lap: sum_{i >= 1} t_stage_i + the forward hops + the return hop
  (first_stage); a last_stage drafter releases blocks at the last stage (c0 = 0, R = the whole
  lap without drafting). R is taken at its mean inside the recursion (an assumption: with a
  small window the issue times depend on earlier verdicts' jitter).
- The bet on a block wins with r_Z = S_K(Z) p_{K+1}(Z) (all K drafts and the guess at position
  K + 1 accepted; p_{K+1} holds the last measured rate beyond the profile), independently per
  block; a chain of G valid blocks ends at its first lost bet: P(G = g + 1) = r^g (1 - r),
  truncated at the blocks a request needs at full acceptance (ceil(M / (K + 1))).
- A chain that fails at block g restarts at T_g = max(V_g, the drafter's draft in progress at
  V_g, S0's block in progress at V_g) (no work in progress is aborted); blocks that S0 started
  before V_g are wasted at S0, those it finished before V_g were forwarded and are wasted at
  S1..S(P-2) (the last stage drops them; with one request nobody queues, so a cancellation
  message never catches one). The verdict's jitter is integrated over (normal, 5 nodes) for V_g
  only.
- S0 never issues a block the request could not need (its room rule), so a chain that starts
  h blocks (at full acceptance) from the request's end is cut at h. The first chain starts at
  the request's horizon H = ceil(M / (K + 1)); the later ones (one per lost bet) are taken as
  spread evenly over the request's tokens. Per difficulty node, with N the request's verify
  passes (the same as sync: the schedule is lossless) and X a chain's time or stale blocks:
  X per request = E[X | H] + (E[N] - E[G | H]) mean_h(E[X | h] / E[G | h]) (Wald: a chain
  commits tau E[G] tokens). The decode time T is that for X = C; tokens_per_s =
  E_w[M / E[T]] (1 + Var T / E[T]^2) with Var T = c^2 Var N + (E[N] / E[G]) Var(C - c G) +
  Var R (chains + the blocks that waited for a verdict, each with the probability its
  verdict came after S0 was ready: Phi((E[V] - ready) / sd R)), c = E[T] / E[N].

- Retransmissions: the recursion runs on the lossless hops; a request's K lost transmissions
  (over its passes and forwarded stale blocks) come back as stalls of the whole window, each
  costing (1 - r) c + r max(0, c - slack), c = ser + RTO, slack = B issue - block lap, less
  the losses repaired inside another stall of the full window (:func:`loss_stalls`);
  tokens/s conditions on K (:func:`wansim.analytical.rate.mean_rate`).

Exact in the limits: B = 1 without overlap is the sync lap; with every bet won (r = 1) and no
jitter the issue times are the DES's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim import speculation
from wansim.acceptance import closed_form
from wansim.acceptance.bet import bet_win_probability, guess_acceptance
from wansim.analytical.rate import mean_rate
from wansim.analytical.sync import lap_breakdown
from wansim.config.scenario import Scenario
from wansim.numerics import normal_functions as nf
from wansim.speculation.block_schedule import flushes
from wansim.stages.compute import mean_stage_ms, stage_ms_each, stages_differ

MAX_CHAIN = 256  # blocks per chain considered (a chain longer than a request is cut there)
JITTER_NODES = 5
ABSORBED = 0.3  # share of the window's other crossings whose losses overlap a stall (loss_stalls)


@dataclasses.dataclass
class Schedule:
    """Per point (rows) and chain position g (columns), for each verdict-jitter node q: when
    the loss on block g is heard, and the last blocks S0 started / finished and the drafter
    started before that (uncapped); plus the issue times."""

    heard: np.ndarray  # (Q, pts, cols) V_g
    started: np.ndarray  # (Q, pts, cols) last k with start_k < when S0 hears of the loss
    finished: np.ndarray  # (Q, pts, cols) last k with E_k < V_g (forwarded)
    drafted: np.ndarray | None  # (Q, pts, cols) last k whose drafting began before V_g
    end: np.ndarray  # (pts, ks) E_k
    gated: np.ndarray  # (pts, ks) P(block k waited for a verdict: the window was full)
    draft_end: np.ndarray | None  # (pts, ks) D_k
    weights: np.ndarray  # (Q,) jitter-node weights
    window: np.ndarray  # (pts,)
    d: np.ndarray  # (pts, ks) the drafter's time for block k
    overlap: bool

    def restart(self, h: int) -> dict[str, np.ndarray]:
        """For chains whose request needs at most h more blocks (S0 issues no block >= h):
        (pts, h) arrays of the restart time C_g and the stale counts, g = 0..h-1."""
        g = np.arange(h)
        cap = np.minimum(g[None, :] + self.window[:, None] - 1, h - 1)  # (pts, h)
        rows = np.arange(self.end.shape[0])[:, None]
        out = {
            n: np.zeros((self.end.shape[0], h)) for n in ("cycle", "s0", "fwd", "draft", "cancel")
        }
        # blocks of the chain whose issue waited for an earlier verdict: each carries that
        # verdict's jitter into the chain's time
        out["gated"] = np.cumsum(self.gated[:, :h], axis=1)
        # every verdict-jitter node at once (a leading axis), then summed node by node
        heard = self.heard[:, :, :h]
        # block g itself started before its loss was heard; a verdict clipped to arrive the
        # instant g ends (zero delay) finds no block "before" it: clamp to g (its end is <= the
        # verdict), never -1 (which would read the schedule's last column)
        j = np.clip(self.started[:, :, :h], g, cap)
        jf = np.minimum(self.finished[:, :, :h], j)
        cycle = np.maximum(heard, self.end[rows, j] - (self.d[rows, j] if self.overlap else 0.0))
        per_node = {}
        if self.drafted is not None:
            m = np.minimum(self.drafted[:, :, :h], np.minimum(cap + 1, h - 1))
            cycle = np.maximum(cycle, np.where(m > g, self.draft_end[rows, m], -np.inf))
            per_node["draft"] = np.maximum(m - g, 0)
        per_node["cycle"] = cycle
        per_node["s0"] = np.maximum(j - g, 0)
        per_node["fwd"] = np.maximum(jf - g, 0)
        per_node["cancel"] = jf > g
        for q, wq in enumerate(self.weights):
            for name in ("draft", "cycle", "s0", "fwd", "cancel"):
                if name in per_node:
                    out[name] += wq * per_node[name][q]
        return out


def _waits(gate, ready, r_sd):
    """P(a block waits for the verdict that opens its window): the verdict's mean arrival
    ``gate`` (the block ``window`` places earlier's end + E[R]) is later than ``ready`` (when
    the block could go otherwise), with R normal of sd ``r_sd``: Phi((gate - ready) / r_sd);
    without jitter the comparison itself. (A 0/1 step here had made tokens/s jump by 2% as a
    faster link moved a verdict across a block's end by microseconds.)"""
    diff = gate - ready
    sd = np.asarray(r_sd, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = nf.norm_cdf(diff / np.where(sd > 0, sd, 1.0))
    return np.where(sd > 0, np.where(np.isfinite(diff), smooth, diff > 0), diff > 0)


def chain_schedule(
    d,
    c0,
    r_mean,
    r_sd,
    window,
    *,
    overlap,
    s0_is_last,
    columns,
    s0_wait=0.0,
    draft_wait=0.0,
    d_bet,
) -> Schedule:
    """The issue recursion (module docstring) for arrays d, c0, R, sd(R), B of one length
    (``d_bet``: the blocks drafted on a bet);
    ``s0_is_last`` (per point): one stage, S0 verifies and knows a lost bet at once;
    ``s0_wait``: each block waits that long in S0's queue before S0 starts it (a block still
    waiting when the loss is heard is dropped unstarted); ``draft_wait``: with the overlapped
    drafter, each draft waits that long in the drafter device's queue (a draft started after
    the loss is heard is drafted from the correction: not stale)."""
    d, c0, r_mean, r_sd = (np.asarray(x, dtype=float) for x in (d, c0, r_mean, r_sd))
    d_bet = np.asarray(d_bet, dtype=float)
    s0_wait = np.broadcast_to(np.asarray(s0_wait, dtype=float), d.shape)
    draft_wait = np.broadcast_to(np.asarray(draft_wait, dtype=float), d.shape)
    s0_is_last = np.asarray(s0_is_last, dtype=bool)[:, None]
    window = np.asarray(window, dtype=np.int64)
    pts = d.shape[0]
    rows = np.arange(pts)
    ks = columns + int(min(window.max(), columns)) + 2
    start = np.empty((pts, ks))
    end = np.empty((pts, ks))
    verdict = np.empty((pts, ks))
    draft_start = np.empty((pts, ks))
    draft_end = np.empty((pts, ks))
    gated = np.zeros((pts, ks))
    prev_end = np.zeros(pts)
    prev_rel = np.zeros(pts)
    # the drafter's time per block: a later block is drafted on a bet when it is made before
    # the verdict of the block before it (S0 makes it at max(E_{k-1}, V_{k-B}): always with
    # B >= 2, never with B = 1; the overlapped drafter when its draft starts)
    d0 = d
    dk_all = np.empty((pts, ks))
    dk_all[:, 0] = d0
    s0_bets = window >= 2
    for k in range(ks):
        back = k - window
        gate = np.where(back >= 0, verdict[rows, np.maximum(back, 0)], -np.inf)
        if overlap:
            a = (prev_rel if k else np.zeros(pts)) + draft_wait
            if k:
                dk_all[:, k] = np.where(a < verdict[:, k - 1], d_bet, d0)
            d = dk_all[:, k]
            dk = a + d
            rel = np.maximum(dk, gate)
            st = np.maximum(rel, prev_end) + s0_wait
            draft_start[:, k], draft_end[:, k] = a, dk
            gated[:, k] = _waits(gate, np.maximum(dk, prev_end), r_sd)
            prev_rel = rel
        else:
            if k:
                dk_all[:, k] = np.where(s0_bets, d_bet, d0)
            d = dk_all[:, k]
            st = np.maximum(prev_end, gate) + s0_wait
            gated[:, k] = _waits(gate, prev_end, r_sd)
        start[:, k] = st
        end[:, k] = st + (c0 if overlap else d + c0)
        prev_end = end[:, k]
        verdict[:, k] = end[:, k] + r_mean
    z, wz = np.polynomial.hermite_e.hermegauss(JITTER_NODES)
    wz = wz / wz.sum()

    def last_before(times: np.ndarray, when: np.ndarray) -> np.ndarray:
        """Per row: the last column k with times[k] < when (row-wise searchsorted over rows
        laid end to end, each shifted by the span of all times). A block started the instant
        a verdict arrives (it waited for that verdict) was started after it: ties within
        1e-9 of the span count as not before, so rounding never decides (the stale counts of
        a window of 2 on a ring without jitter had flipped with the bandwidth: tokens/s
        -0.7% for 10x the bandwidth at 4% loss)."""
        lo = min(float(times.min()), float(when.min()))
        span = max(float(times.max()), float(when.max())) - lo + 1.0
        offsets = (rows * span - lo)[:, None]
        tie = 1e-9 * span
        idx = np.searchsorted(
            (times + offsets).ravel(), (when + offsets - tie).ravel(), side="left"
        )
        return idx.reshape(when.shape) - 1 - rows[:, None] * ks

    heard_all, started, finished, drafted = [], [], [], []
    for zq in z:
        heard = end[:, :columns] + np.maximum(r_mean + zq * r_sd, 0.0)[:, None]  # V_g
        stop = np.where(s0_is_last, end[:, :columns], heard)  # when S0 knows of the loss
        heard_all.append(heard)
        started.append(last_before(start, stop))
        finished.append(last_before(end, heard))
        if overlap:
            drafted.append(last_before(draft_start, heard))
    return Schedule(
        heard=np.array(heard_all),
        started=np.array(started),
        finished=np.array(finished),
        drafted=np.array(drafted) if overlap else None,
        end=end,
        gated=gated,
        draft_end=draft_end if overlap else None,
        weights=wz,
        window=window,
        d=dk_all,
        overlap=overlap,
    )


class ChainLengths:
    """P(a chain of at most h blocks fails at block g), g = 0..h-1: r^g (1 - r), the rest at
    g = h - 1 (the request's end); ``self(h)`` for every horizon h <= ``width`` from one table
    of r^g (1 - r) (each horizon's columns are the same values, computed once)."""

    def __init__(self, r: np.ndarray, width: int):
        self.r = np.asarray(r, dtype=float)
        self.fail = self.r[..., None] ** np.arange(width) * (1.0 - self.r[..., None])

    def __call__(self, h: int) -> np.ndarray:
        p = self.fail[..., :h].copy()
        p[..., -1] = self.r ** (h - 1)
        return p


def acceptance_nodes(scenario: Scenario, m_tokens) -> dict[str, np.ndarray]:
    """Per point: the difficulty nodes' weights, E[N_Z], Var N_Z, tau_Z and the bet's r_Z
    (points, Q) - Q the largest quadrature among the distinct rows (padded with weight 0)."""
    cols = speculation.point_columns(scenario, m_tokens)
    shape = np.broadcast_shapes(*(c.shape for c in cols))
    rows, inverse = speculation.distinct_rows(cols, shape)
    found = []
    for k, budget, shift, alpha, m, bits in rows:
        pol = speculation.policy(
            speculation.point_scenario(scenario, k, budget, shift, alpha, bits)
        )
        w, surv = pol.difficulty_nodes()
        depth = surv.shape[1]
        if depth:
            commit = speculation.commit_survival(scenario, surv)
            n_mean, n_var = closed_form.passes_moments(commit, m)
            _, rates = guess_acceptance(pol.acceptance).nodes(depth + 1)
            r = bet_win_probability(surv[:, -1], rates[:, depth, 0], flushes(scenario))
        else:
            n_mean, n_var, r = np.full(len(w), float(m)), np.zeros(len(w)), np.zeros(len(w))
        found.append((w, n_mean, n_var, r, float(m) / n_mean))
    q = max(len(f[0]) for f in found)
    out = {n: np.zeros((len(rows), q)) for n in ("w", "n_mean", "n_var", "r", "tau")}
    out["n_mean"][:] = 1.0
    for i, (w, n_mean, n_var, r, tau) in enumerate(found):
        out["w"][i, : len(w)] = w
        out["n_mean"][i, : len(w)] = n_mean
        out["n_var"][i, : len(w)] = n_var
        out["r"][i, : len(w)] = r
        out["tau"][i, : len(w)] = tau
    return {n: v[inverse].reshape((*shape, q)) for n, v in out.items()}


def issue_ms(draft_ms, s0_compute_ms, overlap: bool):
    """The interval S0 issues a chain's blocks at alone: drafting then computing (S0 drafts),
    or the slower of the two (the overlapped drafter drafts the next block meanwhile)."""
    if overlap:
        return np.maximum(s0_compute_ms, draft_ms)
    return np.asarray(draft_ms) + s0_compute_ms


def block_metrics(
    scenario: Scenario, parts: dict, hop: dict, s0_wait=0.0, draft_wait=0.0, verdict_wait=0.0
) -> dict[str, np.ndarray]:
    """Mean metrics of the block schedule for one request at a time (module docstring).

    ``parts``: :func:`wansim.analytical.sync.lap_parts`; ``hop``: the forward/return hop sums
    (``fwd``, ``ret``, ``var``, ``wire``) of :func:`wansim.analytical.sync._hop_sums`.
    ``s0_wait``: queueing per block at S0 behind other requests (the concurrent model's fixed
    point): it spaces a request's blocks further apart and so shrinks its stale blocks;
    ``draft_wait`` likewise at the overlapped drafter's device (its stale drafts);
    ``verdict_wait``: queueing on a block's way from S0 to its verdict back at S0 (the other
    stations' and links' waits under load): S0 hears a lost bet that much later."""
    stages = np.asarray(scenario.stages)
    m = np.asarray(parts["m"], dtype=float)
    n = np.asarray(parts["tokens"], dtype=float)
    d = np.asarray(parts["draft_ms"], dtype=float)
    d_bet = np.asarray(parts["bet_draft_ms"], dtype=float)
    mean_stage = np.asarray(parts["stage_ms"], dtype=float)
    b = parts["batch"]  # S0's own pass (its stage may differ): the batch's, as stage_ms
    c_first = np.asarray(
        stage_ms_each(scenario, b * n, sequences=b)[0] if stages_differ(scenario) else mean_stage
    )
    first_stage = scenario.drafter.placement == "first_stage"
    overlap = bool(scenario.drafter.overlap)
    window = np.asarray(
        scenario.schedule.max_inflight_blocks if scenario.schedule.kind == "async" else 1
    )
    fwd, ret, var = hop["fwd"], hop["ret"], hop["var"]
    if first_stage:
        c0 = c_first
        rest = stages * mean_stage - c_first + fwd + ret
    else:  # last_stage (sync + overlap): blocks are released at the last stage
        c0 = np.zeros_like(mean_stage)
        rest = stages * mean_stage + fwd + ret
    # Retransmissions leave the recursion (it runs on the lossless hops) and return as stalls
    # (:func:`loss_stalls`): in-order links hold every block behind a lost message, so one
    # loss stalls the whole window once instead of adding its mean to every verdict
    from wansim.analytical.sync import _loss_sums, forward_sizes

    loss = _loss_sums(scenario, forward_sizes(parts), parts["return_bytes"])
    rest = rest - loss["delay_mean_ms"] + np.asarray(verdict_wait, dtype=float)
    var = np.maximum(var - loss["delay_var_ms2"], 0.0)
    # a chain's blocks in steady state are drafted on a bet (d_bet; the first one costs d)
    steady = np.where((window >= 2) | overlap, d_bet, d)
    issue = issue_ms(steady, c0, overlap)
    block_lap = rest + c0 + (0.0 if overlap else steady)
    slack = np.maximum(window * issue - block_lap, 0.0)
    acc = acceptance_nodes(scenario, m)
    shape = np.broadcast_shapes(
        *(np.shape(x) for x in (d, d_bet, c0, rest, var, window, m, n, stages)),
        acc["w"].shape[:-1],
    )
    lost = (loss[k] for k in ("count_mean", "count_var", "delay_mean_ms", "delay_var_ms2"))
    lost = tuple(lost)
    shape = np.broadcast_shapes(
        shape,
        np.shape(s0_wait),
        np.shape(draft_wait),
        np.shape(slack),
        *map(np.shape, lost),
    )
    flat = [
        np.broadcast_to(x, shape).ravel()
        for x in (d, d_bet, c0, rest, var, window, m, n, stages, s0_wait, draft_wait, slack)
    ]
    d_, dbet_, c0_, rest_, var_, window_, m_, n_, p_, wait_, dwait_, slack_ = flat
    g_, g_var_, delay_, delay_var_ = (np.broadcast_to(x, shape).ravel() for x in lost)
    nodes = {
        k: np.broadcast_to(v, (*shape, v.shape[-1])).reshape(-1, v.shape[-1])
        for k, v in acc.items()
    }
    # blocks a request needs at full acceptance: the horizon of its first chain
    reach = np.minimum(np.ceil(m_ / n_).astype(np.int64), MAX_CHAIN)
    width = int(reach.max())
    sched = chain_schedule(
        d_,
        c0_,
        rest_,
        np.sqrt(var_),
        window_,
        overlap=overlap,
        s0_is_last=(p_ == 1) & first_stage,
        columns=width,
        s0_wait=wait_,
        draft_wait=dwait_,
        d_bet=dbet_,
    )
    steady_ = sched.d[:, -1]  # a later block's drafting as the recursion found it (waits too)
    # A chain that starts h blocks (at full acceptance) from the request's end issues no block
    # beyond it (S0's room rule). The request's first chain starts at its horizon H; the later
    # ones (one per lost bet) are spread evenly over the request's tokens, so they contribute
    # the mean over h of E[X | h] / E[G | h] per valid pass. Per request:
    #   X_total = E[X | H] + (E[N] - E[G | H]) mean_h(E[X | h] / E[G | h])
    keys = ("cycle", "s0", "fwd", "draft", "cancel", "gated")
    r_nodes = nodes["r"]
    w, n_mean, n_var = nodes["w"], nodes["n_mean"], nodes["n_var"]
    later = {k: np.zeros(r_nodes.shape) for k in keys}
    later_chains = np.zeros(r_nodes.shape)  # sum over h of 1 / E[G | h]
    first = {k: np.zeros(r_nodes.shape) for k in keys}
    first_g = np.ones(r_nodes.shape)
    var_cycle = np.zeros(r_nodes.shape)
    atoms = None
    chain_lengths = ChainLengths(r_nodes, width)
    for h in range(1, width + 1):
        live = (reach >= h)[:, None]
        at = (reach == h)[:, None]
        rs = sched.restart(h)
        prob = chain_lengths(h)  # (pts, Q, h)
        blocks = np.arange(1, h + 1)
        e_g = prob @ blocks
        for k in keys:
            e = np.einsum("pqg,pg->pq", prob, rs[k])
            later[k] += live * e / e_g
            first[k] = np.where(at, e, first[k])
        first_g = np.where(at, e_g, first_g)
        later_chains += live / e_g
        if at.any():  # the spread of chain times, at the first chain's horizon
            mean_c = first["cycle"] / e_g
            dev = rs["cycle"][:, None, :] - mean_c[..., None] * blocks
            var_cycle = np.where(at, np.einsum("pqg,pqg->pq", prob, dev**2), var_cycle)
            if len(reach) == 1:  # one scenario: the laps' atoms (for percentiles)
                atoms = _lap_atoms(sched, rs["cycle"][0], prob[0], e_g[0], w[0] * n_mean[0], h)
    n_later = np.maximum(n_mean - first_g, 0.0)
    total = {k: first[k] + n_later * later[k] / reach[:, None] for k in keys}
    per_pass = total["cycle"] / n_mean
    stale_s0, stale_fwd = total["s0"] / n_mean, total["fwd"] / n_mean
    stale_draft, cancels = total["draft"] / n_mean, total["cancel"] / n_mean
    chains = 1.0 + n_later * later_chains / reach[:, None]  # per request
    t_mean = n_mean * per_pass
    jitter = var_[:, None] * (chains + total["gated"])  # the verdicts on the critical path
    t_var = per_pass**2 * n_var + chains * var_cycle + jitter
    stall = loss_stalls(
        r_nodes, n_mean, n_var, total["fwd"], g_, g_var_, delay_, delay_var_, slack_, window_
    )
    rate = 1e3 * mean_rate(
        m_[:, None], t_mean, t_var, stall["k_mean"], stall["k_var"], stall["jump"], stall["v"]
    )
    added = stall["k_mean"] * stall["jump"]
    if atoms is not None:  # the laps carry the stalls' mean (their spread is in lap_ms_var)
        atoms = (atoms[0] + (w * added).sum() / (w * n_mean).sum(), atoms[1])
    t_mean = t_mean + added
    t_var = t_var + stall["jump"] ** 2 * stall["k_var"] + stall["v"] * stall["k_mean"]
    per_pass = t_mean / n_mean
    out = {
        "tokens_per_s": (w * rate).sum(axis=1),
        "decode_ms": (w * t_mean).sum(axis=1),
        "passes": (w * n_mean).sum(axis=1),
        # drafting per valid pass (each chain's first block from a verified token, the rest on
        # a bet) and per stale block (on a bet)
        "draft_per_pass_ms": d_
        + (steady_ - d_) * (w * (n_mean - chains)).sum(axis=1) / (w * n_mean).sum(axis=1),
        "stale_draft_ms": steady_,
        "lap_ms_mean": (w * t_mean).sum(axis=1) / (w * n_mean).sum(axis=1),
        # per request (step-weighted by passes)
        "stale_s0_per_request": (w * n_mean * stale_s0).sum(axis=1),
        "stale_fwd_per_request": (w * n_mean * stale_fwd).sum(axis=1),
        "stale_draft_per_request": (w * n_mean * stale_draft).sum(axis=1),
        "cancels_per_request": (w * n_mean * cancels).sum(axis=1),
        "losses_per_request": (w * n_mean * (1.0 - nodes["r"])).sum(axis=1),
        "bet_win_rate": (w * n_mean * nodes["r"]).sum(axis=1) / (w * n_mean).sum(axis=1),
        "per_pass_ms": per_pass,
        "weights": w,
        "decode_node_ms": t_mean,
        "decode_node_var": t_var,
        "lap_atoms": atoms,
    }
    return {
        k: (v.reshape(shape) if isinstance(v, np.ndarray) and v.ndim == 1 else v)
        for k, v in out.items()
    }


def loss_stalls(r, n_mean, n_var, stale_fwd, g, g_var, delay, delay_var, slack, window) -> dict:
    """The retransmissions of a request under the block schedule (per point, per difficulty
    node): K lost transmissions of mean cost ``jump`` (spread ``v``) on top of the lossless
    decode time.

    A request sends one message per hop for each verify pass and for each forwarded stale block
    (``stale_fwd``): K has mean (E[N] + stale) g and variance (E[N] + stale) Var G + Var N g^2,
    with g, Var G the lost transmissions of one lap (all hops). A lost transmission delays its
    message by c = ser + RTO, and the link delivers in order, so every block behind it is held
    until it arrives: the window stalls once, not per held block. S0 feels it when the lost
    block's verdict was due to open the window: it had ``slack`` = B issue - lap (the lossless
    block lap) to spare, so the stall costs max(0, c - slack). A bet lost on the held block
    (probability 1 - r) restarts the chain at its verdict: that costs the whole c. So

        jump = (1 - r) c + r max(0, c - slack),

    exact for the sync lap (B = 1: no slack) and for a window that never fills (slack >= c
    and every bet won: the verdicts come late, nothing waits for them).

    Stalls overlap: while one loss holds the ring, S0 fills its window (a stall is the window
    full), and a loss among the other ``window - 1`` blocks' crossings (x = ABSORBED g (B - 1)
    of them expected) is repaired inside the same stall, but one that falls late extends it:
    each loss costs jump / sqrt(1 + 2 x) (between the dead-time 1 / (1 + x), where an absorbed
    loss costs nothing, and no overlap; the same first order in x). The count depends on the
    window, not on the lossless lap, so a faster ring never absorbs less (the blocks in flight
    of the lossless lap had made lower latency cost up to 7% of tokens/s, more loss stalls
    per loss). ABSORBED = 0.3: fitted on 17 single-request lossy async points against the DES
    (tests/engines/test_async_loss_stalls.py names them): 1-4% loss, windows 3-17, 4-10
    stages, overlap or not (the median |error| 6%, the worst -31% and +26% against +62%
    before, at 4% loss and near-certain acceptance)."""
    g = np.asarray(g, dtype=float)[:, None]
    c = np.where(g > 0, np.asarray(delay)[:, None] / np.maximum(g, 1e-300), 0.0)
    v = np.where(
        g > 0,
        np.maximum((np.asarray(delay_var)[:, None] - np.asarray(g_var)[:, None] * c**2), 0.0)
        / np.maximum(g, 1e-300),
        0.0,
    )
    others = np.maximum(np.asarray(window, dtype=float)[:, None] - 1.0, 0.0)
    share = 1.0 / np.sqrt(1.0 + 2.0 * ABSORBED * g * others)
    sent = n_mean + stale_fwd
    jump = (1.0 - r) * c + r * np.maximum(c - np.asarray(slack)[:, None], 0.0)
    return {
        "k_mean": sent * g,
        "k_var": sent * np.asarray(g_var)[:, None] + n_var * g**2,
        "jump": jump * share,
        "v": v * share**2,
    }


def _lap_atoms(sched: Schedule, cycle, prob, e_g, node_passes, width):
    """Verify-to-verify laps of one scenario's chains (longest horizon, mean verdict jitter):
    within a chain the verdicts' spacing V_k - V_{k-1}; after a lost bet on block g the
    restart's first verdict comes C_g + V_0 - V_g after it. Weight: laps per request."""
    v = sched.end[0, :width]  # V_k - R: differences are the verdicts' spacing
    spacing = np.diff(v)
    values, weights = [], []
    chains = node_passes / e_g  # chains per request, per node
    for g in range(width):
        pg = (chains * prob[:, g]).sum()
        if pg <= 0:
            continue
        values.extend(spacing[:g].tolist())
        weights.extend([pg] * g)
        values.append(float(cycle[g] + v[0] - v[g]))
        weights.append(pg)
    weights = np.asarray(weights)
    return np.asarray(values), weights / weights.sum()


@dataclasses.dataclass(frozen=True)
class ChainStats:
    """Per difficulty node (last axis) of the block schedule: the node weights and a
    request's decode time (mean, variance); for one scenario the laps' atoms (values,
    weights), else None."""

    weights: np.ndarray
    decode_node_ms: np.ndarray
    decode_node_var: np.ndarray
    lap_atoms: tuple[np.ndarray, np.ndarray] | None


@dataclasses.dataclass(frozen=True)
class BlockSchedule:
    """The block schedule for one request at a time: the mean metrics (the keys of
    :func:`wansim.analytical.sync.sync_metrics` plus the stale-block counts) and its chains."""

    means: dict[str, np.ndarray]
    chains: ChainStats


def block_schedule_metrics(
    scenario: Scenario, s0_wait=0.0, draft_wait=0.0, verdict_wait=0.0
) -> dict[str, np.ndarray]:
    """The keys of :func:`wansim.analytical.sync.sync_metrics` for the block schedule, one
    request at a time (arrays)."""
    return block_schedule(scenario, s0_wait, draft_wait, verdict_wait).means


def _forward_total(parts: dict, stages):
    """Bytes of one pass over all forward hops."""
    hops = parts.get("forward_bytes_hops")
    return (stages - 1) * parts["forward_bytes"] if hops is None else sum(hops)


def block_schedule(
    scenario: Scenario, s0_wait=0.0, draft_wait=0.0, verdict_wait=0.0
) -> BlockSchedule:
    """:func:`block_schedule_metrics` with the chains' statistics (for the percentiles)."""
    from wansim.analytical.sync import _hop_sums, forward_sizes, lap_parts, prefill_sizes

    wl = scenario.workload
    stages = np.asarray(scenario.stages)
    parts = lap_parts(scenario)
    m, n, passes = parts["m"], parts["tokens"], parts["passes"]
    fwd, ret, wire, lap_var = _hop_sums(scenario, forward_sizes(parts), parts["return_bytes"])
    res = block_metrics(
        scenario,
        parts,
        {"fwd": fwd, "ret": ret, "var": lap_var},
        s0_wait,
        draft_wait,
        verdict_wait,
    )
    stage = parts["stage_ms"]
    prompt = np.asarray(wl.prompt_tokens)
    stage_prefill = mean_stage_ms(scenario, prompt)
    pre_fwd, _, _, _ = _hop_sums(scenario, prefill_sizes(scenario, prompt), parts["return_bytes"])
    prefill = stages * stage_prefill + pre_fwd
    decode = res["decode_ms"]
    duration = prefill + decode
    overlap = bool(scenario.drafter.overlap)
    s0_stale = res["stale_s0_per_request"]
    fwd_stale = res["stale_fwd_per_request"]
    # stages that compute a forwarded stale block: S1..S(P-2) (cancel_on_divergence: the last
    # drops it) or S1..S(P-1) (flush_on_full_acceptance: computed wherever it arrives)
    mid = np.maximum(stages - (1 if flushes(scenario) else 2), 0)
    draft = res["draft_per_pass_ms"]
    busy_all = (
        stages * stage_prefill
        + passes * (stages * stage + (0.0 if overlap else draft))
        + s0_stale * (stage + (0.0 if overlap else res["stale_draft_ms"]))
        + fwd_stale * mid * stage
    )
    stale_tokens = n * (s0_stale + mid * fwd_stale)
    fwd_total = _forward_total(parts, stages)
    resend = wire / np.maximum(
        fwd_total + parts["return_bytes"], 1e-300
    )  # (1 + E[G]) on average over the hops
    extra_bytes = (
        fwd_stale * fwd_total
        + (0.0 if flushes(scenario) else 1.0)  # flush: no cancellation travels
        * res["cancels_per_request"]
        * mid
        * float(scenario.payload.cancel_bytes)
    ) * resend
    exact = speculation.target_exact(scenario)
    lap = res["lap_ms_mean"]
    chains = ChainStats(
        weights=res["weights"],
        decode_node_ms=res["decode_node_ms"],
        decode_node_var=res["decode_node_var"],
        lap_atoms=res["lap_atoms"],
    )
    means = {
        "tokens_per_s": res["tokens_per_s"],
        "throughput_tokens_per_s": 1e3 * (m + 1) / duration,
        "tau": parts["tau"],
        "lap_ms_mean": lap,
        "tpot_ms_mean": decode / m,
        "ttft_ms_mean": prefill,
        "bubble_fraction": 1.0 - busy_all / (stages * duration),
        "bytes_per_token": (passes * wire + extra_bytes) / m,
        "wasted_token_fraction": (stages * (passes * n - m) + stale_tokens)
        / (stages * passes * n + stale_tokens),
        "target_exact": np.full(np.shape(lap), exact),
        **lap_breakdown(lap, n, draft, stage, fwd, ret),
        "prefill_ms": prefill * np.ones_like(lap),
        "passes_per_request": passes * np.ones_like(lap),
        "lap_ms_var": lap_var * np.ones_like(lap),
        "stale_blocks_s0_per_request": s0_stale,
        "stale_blocks_forwarded_per_request": fwd_stale,
        "stale_drafts_per_request": res["stale_draft_per_request"],
        "stale_draft_ms": res["stale_draft_ms"],
        "bet_win_rate": res["bet_win_rate"],
        "decode_ms": decode,
    }
    return BlockSchedule(means=means, chains=chains)


def flattening_depth(depths, gains, fraction: float = 0.9) -> int:
    """Where a gain-versus-depth curve flattens: the smallest depth whose gain reaches
    ``fraction`` of the gain at the deepest pipeline on the curve (the depth wall)."""
    depths = np.asarray(depths)
    gains = np.asarray(gains, dtype=float)
    order = np.argsort(depths)
    depths, gains = depths[order], gains[order]
    target = fraction * gains[-1]
    return int(depths[np.argmax(gains >= target)])

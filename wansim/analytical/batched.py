"""Continuous batching in steady state (``schedule.batching: continuous``, sync, a closed loop
of b = ``workload.concurrency`` slots), vectorised.

Model and assumptions:

- **The batch.** The b sequences in flight verify together: one pass of b n tokens per stage
  and one message per hop, the lockstep lap of :mod:`wansim.analytical.sync` (``T_lock``).
  A replacement's sequence is taken to join the batch (in the DES its first passes travel as
  a small group of their own until it is absorbed: a queue merges what waits in it).
- **Admissions.** Each slot runs its requests back to back (N passes, step-weighted over
  difficulty, then the replacement's prefill); the slots start together (the cold prefill)
  and are independent in lap counts. The r-th completions of the slots form waves: a slot
  finishes its r-th request at lap t with P(C_r = t) (FFT convolutions,
  :func:`lap_exposure`), so where all requests take the same passes (no speculation,
  near-certain acceptance) they finish at the same verdict and their replacements' prefill
  convoys nobody; where they differ, the waves blur into the renewal rate 1 / E[N]. A lap
  of a sequence that continues at verdict t follows j ~ Binomial(b - 1, u(t)) others'
  admissions, u(t) the chance that a slot finishes there with a replacement to admit (the
  last wave's completions admit nobody); their prefill, one message of j * prompt tokens,
  enters S0 g ms ahead of the batch's next pass (g = the return hop, plus the drafter when
  it runs on the last stage). One request alone (b = 1) is the sync case.
- **Convoy.** On the path S0, hop 0, S1, ..., S(P-1) (services: compute of the pass, the
  message's serialisation; propagation is common to both messages, so it cancels) the
  prefill has services p_l and the batch d_l (S0's includes a first-stage drafter). Two
  messages through FIFO stations in tandem (max-plus): the batch's verdict is late by

      D(j) = max(0, max_l (C_l + d_l) - g),   C_l = sum_{i <= l} (p_i - d_i)

  (catching the prefill at station l, it then trails it). Jitter and the random phase of
  other small groups are ignored.
- **Lap and rate.** T_lap = T_lock + sum_j q_j D(j), q_j the share of laps that follow j
  others' admissions (a request's first lap follows its own prefill: none); a lap's
  distribution is the lockstep one shifted by D(j) with probability q_j; a request's
  tokens_per_s and TPOT are the lockstep ones scaled by T_lock / T_lap.
- **TTFT** (after the warm-up wave): a replacement's prefill holds its prompt and those of
  the j others admitted with it, and runs ahead of the batch, so it takes the pipe alone:
  TTFT = E[P t_stage((1 + j) prompt) + sum_fwd E[T_hop]((1 + j) prompt)], plus, with the
  drafter on the last stage, what is left there of its drafting of the sequences that continue
  from the admitting verdict when the prefill arrives (none continue if all were replaced;
  hunt seed 4430, a 60 ms drafter: TTFT -54% -> +3%). The slots start
  together, so completions come in waves that blur only slowly (the r-th wave spreads as
  sd(N) sqrt(r)): j ~ Binomial(b - 1, h_r) with the wave's bunched hazard h_r
  (:func:`wave_hazards`), averaged over the replacement waves.
- **Throughput** of R requests through b slots (R / b rounds each): the run starts with the
  whole batch's prefill (``T_cold``, b prompts at once), and the slowest slot ends it:

      makespan = T_cold + (R/b - 1) TTFT + (R/b) E[N] T_lap + X T_lap(1)

  (X: the slowest slot's passes beyond the mean, :func:`wansim.analytical.concurrent.
  slowest_excess`, exact for one round over the difficulty mixture, the skew kept for more);
  the slowest slot's extra passes run while the batch drains, so they are charged the lap of a
  batch of one sequence.
- **Utilisation** of a stage: its busy time over the makespan: the cold prefill, the R - b
  replacements' prefills (t((1 + j) prompt) / (1 + j) each) and R E[N] / b batch passes (plus
  the drafter's passes on its stage).
- **Not modelled**: the DES's replacements travel as groups of their own for a while; where
  the sequences drift apart and the batch would run faster split into groups pipelining
  through the ring (:func:`split_gain`), they do, and the lockstep lap is too long (the
  regime says ``validated: false`` there).

Everything else (tau, bytes per token, the wasted fraction) is the lockstep batch's.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wansim import speculation
from wansim.analytical.concurrent import slowest_excess
from wansim.analytical.path import hop_bytes, hop_service_ms, ring_sums, stage_services_ms
from wansim.analytical.slots import (
    MAX_WAVES,
    NEIGHBOUR_WAVES,
    TAIL_SD,
    lap_exposure,
    passes_pmf,
    renewal_exposure,
    tractable,
)
from wansim.analytical.sync import forward_sizes, prefill_sizes
from wansim.links.expected_delay import hop_mean
from wansim.stages.compute import (
    mean_stage_ms,
    stage_overheads_ms,
    stage_pass_ms,
    stage_sequence_costs_ms,
)
from wansim.stages.slowdown import mean_factors


def batched(scenario) -> bool:
    """Whether the scenario is continuous batching with more than one slot."""
    return scenario.schedule.batching == "continuous" and bool(
        np.any(np.asarray(scenario.workload.concurrency) > 1)
    )


def _path(scenario, n_tokens, n_bytes, pmax: int, live_stages, sequences=1) -> tuple[list, list]:
    """Services (list over S0, hop 0, ..., S(pmax-1)) of a pass of ``n_tokens`` over
    ``sequences`` sequences, and their live masks."""
    compute = stage_services_ms(scenario, n_tokens, pmax, sequences)
    services, live = [], []
    for i in range(pmax):
        services.append(compute[i])
        live.append(live_stages > i)
        if i < pmax - 1:
            services.append(hop_service_ms(scenario, i, hop_bytes(n_bytes, i)))
            live.append(live_stages > i + 1)  # hop i is forward when S(i+1) exists
    return services, live


def _at_last_stage(services: list, live_stages, extra_ms) -> list:
    """``services`` (:func:`_path`'s list) with ``extra_ms`` added at each point's last stage."""
    stages = np.asarray(live_stages)
    return [
        s + np.where(stages - 1 == i // 2, extra_ms, 0.0) if i % 2 == 0 else s
        for i, s in enumerate(services)
    ]


def _with_drafting(services: list, live_stages, draft_ms, first: bool) -> list:
    """``services`` with the drafter's pass on the stage it occupies: S0 (``first``, drafting
    before the pass) or each point's last stage (drafting after the verdicts)."""
    if not first:
        return _at_last_stage(services, live_stages, draft_ms)
    return [services[0] + draft_ms, *services[1:]]


def convoy_delay_ms(prefill_services, batch_services, live, gap_ms) -> np.ndarray:
    """D = max(0, max_j (C_j + d_j) - g), C_j = sum_{l<=j} (p_l - d_l) over the live stations
    (module docstring): the batch's delay behind a message that started ``gap_ms`` ahead."""
    lead = np.zeros(())
    worst = np.full((), -np.inf)
    for p, d, on in zip(prefill_services, batch_services, live, strict=True):
        lead = lead + np.where(on, p - d, 0.0)
        worst = np.maximum(worst, np.where(on, lead + d, -np.inf))
    return np.maximum(worst - gap_ms, 0.0)


def _forward_hops_ms(scenario, n_bytes) -> np.ndarray:
    """Sum of the forward hops' mean times for an ``n_bytes`` message."""
    return ring_sums(scenario, hop_mean, n_bytes, n_bytes)[0]


@dataclasses.dataclass(frozen=True)
class Admissions:
    """Replacements admitted at a verdict (:func:`admissions`)."""

    delay_ms: np.ndarray  # E[D(j)] per lap
    ttft_ms: np.ndarray  # a replacement's TTFT over the waves
    others: tuple  # (j, P(j), D(j)): a lap follows j others' admission; its probability, delay
    shared: tuple  # (j, P(j)): a replacement's prefill holds j others' prompts too


@dataclasses.dataclass(frozen=True)
class BatchedRun:
    """Continuous batching in steady state: the mean metrics and the admissions behind them."""

    means: dict[str, np.ndarray]
    admissions: Admissions


def admissions(scenario, lockstep: dict, parts: dict, waves: list, exposure=None) -> Admissions:
    """A lap's delay behind the replacements admitted ahead of it, and a replacement's TTFT.

    ``exposure`` (..., J): P(a lap follows j others' admission), :func:`convoy_exposure`;
    None for the TTFT alone. The TTFT is E[ttft(1 + j)] (a replacement's prefill holds 1 + j
    prompts) with j ~ Binomial(b - 1, h) over the ``waves`` ((weight, hazard) pairs,
    :func:`wave_hazards`)."""
    wl = scenario.workload
    stages = np.asarray(scenario.stages)
    pmax = int(np.max(stages))
    b = np.asarray(parts["batch"], dtype=float)
    prompt = np.asarray(wl.prompt_tokens, dtype=float)
    first = scenario.drafter.placement == "first_stage"
    draft = np.asarray(parts["draft_ms"], dtype=float)

    batch_services, live = _path(
        scenario, b * parts["tokens"], forward_sizes(parts), pmax, stages, b
    )
    batch_services = _with_drafting(batch_services, stages, draft, first)
    gap = np.asarray(lockstep["return_hop_ms"], dtype=float) + (0.0 if first else draft)

    def prefill(prompts):
        tokens = prompts * prompt
        n_bytes = prefill_sizes(scenario, tokens)
        return n_bytes, stages * mean_stage_ms(scenario, tokens, prompts) + _forward_hops_ms(
            scenario, n_bytes
        )

    def drafting_ahead(prompts, prefill_ms):
        """A last-stage drafter drafts the sequences that continue from the verdict that
        admitted the replacement (``draft`` ms): the prefill, there after its way through the
        stages before the last and the forward hops, waits for what is left of it (none
        continue when every sequence was replaced; hunt seed 4430, a 60 ms drafter: TTFT
        -54%); ``prefill_ms``: the prefill's way through the whole ring (:func:`prefill`)."""
        if first:
            return 0.0
        reach = prefill_ms - mean_stage_ms(scenario, prompts * prompt, prompts)
        return np.where(b - prompts > 0, np.maximum(draft - reach, 0.0), 0.0)

    lam = (b - 1.0) * max((np.max(h) for _, h in waves), default=0.0)
    j_ttft = int(np.max(np.minimum(b - 1.0, np.ceil(lam + TAIL_SD * np.sqrt(lam) + 10.0))))
    j_lap = -1 if exposure is None else np.shape(exposure)[-1] - 1
    delay = ttft = np.zeros(())
    others, shared = [], []
    from scipy import stats  # slow to import: only for continuous batching

    for j in range(max(j_ttft, j_lap) + 1):
        pj_wave = sum((w * stats.binom.pmf(j, b - 1.0, h) for w, h in waves), start=np.zeros(()))
        late = np.zeros(())
        if j and j <= j_lap:
            n_bytes, alone_ms = prefill(j)
            ahead, _ = _path(scenario, j * prompt, n_bytes, pmax, stages, j)
            if not first:  # there after the batch's drafting, then its own first drafts
                ahead = _at_last_stage(ahead, stages, drafting_ahead(j, alone_ms) + draft)
            late = convoy_delay_ms(ahead, batch_services, live, gap)
        if j <= j_lap:
            pj = exposure[..., j]
            delay = delay + pj * late
            others.append((j, pj, late))
        shared_ms = prefill(1 + j)[1]
        ttft = ttft + pj_wave * (shared_ms + drafting_ahead(1 + j, shared_ms))
        shared.append((j, pj_wave))
    return Admissions(delay_ms=delay, ttft_ms=ttft, others=tuple(others), shared=tuple(shared))


def convoy_exposure(acc, gap_laps, rounds, b) -> np.ndarray:
    """:func:`lap_exposure` per point (arrays broadcast over the points; the last axis of the
    result is j, padded with zeros)."""
    w, mu, var = (np.asarray(acc[k], dtype=float) for k in ("w", "n_mean", "n_var"))
    shape = np.broadcast_shapes(w.shape[:-1], np.shape(gap_laps), np.shape(rounds), np.shape(b))
    q = w.shape[-1]
    w, mu, var = (np.broadcast_to(x, (*shape, q)).reshape(-1, q) for x in (w, mu, var))
    gap, rnd, bb = (
        np.broadcast_to(np.asarray(x, dtype=float), shape).ravel() for x in (gap_laps, rounds, b)
    )
    rows = [
        lap_exposure(passes_pmf(w[i], mu[i], var[i]), gap[i], rnd[i], bb[i])
        if tractable(mu[i][w[i] > 0], var[i][w[i] > 0], gap[i])
        else renewal_exposure(float(w[i] @ mu[i]), rnd[i], bb[i])
        for i in range(len(gap))
    ]
    out = np.zeros((len(rows), max(len(r) for r in rows)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out.reshape(*shape, -1)


def wave_hazards(b, requests, mean_n, sd_n, period) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight, hazard) of each replacement wave r = 1 .. (R - b) / b (weights sum to 1).

    The b slots start together, so the r-th completions of all slots (slot sums of r requests'
    passes) form a wave, ~ Normal(r T, r sd(N)^2) in laps, T = ``period`` (E[N] plus the
    replacement's TTFT in laps). A replacement admitted in wave r sees the others' completions
    at its verdict at the density of waves r' near r there:
    lambda_r = sum_r' c phi((r - r') T; 0, (r + r') sd^2) (c = b - 1 for r' = r, else b), so
    early waves admit in bunches and later ones blur into the renewal rate 1 / T (taken once
    sd sqrt(2 r) >= T, and beyond ``MAX_WAVES``). h_r = lambda_r / (b - 1), at most 1."""
    b = np.asarray(b, dtype=float)
    waves = np.maximum(np.asarray(requests, dtype=float) - b, 0.0) / b
    total = np.ceil(np.asarray(requests, dtype=float) / b)  # completion waves in the run
    renewal = 1.0 / np.maximum(period, 1.0)
    out = []
    for r in range(1, min(int(np.ceil(np.max(waves))), MAX_WAVES) + 1):
        weight = np.clip(waves - (r - 1), 0.0, 1.0)
        lam = np.zeros(())
        for r2 in range(max(1, r - NEIGHBOUR_WAVES), r + NEIGHBOUR_WAVES + 1):
            var = np.maximum((r + r2) * np.asarray(sd_n, dtype=float) ** 2, 1e-12)
            density = np.exp(-(((r - r2) * period) ** 2) / (2 * var)) / np.sqrt(2 * np.pi * var)
            count = b - 1.0 if r2 == r else b
            lam = lam + np.where(r2 <= total, count * density, 0.0)
        blurred = np.asarray(sd_n) * np.sqrt(2.0 * r) >= period
        hazard = np.where(blurred, renewal, np.minimum(lam / np.maximum(b - 1.0, 1.0), 1.0))
        out.append((weight, hazard))
    rest = np.maximum(waves - MAX_WAVES, 0.0)
    if np.any(rest > 0):
        out.append((rest, renewal * np.ones_like(rest)))
    norm = np.maximum(waves, 1e-300)
    return [(w / norm, h) for w, h in out]


def _single_lap_ms(scenario) -> np.ndarray:
    """The lap of a batch of one sequence."""
    from wansim.analytical.sync import sync_metrics

    one = dataclasses.replace(scenario.workload, concurrency=1)
    return np.asarray(sync_metrics(dataclasses.replace(scenario, workload=one))["lap_ms_mean"])


def batched_metrics(scenario, lockstep: dict, parts: dict) -> dict:
    """``lockstep`` (:func:`wansim.analytical.sync.sync_metrics` with batch b) -> the same keys
    for continuous batching in steady state (module docstring)."""
    return batched_run(scenario, lockstep, parts).means


def batched_run(scenario, lockstep: dict, parts: dict) -> BatchedRun:
    """:func:`batched_metrics` with the admissions behind it."""
    from wansim.analytical.blocks import acceptance_nodes

    wl = scenario.workload
    b = np.asarray(parts["batch"], dtype=float)
    requests = np.asarray(wl.requests, dtype=float)
    m = np.asarray(parts["m"], dtype=float)
    acc = acceptance_nodes(scenario, m)
    mean_n = (acc["w"] * acc["n_mean"]).sum(axis=-1)
    var_n = (acc["w"] * (acc["n_var"] + acc["n_mean"] ** 2)).sum(axis=-1) - mean_n**2
    sd_n = np.sqrt(np.maximum(var_n, 0.0))
    lap_lock = np.asarray(lockstep["lap_ms_mean"], dtype=float)
    # the waves' period includes the replacement's TTFT: first at the renewal rate
    renewal = admissions(scenario, lockstep, parts, [(np.ones(()), 1.0 / mean_n)])
    period = mean_n + renewal.ttft_ms / lap_lock
    rounds = np.maximum(requests / b, 1.0)
    exposure = convoy_exposure(acc, renewal.ttft_ms / lap_lock, rounds, b)
    waves = wave_hazards(b, requests, mean_n, sd_n, period)
    adm = admissions(scenario, lockstep, parts, waves, exposure)
    lap = lap_lock + adm.delay_ms
    stretch = lap / lap_lock
    passes = np.asarray(lockstep["passes_per_request"], dtype=float)

    cold = np.asarray(lockstep["prefill_ms"], dtype=float)
    ttft = adm.ttft_ms
    # the DES leaves the first wave (cold start) out of its per-request statistics only when
    # there are at least two waves (wansim.sim.metrics.warmup_requests)
    first = np.minimum(b, requests)
    measured = np.where(
        requests >= 2 * b, ttft, (first * cold + (requests - first) * ttft) / requests
    )
    # the slowest slot's extra passes run while the batch drains: at the lap of one sequence
    excess = slowest_excess(acc["w"], acc["n_mean"], acc["n_var"], b, rounds)
    spread = excess * _single_lap_ms(scenario)
    makespan = cold + (rounds - 1.0) * ttft + rounds * passes * lap + spread

    busy = busy_ms(
        scenario,
        lockstep,
        adm,
        functools.partial(mean_stage_ms, scenario),
        np.asarray(lockstep["draft_ms"]) / np.asarray(scenario.stages),
    )
    out = dict(lockstep)
    out.update(
        {
            "tokens_per_s": np.asarray(lockstep["tokens_per_s"]) / stretch,
            "throughput_tokens_per_s": 1e3 * requests * (m + 1) / makespan,
            "lap_ms_mean": lap,
            "tpot_ms_mean": np.asarray(lockstep["tpot_ms_mean"]) * stretch,
            "ttft_ms_mean": measured,
            "bubble_fraction": 1.0 - busy / makespan,
            "lockstep_lap_ms": lap_lock,
            "convoy_ms_per_lap": adm.delay_ms,
            "makespan_ms": makespan,
        }
    )
    return BatchedRun(means=out, admissions=adm)


def busy_ms(scenario, lockstep: dict, adm: Admissions, stage_t, draft_ms) -> np.ndarray:
    """Busy ms over the run of a stage whose pass of n tokens over s sequences takes
    ``stage_t(n, s)``: the cold
    prefill, the R - b replacements' prefills (each shares one with j others) and the batch's
    R E[N] / b passes, each with ``draft_ms`` of drafting."""
    wl = scenario.workload
    b = np.asarray(speculation.batch_size(scenario), dtype=float)
    requests = np.asarray(wl.requests, dtype=float)
    verdicts = requests * np.asarray(lockstep["passes_per_request"]) / b
    # each of the R - b replacements shares its prefill with j others: t((1 + j) prompt) / (1 + j)
    prompt = np.asarray(wl.prompt_tokens, dtype=float)
    per_request = sum(
        (pj * stage_t((1 + j) * prompt, 1 + j) / (1 + j) for j, pj in adm.shared),
        start=np.zeros(()),
    )
    admitted = np.maximum(requests - b, 0.0)
    verify = stage_t(b * np.asarray(lockstep["tokens_per_pass"]), b)
    return (
        stage_t(b * wl.prompt_tokens, b) + admitted * per_request + verdicts * (verify + draft_ms)
    )


def stage_busy_ms(scenario, run: BatchedRun) -> tuple[list[float], float]:
    """Per-stage busy ms and the makespan (scalar scenario) of :func:`batched_run`'s run."""
    p = int(scenario.stages)
    means, adm = run.means, run.admissions
    makespan = float(np.asarray(means["makespan_ms"]))
    draft_stage = 0 if scenario.drafter.placement == "first_stage" else p - 1
    models = scenario.stage_compute_models()
    overheads = stage_overheads_ms(scenario)
    sequence_costs = stage_sequence_costs_ms(scenario)
    factors = mean_factors(scenario.model, p)  # compute noise and stragglers: E[XY]
    util = []
    for i in range(p):

        def stage_t(n, s, i=i):  # stage i's own model only (all P of them per stage: O(P^2))
            cost = stage_pass_ms(models[i], overheads[i], n, sequence_costs[i], s)
            return np.asarray(cost) * factors[i]

        draft = float(np.asarray(means["draft_ms"])) if i == draft_stage else 0.0
        util.append(float(np.asarray(busy_ms(scenario, means, adm, stage_t, draft))))
    return util, makespan


def split_gain(scenario) -> float:
    """How much shorter the lap of a scalar batched scenario would be if its b sequences ran as
    two groups of b / 2 pipelining through the ring: 1 - max(T(b/2), 2 s(b/2)) / T(b), T(n)
    the lockstep lap of n sequences, s(n) its busiest station's service, its drafting included
    (a closed cyclic ring of two deterministic customers; negative: the split runs slower). The DES's continuous batching splits into such groups
    (replacements travel as groups of their own); the lockstep model does not, so this is
    where it stops being right."""
    from wansim.analytical.sync import lap_parts, sync_metrics

    b = int(np.max(np.asarray(scenario.workload.concurrency)))
    if b < 2:
        return 0.0

    def at(n):
        wl = dataclasses.replace(scenario.workload, concurrency=n)
        sc = dataclasses.replace(scenario, workload=wl)
        parts = lap_parts(sc)
        stages = np.asarray(sc.stages)
        services, live = _path(
            sc, n * parts["tokens"], forward_sizes(parts), int(np.max(stages)), stages, n
        )
        # the drafter's pass occupies its stage with the group's (S0, or the last stage)
        first = sc.drafter.placement == "first_stage"
        services = _with_drafting(services, stages, np.asarray(parts["draft_ms"], float), first)
        busiest = max(
            float(np.max(np.where(on, s, 0.0))) for s, on in zip(services, live, strict=True)
        )
        return float(np.asarray(sync_metrics(sc)["lap_ms_mean"])), busiest

    whole, _ = at(b)
    half, busiest = at(b // 2)
    return 1.0 - max(half, 2.0 * busiest) / whole


def prefill_lead(scenario) -> float:
    """How a replacement's prefill keeps pace with the batch it joins: the largest ratio, over
    the live stations, of its prefill pass's service (one prompt) to the batch's decode pass
    (b sequences; drafting on S0 with the batch). Below 1 the prefill is faster than the batch
    everywhere and runs ahead of it: nothing holds the batch behind it, so the replacement
    never meets the batch in a queue and travels as a group of its own (the DES's batch
    fragments: 16-token prompts on the grid's 10-stage ring, K = 7, 16 users: -12% on
    tokens/s; agreement hunt seeds 167, 1780, 1796: -10% to -18%). At 1 or more the batch
    waits behind a prompt somewhere and the two merge (the grid's 512-token prompts)."""
    from wansim.analytical.sync import lap_parts

    parts = lap_parts(scenario)
    stages = np.asarray(scenario.stages)
    pmax = int(np.max(stages))
    b = parts["batch"]
    batch, live = _path(scenario, b * parts["tokens"], forward_sizes(parts), pmax, stages, b)
    if scenario.drafter.placement == "first_stage":
        batch[0] = batch[0] + parts["draft_ms"]
    prompt = np.asarray(scenario.workload.prompt_tokens, dtype=float)
    one, _ = _path(scenario, prompt, prefill_sizes(scenario, prompt), pmax, stages, 1)
    ratios = [
        np.where(on, p / np.maximum(d, 1e-12), 0.0)
        for p, d, on in zip(one, batch, live, strict=True)
    ]
    return float(np.min(np.max(np.stack(np.broadcast_arrays(*ratios)), axis=0)))

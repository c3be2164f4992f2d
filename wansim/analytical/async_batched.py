"""Async in-pipe speculation with continuous batching in the analytical engine: the block
schedule of one request on a ring whose passes cost the batch's (``validated: false``)."""

from __future__ import annotations

import math

import numpy as np

from wansim.analytical.answer import Answer
from wansim.config.scenario import Scenario
from wansim.results.metric_names import stage_utilization
from wansim.speculation.block_schedule import flushes


def async_batched(scenario: Scenario, parts: dict, one: Answer) -> Answer:
    """Async in-pipe speculation with continuous batching: a stage serves every block waiting
    in its mailbox as one pass, so the N sequences' blocks travel together and the ring carries
    the window's B batches of N blocks. Each sequence's bets are then those of one request on a
    ring whose passes cost the batch's (``one``: the block schedule on
    :func:`wansim.analytical.sync.lap_parts`'s
    batch-sized passes and messages). A replacement's prefill waits for S0's batch pass (its
    compute and drafting) besides its own; the run: R / N rounds per slot after the cold
    prefill, the slowest slot's drain (its decode time's spread over the rounds, the expected
    maximum of N normals, Blom's approximation). Stale blocks cost batch passes as in
    ``one``. Assumes the batches stay whole: true up to ~8 users (tokens/s -1..+13% against
    the DES, tests/engines/test_async_batched.py); with 16 users on the 10-stage reference ring
    the sequences' restarts split them and the model is +13% to +52% (docs/approximations.md,
    group "async+continuous batching"). ``validated: false``."""
    from wansim.numerics import normal_functions as nf
    from wansim.stages.compute import stage_ms_each

    means = dict(one.means)
    wl = scenario.workload
    slots = float(min(wl.concurrency, wl.requests))
    requests = float(wl.requests)
    m = float(wl.output_tokens - 1)
    # S0's drafting per batch pass: a batch of several sequences' blocks nearly always holds a
    # bet (the guess first: wansim.speculation.block_schedule.bet_draft_ms); one sequence's
    # passes mix first blocks and bets (the block schedule's mean)
    key = "stale_draft_ms" if slots > 1 else "draft_ms"
    draft = 0.0 if scenario.drafter.overlap else float(np.asarray(means[key]))
    s0_pass = float(np.asarray(parts["stage_ms"])) + draft
    ttft = means["prefill_ms"] + s0_pass
    decode = 1e3 * m / means["tokens_per_s"]
    rounds = requests / slots
    sd_request = 0.0
    if one.decode is not None:  # over difficulty: the decode times' mixture spread
        w = np.asarray(one.decode.weights, dtype=float)
        mean_n, sd_n = one.decode.tpot_ms * m, one.decode.sd_ms * m
        sd_request = math.sqrt(max(float(w @ (sd_n**2 + mean_n**2)) - float(w @ mean_n) ** 2, 0.0))
    blom = float(nf.norm_ppf((slots - 0.375) / (slots + 0.25))) if slots > 1 else 0.0
    drain = blom * sd_request * math.sqrt(rounds)
    makespan = means["prefill_ms"] + rounds * (ttft + decode) - ttft + means["prefill_ms"] + drain
    tokens = requests * (m + 1.0)
    means["ttft_ms_mean"] = ttft
    means["throughput_tokens_per_s"] = 1e3 * tokens / makespan
    means["bytes_per_token"] = means["bytes_per_token"] / slots
    # busy: R prefills, and the blocks as bulk passes: blocks reach stage i at lambda_i per ms
    # (the requests' verify and stale blocks over the run); a pass takes every block waiting,
    # s(b) = base + c b (linear between one block's and the batch's pass), and while passes run
    # back to back a pass holds what arrived during the last: b = max(1, lambda base /
    # (1 - lambda c)), at most the N sequences
    p = int(scenario.stages)
    pre = [float(x) for x in stage_ms_each(scenario, wl.prompt_tokens)]
    n_tok = float(np.asarray(parts["tokens"]))
    one_block = [float(x) for x in stage_ms_each(scenario, n_tok)]
    full = [float(x) for x in stage_ms_each(scenario, slots * n_tok, sequences=slots)]
    passes = means["passes_per_request"]
    s0 = means["stale_blocks_s0_per_request"]
    fwd = means["stale_blocks_forwarded_per_request"]
    mid = range(1, p if flushes(scenario) else p - 1)
    busy = []
    for i in range(p):
        blocks = requests * (passes + (s0 if i == 0 else fwd if i in mid else 0.0))
        lam = blocks / makespan
        c = (full[i] - one_block[i]) / (slots - 1.0) if slots > 1 else 0.0
        base = one_block[i] - c + (draft if i == 0 else 0.0)
        b = min(max(1.0, lam * base / max(1.0 - lam * c, 1e-9)), slots)
        busy.append(min(requests * pre[i] + blocks / b * (base + c * b), makespan))
    details = {**one.details, "approximation": "block schedule on the batch's ring"}
    return Answer(
        means,
        one.percentiles,
        stage_utilization(busy, makespan),
        details,
        one.lap_values_ms,
        one.lap_pmf,
        one.decode,
    )

"""The per-round hybrid (``schedule.hybrid_confident_fraction``): the
renewal-reward mix of :func:`wansim.speculation.hybrid_rounds.round_mix` over the two schedules it
switches between, each answered by its own model (the block schedule for the confident
rounds, the sync closed form with ``speculation.tree`` for the others).

Per request of M decode tokens, from each schedule alone: its rounds (the async schedule's
chains C = lost bets + bet win rate: every chain but the request's last ends in a lost bet;
the tree schedule's verify passes N_t), decode time, verify passes, bytes, computed
stage-tokens P M / (1 - wasted) and per-stage busy time while decoding; each is mixed as
R (p X_a / C + (1 - p) X_t / N_t). Assumptions: a chain's mean (time, tokens, stale work)
does not depend on what preceded it (a chain after a tree round starts with S0 free, one after
a lost bet when S0's work in progress ends: both are in the chain's cycle); the chains' cut at
the request's end is the pure async schedule's. Spread: tokens/s takes the two schedules'
Jensen factors weighted by decode time; lap percentiles are those of the two lap laws mixed by
passes (each a normal of its mean and p50-p99 spread), TPOT a normal of the mixed mean and the
time-weighted spread. Exact at p = 1 (the async schedule) and p = 0 (the sync tree schedule).
Several requests without batching (``workload.concurrency`` > 1): each schedule alone is
answered loaded by N requests (:mod:`wansim.analytical.concurrent`) and the per-request totals
mixed as above, with the loaded lap as the decode time per pass; TTFT is the two loaded TTFTs
weighted by the share of decode time in each kind of round, and the run's span per request
(makespan over requests) is the mixed residence over the mixed number of requests in
residence (each schedule's throughput x residence, weighted the same way). So a request's
confident rounds wait as if every other request ran chains, its tree rounds as if all ran
trees (the waits are convex in the load: an upper bound's side). Exact in the mean where the
ring saturates at a station (then the throughput is that station's work per request mixed per
round: tests/engines/test_hybrid_rounds.py, hand-worked); elsewhere it inherits the two loaded
models' errors (checked there against the DES: never above their envelope; below it where the
chains alone saturate S0 and the mix does not, -15% on tokens/s at 4 requests).
Not on the approximation-error grid: ``validated: false`` (checked against the DES in
tests/engines/test_hybrid_rounds.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wansim.analytical.distribution import mixture_normal_quantiles
from wansim.analytical.regime import approximation
from wansim.config.scenario import Scenario
from wansim.results.result import Result
from wansim.speculation.hybrid_rounds import (
    async_scenario,
    confident_fraction,
    round_mix,
    tree_scenario,
)
from wansim.stages.compute import stage_ms_each

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def _per_request(scenario: Scenario, res: Result, rounds: float) -> dict[str, float]:
    """Per-request totals of one schedule alone (one request at a time)."""
    met = res.metrics
    m = scenario.workload.output_tokens - 1
    passes = float(res.details["passes_per_request"])
    duration = 1e3 * (m + 1) / met["throughput_tokens_per_s"]  # the run's span per request
    decode = passes * met["lap_ms_mean"] if _many(scenario) else duration - met["ttft_ms_mean"]
    prefill = [float(x) for x in stage_ms_each(scenario, scenario.workload.prompt_tokens)]
    out = {
        "rounds": rounds,
        "decode_ms": decode,
        "passes": passes,
        "bytes": met["bytes_per_token"] * m,
        "stage_tokens": scenario.stages * m / max(1.0 - met["wasted_token_fraction"], 1e-12),
        "jensen_ms": met["tokens_per_s"] * decode / (1e3 * m) * decode,
    }
    for i, u in enumerate(met["stage_utilization"]):
        out[f"busy_{i}"] = u * duration - prefill[i]
    return out


def analyze_hybrid(scenario: Scenario, analyze: Callable[[Scenario], Result]) -> Result:
    """The hybrid's metrics (module docstring); ``analyze`` answers each schedule alone."""
    p = confident_fraction(scenario)
    m = scenario.workload.output_tokens - 1
    chain_sc, tree_sc = async_scenario(scenario), tree_scenario(scenario)
    chain_res, tree_res = analyze(chain_sc), analyze(tree_sc)
    passes_a = float(chain_res.details["passes_per_request"])
    win = float(chain_res.details["bet_win_rate"])
    chains = max(passes_a * (1.0 - win) + win, 1.0)
    chain = _per_request(chain_sc, chain_res, chains)
    tree = _per_request(tree_sc, tree_res, float(tree_res.details["passes_per_request"]))
    mix = round_mix(p, chain, tree)
    decode, passes = mix.decode_ms, mix.passes
    ca, ct = chain_res.metrics, tree_res.metrics
    time_a = p * mix.rounds / chains * chain["decode_ms"] / decode  # share in confident rounds
    ttft, span = ca["ttft_ms_mean"], ca["ttft_ms_mean"] + decode
    if _many(scenario):  # the loaded schedules mixed by time (module docstring)
        ttft = time_a * ca["ttft_ms_mean"] + (1.0 - time_a) * ct["ttft_ms_mean"]
        slots = [1e-3 * r["throughput_tokens_per_s"] / (m + 1) for r in (ca, ct)]
        slots = [
            x * (r["ttft_ms_mean"] + d)
            for x, r, d in zip(
                slots, (ca, ct), (chain["decode_ms"], tree["decode_ms"]), strict=True
            )
        ]
        span = (ttft + decode) / (time_a * slots[0] + (1.0 - time_a) * slots[1])
    prefill = [float(x) for x in stage_ms_each(scenario, scenario.workload.prompt_tokens)]
    util = [
        min((prefill[i] + mix.extra[f"busy_{i}"]) / span, 1.0) for i in range(int(scenario.stages))
    ]
    share_a = p * mix.rounds / chains * chain["passes"] / passes  # passes in confident rounds
    lap_p50, lap_p99 = mixture_normal_quantiles(
        [share_a, 1.0 - share_a],
        [ca["lap_ms_mean"], ct["lap_ms_mean"]],
        [_sd(ca, "lap"), _sd(ct, "lap")],
        [0.5, 0.99],
    )
    tpot_sd = time_a * _sd(ca, "tpot") + (1.0 - time_a) * _sd(ct, "tpot")
    tpot_p50, tpot_p99 = mixture_normal_quantiles([1.0], [decode / m], [tpot_sd], [0.5, 0.99])
    metrics = {
        "tokens_per_s": 1e3 * m / decode * mix.extra["jensen_ms"] / decode,
        "throughput_tokens_per_s": 1e3 * (m + 1) / span,
        "tau": m / passes,
        "lap_ms_mean": decode / passes,
        "lap_ms_p50": float(lap_p50),
        "lap_ms_p99": float(lap_p99),
        "tpot_ms_p50": float(tpot_p50),
        "tpot_ms_p99": float(tpot_p99),
        "ttft_ms_mean": ttft,
        "bubble_fraction": 1.0 - float(np.mean(util)),
        "stage_utilization": util,
        "bytes_per_token": mix.extra["bytes"] / m,
        "wasted_token_fraction": 1.0 - scenario.stages * m / mix.extra["stage_tokens"],
        "target_exact": bool(ca["target_exact"] and ct["target_exact"]),
    }
    from wansim.analytical.serving import serving_metrics

    metrics.update(
        serving_metrics(
            scenario,
            {
                "ttft_ms_mean": ttft,
                "tpot_ms_mean": decode / m,
                "throughput_tokens_per_s": metrics["throughput_tokens_per_s"],
            },
        )
    )
    details = {
        "approximation": "per-round hybrid: renewal-reward mix of the block schedule and the"
        " sync tree",
        "passes_per_request": passes,
        "rounds_per_request": mix.rounds,
        "confident_rounds_per_request": mix.confident_rounds,
        "tree_rounds_per_request": mix.tree_rounds,
        "chains_per_request_async_alone": chains,
        "bet_win_rate": win,
        "confident_decode_share": time_a,  # of the decode time, in confident rounds
        "confident_pass_share": share_a,  # of the verify passes
    }
    trust = approximation(scenario).to_json()  # validated: false (regime.outside says why)
    return Result.analytical(scenario, metrics, details, trust)


def _many(scenario: Scenario) -> bool:
    """Several requests at once (without batching: the closed ring)."""
    return scenario.schedule.batching == "none" and int(scenario.workload.concurrency) > 1


def _sd(metrics: dict, name: str) -> float:
    """A spread from p50 and p99 (as of a normal)."""
    return max(metrics[f"{name}_ms_p99"] - metrics[f"{name}_ms_p50"], 0.0) / Z99

"""Time-varying links in the analytical engine: quasi-static pieces.

The closed forms are stationary. With ``network.drift`` or ``network.trace_file`` the run is
cut into pieces over which every hop's latency and bandwidth factors are held
(:func:`wansim.links.nonstationary.pieces`: the trace's samples, the drift's ramp in 16 steps;
a piece's latency factor is its time average, its bandwidth factor the harmonic mean, so its
serialisation time is the time average). Each piece is answered by the stationary engine with
the factors applied, then the run is walked in time: piece k produces tokens at its
throughput theta_k for its duration d_k until the workload's W = requests x output_tokens
tokens are done (the last piece holds), and

    throughput_tokens_per_s = W / T                    T = sum of the time spent in pieces
    lap_ms_mean             = T / sum_k (t_k / lap_k)  (laps are counted, not time)
    every other metric      = sum_k w_k m_k,           w_k = tokens in piece k / W

(requests are weighted by the tokens they produce: a request is short compared with the
pieces). Requests that differ (length distributions, mixes): W takes the workload's mean output
length and each piece's stationary answer is already the expectation over the workload's nodes
(:mod:`wansim.analytical.mixture`); ``validated: false``, checked against the DES in
``tests/physics/test_drift.py`` (lognormal lengths alone and with 4 users, a mix, a trace:
within 3%). Open arrivals: each piece is a stationary open queue (the flow-equivalent
server of :mod:`wansim.analytical.open_arrivals`) and the walk takes its output rate; a queue
near capacity carries from one piece into the next, which the pieces do not model
(``tests/physics/test_open_drift.py``). Exact when the links change slowly compared with a request and its laps; a request
that straddles a change sees a mixture the pieces do not model, and the DES's
per-message factors are finer than the pieces. Results keep the stationary regime's band and
``validated`` where the approximation-error grid measured it (a drift of up to 1.3x on the sync
schedule's lone request, slow against a request: :func:`wansim.analytical.regime.drift_outside`);
elsewhere (traces, fast drifts, other regimes) they say ``validated: false``.
"""

from __future__ import annotations

import dataclasses

from wansim.analytical.mixture import mean_output_tokens, varies
from wansim.analytical.regime import UNVALIDATED_BAND, drift_outside
from wansim.config.network import Drift
from wansim.config.scenario import Scenario
from wansim.links.nonstationary import pieces
from wansim.results.result import Result

NEAR_CAPACITY = 0.8  # an open queue's utilisation in a piece beyond which the pieces say so


def stationary_at(scenario: Scenario, latency_factor: float, bandwidth_factor: float) -> Scenario:
    """``scenario`` with every hop's latency and bandwidth multiplied, drift and trace off."""
    net = scenario.network

    def scale(value, factor):
        return None if value is None else value * factor

    hops = tuple(
        dataclasses.replace(
            h,
            latency_ms=scale(h.latency_ms, latency_factor),
            bandwidth_mbps=scale(h.bandwidth_mbps, bandwidth_factor),
        )
        for h in net.hops
    )
    net = dataclasses.replace(
        net,
        latency_ms=net.latency_ms * latency_factor,
        bandwidth_mbps=net.bandwidth_mbps * bandwidth_factor,
        hops=hops,
        drift=Drift(),
        trace_file=None,
    )
    return dataclasses.replace(scenario, network=net)


def analyze_pieces(scenario: Scenario, analyze_stationary) -> Result:
    """The run over the pieces (module docstring); ``analyze_stationary``: scenario -> Result."""
    cuts = pieces(scenario.network)
    cache: dict[tuple[float, float], Result] = {}
    wl = scenario.workload
    output_tokens = mean_output_tokens(scenario)  # requests that differ: their mean
    total = float(wl.requests * output_tokens)
    done = 0.0
    walked = []  # (piece index, tokens, ms)
    for k, (t0, lat_f, bw_f) in enumerate(cuts):
        res = cache.get((lat_f, bw_f))
        if res is None:
            res = cache[(lat_f, bw_f)] = analyze_stationary(stationary_at(scenario, lat_f, bw_f))
        per_ms = float(res.metrics["throughput_tokens_per_s"]) / 1e3
        span = cuts[k + 1][0] - t0 if k + 1 < len(cuts) else float("inf")
        tokens = min(total - done, per_ms * span)
        walked.append((res, tokens, tokens / per_ms, t0, lat_f, bw_f))
        done += tokens
        if done >= total * (1 - 1e-12):
            break
    makespan = sum(w[2] for w in walked)
    metrics = _combine([(res, tokens / total) for res, tokens, *_ in walked])
    metrics["throughput_tokens_per_s"] = 1e3 * total / makespan
    laps = sum(ms / float(res.metrics["lap_ms_mean"]) for res, _, ms, *_ in walked)
    metrics["lap_ms_mean"] = makespan / laps
    first = walked[0][0]
    appr = dict(first.approximation or {})
    request_ms = 1e3 * output_tokens / float(first.metrics["throughput_tokens_per_s"])
    why = drift_outside(scenario, request_ms) if appr.get("validated") else ""
    if varies(scenario) and appr.get("validated"):
        why = (
            "requests that differ (checked against the DES in tests/physics/test_drift.py,"
            " not on the approximation-error grid)"
        )
    appr["regime"] = f"{appr.get('regime', '')} + time-varying links (quasi-static pieces)"
    busiest = max(
        (res.details.get("open_arrivals", {}).get("utilisation", 0.0) for res, *_ in walked),
        default=0.0,
    )
    if busiest > NEAR_CAPACITY:
        why = (why + "; " if why else "") + (
            f"the open queue reaches utilisation {busiest:.2f} in a piece: near capacity a"
            " queue carries from one piece into the next, which the pieces do not model (the"
            " mean wait understated by about half at 0.85-1.1, measured)"
        )
    if why or not appr.get("validated"):
        appr.update(
            validated=False,
            error_band=dict(UNVALIDATED_BAND),
            why=(
                f"time-varying links: the stationary model over {len(walked)} pieces of the run,"
                " weighted by the tokens each produces (exact when the links change slowly"
                f" compared with a request){': ' + why if why else ''}"
            ),
        )
    details = dict(first.details)
    details["link_pieces"] = [
        {"start_ms": t0, "latency_factor": lat, "bandwidth_factor": bw, "ms": ms, "tokens": tok}
        for _, tok, ms, t0, lat, bw in walked
    ]
    details["makespan_ms"] = makespan
    return Result.analytical(scenario, metrics, details, appr)


def _combine(weighted: list[tuple[Result, float]]) -> dict:
    """Token-weighted metrics: scalars and lists weighted, booleans from the first piece, a
    metric undefined (None) in any piece undefined."""
    out = {}
    for name, value in weighted[0][0].metrics.items():
        values = [res.metrics.get(name) for res, _ in weighted]
        if isinstance(value, bool) or any(v is None for v in values):
            out[name] = value if isinstance(value, bool) else None
        elif isinstance(value, list | tuple):
            out[name] = [
                sum(float(v[i]) * w for v, (_, w) in zip(values, weighted, strict=True))
                for i in range(len(value))
            ]
        elif isinstance(value, int | float):
            out[name] = sum(float(v) * w for v, (_, w) in zip(values, weighted, strict=True))
        else:
            out[name] = value
    return out

"""Open arrivals (``workload.arrival``: poisson, gamma, onoff, trace) in the analytical engine:
the flow-equivalent server (Norton's theorem for queueing networks, Chandy, Herzog & Woo 1975).

Model and assumptions:

- **The ring at n requests in service.** The closed model of the scenario at concurrency n
  (every regime the engine answers: one request, concurrent requests, batching, micro-batches,
  the block schedule) gives each request's residence R(n) = TTFT(n) + M / rate(n) and so the
  ring's completion rate X(n) = n / R(n), n = 1..C (C the slots: ``workload.concurrency``, or
  what the KV capacity admits). Beyond 32 slots X is evaluated on a geometric grid of n and
  interpolated linearly.
- **The queue.** Requests arrive at rate lambda and wait for a slot (FIFO). With Poisson
  arrivals and the ring taken as a server of state-dependent rate X(n) (exact for
  product-form networks, an approximation here), the number in the system is a birth-death
  chain: pi(n) ~ prod_k lambda / X(min(k, C)), stable while lambda < X(C). An arrival waits
  with probability P_wait = sum_{n >= C} pi(n) (PASTA); while all C slots are busy the queue
  drains at X(C), so a wait is exponential with mean 1 / (X(C) - lambda). Other arrival
  processes and non-exponential residences scale the waits by Allen-Cunneen's
  (c_a^2 + c_s^2) / 2 (exact for M/G/1 at C = 1: Pollaczek-Khinchine; with Cosmetatos's
  correction for near-deterministic residences on several slots, :func:`wait_factor`): c_a^2 of the gaps
  (gamma: ``arrival_cv``^2; onoff: the interrupted Poisson process's index of dispersion
  1 + 2 a lambda_on / (a + b)^2, a = 1 / on_ms, b = 1 / off_ms; trace: its gaps'), c_s^2 of a
  request's residence at C (its decode time over difficulty: :func:`wansim.analytical.
  serving.decode_mixture`).
- **Overload** (lambda >= X(C)): a finite run's queue grows; request i of R arrives at i /
  lambda and starts near i / X(C) (the fluid limit), so waits are uniform on
  [0, (R - 1)(1 / X(C) - 1 / lambda)]. Below X(C) but near it a finite run's queue is shorter
  than the stationary one: a run of R arrivals starting empty sees the stationary waits scaled by
  :func:`finite_run_share` (the queue's relaxation towards its mean, Morse's time constant).
- **Per request.** A request in service shares the ring with the others: its decode metrics
  (tokens/s, laps, TPOT, bytes per token) are the closed model's at n, weighted by the
  customer average n pi_s(n) (pi_s: the number in service); its TTFT is its wait plus the
  closed model's TTFT at the n it joins (an arrival admitted at once joins the k in service it
  finds, so n = k + 1; a queued one joins C - 1). Stage utilisation: the closed model's at n,
  weighted by pi_s. Throughput: R (M + 1) tokens over the run, from the first arrival to the
  last request's end ((R - 1) / min(lambda, X(C)), then its wait and residence).
- **Tails.** TTFT = wait + prefill (independent): the wait's atoms (no wait; the exponential's
  or the fluid's quantiles) convolved with the prefill's distribution; end-to-end adds the
  decode time (:mod:`wansim.analytical.serving`). Lap and TPOT percentiles are the closed
  model's at n weighted like the means (an approximation: a mixture's quantile is not the mean
  of the quantiles).

Requests that differ (length distributions, traces, mixes): the closed model at n is the
engine's expectation over the workload's nodes (:mod:`wansim.analytical.mixture`) and X(n) its
steady throughput in requests; c_s^2, the prefill and the decode-time mixture come from the
nodes at C (a node's prompt and output taken independent of each other in the tails).

Time-varying links: quasi-static pieces of this queue (:mod:`wansim.analytical.nonstationary`).
Failures at rates with ``recovery: failover`` (:func:`_open_faults`): the closed model at each n
carries them (a request in service is hit by every failure during its residence), the ring is
down lambda D / (1 + lambda D) of the time (its failure clock runs while it is up, busy or
idle), every request finishes (goodput = throughput), and an arrival during an outage waits
the rest of it (D / 2 on average) before its prefill; checked against the DES in
tests/physics/test_open_faults.py. Failures at fixed times with fail-over
(:func:`_fixed_time_faults`): on the open run with the rated ones, each outage stops the ring for
D, hits the L_s requests in service and leaves a queue that drains at X(C) - lambda (fluid).
``recovery: fail`` at rates: a failed request leaves its slot at the failure, so the server's
rate X(n) counts departures, finished or failed (the closed run's requests over its up time:
counting only the finished ones gave +86% on TTFT), and the closed model at the customers' n
gives the share that fails and what the failed ones produced; at fixed times the requests in
service fail and leave (:func:`_fixed_time_faults`). Every answer is
``validated: false``: checked against the DES in tests/engines/test_open_arrivals.py, not on
the approximation-error grid.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from wansim.results.result import Result

EXACT_STATES = 32  # slots evaluated one by one; beyond, a geometric grid
GRID_STATES = 24
WAIT_ATOMS = 64  # quantile midpoints of a wait
FLOAT_KEYS = (
    "tokens_per_s",
    "tau",
    "lap_ms_mean",
    "lap_ms_p50",
    "lap_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "bytes_per_token",
    "wasted_token_fraction",
)


def arrival_rate_and_scv(workload) -> tuple[float, float]:
    """(long-run arrival rate per ms, squared coefficient of variation of the gaps)."""
    rate = workload.rate_per_s / 1e3
    if workload.arrival == "poisson":
        return rate, 1.0
    if workload.arrival == "gamma":
        return rate, workload.arrival_cv**2
    if workload.arrival == "onoff":
        a, b = 1.0 / workload.on_ms, 1.0 / workload.off_ms
        return rate * b / (a + b), 1.0 + 2.0 * a * rate / (a + b) ** 2
    from wansim.serving.workload import read_trace

    times = read_trace(workload.trace).arrival_ms
    gaps = np.diff(np.asarray(times, dtype=float))
    mean = float(gaps.mean()) if len(gaps) else 0.0
    if mean <= 0:
        return np.inf, 0.0
    return 1.0 / mean, float(gaps.var() / mean**2)


def service_states(slots: int) -> np.ndarray:
    """The numbers in service at which the closed model is evaluated."""
    if slots <= EXACT_STATES:
        return np.arange(1, slots + 1)
    grid = np.geomspace(EXACT_STATES, slots, GRID_STATES).round().astype(int)
    return np.unique(np.concatenate([np.arange(1, EXACT_STATES + 1), grid]))


@dataclasses.dataclass(frozen=True)
class Queue:
    """The birth-death chain of the number in the system (module docstring)."""

    in_service: np.ndarray  # pi_s(n), n = 0..C
    p_wait: float
    wait_mean_ms: float
    stable: bool


def birth_death(rate_per_ms: float, completions_per_ms: np.ndarray) -> Queue:
    """pi_s over n = 0..C in service and the Poisson/exponential wait, for arrivals at
    ``rate_per_ms`` and completion rates X(1..C) (``completions_per_ms``)."""
    x = np.asarray(completions_per_ms, dtype=float)
    slots = len(x)
    log_pi = np.concatenate([[0.0], np.cumsum(np.log(rate_per_ms) - np.log(x))])
    rho = rate_per_ms / x[-1]
    if rho >= 1.0:
        pi = np.zeros(slots + 1)
        pi[-1] = 1.0
        return Queue(pi, 1.0, np.inf, False)
    log_pi -= log_pi.max()
    pi = np.exp(log_pi)
    tail = pi[-1] * rho / (1.0 - rho)  # n > C: pi(C) rho^(n - C)
    total = pi.sum() + tail
    pi_s = pi / total
    pi_s[-1] += tail / total
    p_wait = (pi[-1] + tail) / total
    return Queue(pi_s, float(p_wait), float(p_wait / (x[-1] - rate_per_ms)), True)


def wait_factor(arrival_scv: float, service_scv: float, rho: float, slots: int) -> float:
    """The M/M/c wait's multiplier: Allen-Cunneen's (c_a^2 + c_s^2) / 2, with Cosmetatos's
    correction for the deterministic part of the service on c > 1 slots,
    1 + (1 - rho)(c - 1)(sqrt(4 + 5c) - 2) / (16 rho c), weighted by 1 - c_s^2 (M/D/c's
    waits are more than half of M/M/c's at light load)."""
    factor = 0.5 * (arrival_scv + service_scv)
    if slots > 1 and 0.0 < rho < 1.0:
        corr = (1.0 - rho) * (slots - 1) * (math.sqrt(4 + 5 * slots) - 2) / (16 * rho * slots)
        factor *= 1.0 + corr * max(0.0, 1.0 - service_scv)
    return factor


def finite_run_share(rate_per_ms: float, drain_per_ms: float, requests: int) -> float:
    """The share of the stationary mean wait that a run of ``requests`` arrivals starting
    empty sees: the queue relaxes towards its stationary mean with the M/M/1 relaxation time
    tau = 1 / (mu (1 - sqrt(rho))^2) (Morse 1955; mu = X(C), rho = lambda / X(C)), taken as
    exponential, averaged over the run's T = R / lambda: 1 - (tau / T)(1 - e^(-T / tau))."""
    rho = rate_per_ms / drain_per_ms
    if not 0.0 < rho < 1.0 or not np.isfinite(rate_per_ms):
        return 1.0
    tau = 1.0 / (drain_per_ms * (1.0 - np.sqrt(rho)) ** 2)
    run = requests / rate_per_ms
    return float(1.0 - (tau / run) * -np.expm1(-run / tau))


def tail_decay_per_ms(rate: float, drain_ms: float, drain_scv: float) -> float:
    """The decay rate theta of P(wait > t) ~ e^(-theta t) for Poisson arrivals at ``rate`` on
    a ring that, saturated, frees a slot every ``drain_ms`` = 1 / X(C) on average (C slots of
    residence S: S / C), with squared coefficient of variation ``drain_scv`` (taken normal):
    the root theta > 0 of lambda (E[e^(theta S / C)] - 1) = theta. At C = 1 this is the M/G/1
    Cramer-Lundberg equation; for M/D/c it is the queue length's decay z (e^(lambda D (z - 1))
    = z^c) read as a wait, theta = c ln z / D. Bisection."""
    m, v = drain_ms, drain_scv * drain_ms**2

    def excess(theta):
        return rate * np.expm1(theta * m + 0.5 * theta**2 * v) - theta

    lo, hi = 0.0, 1.0 / m
    while excess(hi) < 0:  # below the root the line lies above the exponential
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def wait_atoms(queue: Queue, mean_ms: float, decay_per_ms: float, span_ms: float):
    """(values ms, probabilities) of a request's wait for a slot (module docstring): stable, an
    exponential tail of decay ``decay_per_ms`` holding P_wait' = min(1, mean theta) of the
    mass (so that the mean is ``mean_ms``), its atoms between survival levels spaced
    geometrically down to 1e-6 (each at its interval's conditional mean); overloaded, uniform
    on [0, ``span_ms``]."""
    if not queue.stable:  # the fluid limit of a finite run
        mid = (np.arange(WAIT_ATOMS) + 0.5) / WAIT_ATOMS
        return mid * span_ms, np.full(WAIT_ATOMS, 1.0 / WAIT_ATOMS)
    if mean_ms <= 0:
        return np.zeros(1), np.ones(1)
    p_wait = min(1.0, mean_ms * decay_per_ms)
    scale = mean_ms / p_wait
    edges = np.concatenate([np.geomspace(1.0, 1e-6, WAIT_ATOMS), [0.0]])  # survival levels
    t = -np.log(np.maximum(edges, 1e-300)) * scale
    t[-1] = np.inf
    upper, lower = edges[:-1], edges[1:]
    # E[T | t_i < T <= t_{i+1}] of an exponential: (a e^-a - b e^-b) / (e^-a - e^-b) + scale
    a, b = t[:-1], t[1:]
    b_term = np.where(np.isfinite(b), b, 0.0) * lower
    mean_in = (a * upper - b_term) / (upper - lower) + scale
    values = np.concatenate([[0.0], mean_in])
    mass = np.concatenate([[1.0 - p_wait], p_wait * (upper - lower)])
    return values, mass


@dataclasses.dataclass(frozen=True)
class Residences:
    """A request's residence at C in service over the workload's nodes (one node for like
    requests): weights, output tokens, loaded TTFT and decode-time mixtures per node."""

    weights: np.ndarray
    outputs: np.ndarray
    ttft_ms: np.ndarray
    decode: list  # per node: (weights, mean ms, sd ms) of its decode time
    prefill: list  # per node: (atoms ms, probabilities) of its prefill at its loaded mean

    def scv(self) -> float:
        """c_s^2 of a residence: over the nodes and each node's decode spread."""
        first, second = 0.0, 0.0
        for w, ttft, (wd, mean, sd) in zip(self.weights, self.ttft_ms, self.decode, strict=True):
            m1 = ttft + float(wd @ mean)
            var = float(wd @ (sd**2 + mean**2)) - float(wd @ mean) ** 2
            first += w * m1
            second += w * (var + m1**2)
        return max(second - first**2, 0.0) / first**2

    def decode_mixture(self, stretch: float = 1.0):
        w = np.concatenate([wn * d[0] for wn, d in zip(self.weights, self.decode, strict=True)])
        mean = np.concatenate([d[1] * stretch for d in self.decode])
        sd = np.concatenate([d[2] * stretch for d in self.decode])
        return w, mean, sd

    def prefill_atoms(self, shift_ms: float):
        values = np.concatenate([a + shift_ms for a, _ in self.prefill])
        mass = np.concatenate(
            [wn * p for wn, (_, p) in zip(self.weights, self.prefill, strict=True)]
        )
        order = np.argsort(values, kind="stable")
        return values[order], mass[order]


def residences(scenario, analyze) -> Residences:
    """The closed scenario at C in service, node by node (:func:`wansim.analytical.mixture.
    nodes`)."""
    from wansim.analytical.mixture import nodes
    from wansim.analytical.serving import decode_mixture, ttft_distribution

    weights, outputs, ttfts, decode, prefill = [], [], [], [], []
    for w, node in nodes(scenario):
        res = analyze(node)
        means = {
            "lap_ms_mean": res.metrics["lap_ms_mean"],
            "lap_ms_var": 0.0,
            "tpot_ms_mean": 1e3 / res.metrics["tokens_per_s"],
        }
        weights.append(w)
        outputs.append(node.workload.output_tokens)
        ttfts.append(res.metrics["ttft_ms_mean"])
        decode.append(decode_mixture(node, means))
        prefill.append(ttft_distribution(node, res.metrics["ttft_ms_mean"]))
    w = np.asarray(weights, dtype=float)
    return Residences(w / w.sum(), np.asarray(outputs, float), np.asarray(ttfts), decode, prefill)


def _open_faults(scenario, metrics: dict) -> dict:
    """Failures at rates with fail-over under open arrivals (module docstring): the ring is
    down a share lambda D / (1 + lambda D) of the time (its failure clock runs while it is up,
    busy or idle), every request finishes (goodput = throughput), and an arrival that comes
    during an outage waits the rest of it (D / 2 on average, PASTA) before its prefill."""
    from wansim.analytical.faults import MS_PER_HOUR, downtime_ms

    events = scenario.faults.events
    rate = sum(e.rate_per_hour for e in events) / MS_PER_HOUR
    down = sum(e.rate_per_hour * downtime_ms(scenario, e) for e in events) / MS_PER_HOUR
    share = down / (1.0 + down)  # down = lambda x mean downtime
    mean_d = down / rate
    ttft = metrics["ttft_ms_mean"] + share * mean_d / 2.0
    util = [u * (1.0 - share) for u in metrics["stage_utilization"]]
    return {
        "ttft_ms_mean": ttft,
        "goodput_tokens_per_s": metrics["throughput_tokens_per_s"],
        "failed_requests": 0.0,
        "availability": 1.0 - share,
        "stage_utilization": util,
        "bubble_fraction": 1.0 - float(np.mean(util)),
    }


def _fixed_time_faults(scenario, base: Result, analyze) -> Result:
    """Failures at fixed times on the open run ``base`` (the run with only the
    rated failures), each while the run lasts (module docstring): the ring stops for D; the
    L_s requests in service wait it and lose the ring time a failover adds (x, the closed
    model's at about L_s in service); the L_q queued wait D more, the lambda D arrivals of the
    outage its rest (D / 2); then the queue the ring finds (what does not fit the C slots, and
    the hit requests' lost work counted in requests) drains at X(C) - lambda, its requests
    waiting half the drain on average (fluid). The run ends later where that backlog outlasts
    the arrivals. Overloaded (the queue never empties), every request not started by the
    failure (R - X(C) t of them) starts the outage and the lost work later. A request hit in its
    decode runs k failovers longer (Poisson over the requests). ``recovery: fail``: the L_s
    requests in service fail instead (they leave: no work added; one failed in its decode had
    produced 1 + c tokens, c uniform), the rest as above."""
    from wansim.analytical.faults import K_MAX, MS_PER_S, downtime_ms, poisson_weights
    from wansim.analytical.mixture import mean_output_tokens

    oa = base.details["open_arrivals"]
    m = dict(base.metrics)
    lam = oa["rate_per_s"] / MS_PER_S
    x_c = oa["capacity_requests_per_s"] / MS_PER_S
    slots = int(oa["slots"])
    in_service = float(oa["mean_in_service"])
    queued = lam * float(m["queue_ms_mean"])  # Little
    requests = float(scenario.workload.requests)
    out_mean = mean_output_tokens(scenario)
    base_makespan = float(oa["makespan_ms"])
    # tokens per request the base run produced and finished (rated fail: fewer than out_mean)
    produced = float(m["throughput_tokens_per_s"]) * base_makespan / (MS_PER_S * requests)
    finished = float(m.get("goodput_tokens_per_s", m["throughput_tokens_per_s"]))
    finished *= base_makespan / (MS_PER_S * requests)
    fail = scenario.faults.recovery == "fail"
    rated_down = (1.0 - float(m.get("availability", 1.0))) * base_makespan
    decode = MS_PER_S * (out_mean - 1.0) / float(m["tokens_per_s"])
    prefill = float(m["ttft_ms_mean"]) - float(m["queue_ms_mean"])
    in_decode = decode / (prefill + decode)
    residence = slots / x_c  # a slot's time per request with every slot busy
    # fail: the hit requests leave (no work added); failover: the ring time each loses
    x = 0.0 if fail else _added_ring_ms(scenario, analyze, max(min(round(in_service), slots), 1))
    failed_fixed = 0.0
    fixed = sorted(
        (e.at_s * MS_PER_S, downtime_ms(scenario, e))
        for e in scenario.faults.events
        if e.at_s is not None
    )
    makespan, down, wait_total, hits_decode, end_prev = base_makespan, 0.0, 0.0, 0.0, -1.0
    for t, d in fixed:
        if t >= makespan:
            break
        if t < end_prev:  # during an outage: it extends it
            extra = max(0.0, t + d - end_prev)
            down, end_prev, makespan = down + extra, end_prev + extra, makespan + extra
            continue
        lost = in_service * x / residence  # the hit requests' lost work, in requests
        if fail:
            failed_fixed += in_service
        else:
            wait_total += in_service * (1.0 - in_decode) * (d + prefill / 2.0)  # in prefill
            hits_decode += in_service * in_decode
        if oa["stable"]:
            backlog = max(0.0, in_service + lam * d - slots) + queued + lost
            drain = backlog / (x_c - lam)
            wait_total += queued * d + lam * d * d / 2.0 + backlog * drain / 2.0
            makespan = max(makespan, t + d + drain + prefill + decode)
        else:  # the queue never empties: every request not started yet starts later
            shift = d + lost / x_c
            wait_total += max(requests - x_c * t, 0.0) * shift
            makespan += shift
        down += d
        end_prev = t + d
    m["ttft_ms_mean"] = float(m["ttft_ms_mean"]) + wait_total / requests
    m["queue_ms_mean"] = float(m["queue_ms_mean"]) + wait_total / requests
    if hits_decode:
        pk = poisson_weights(hits_decode / requests)  # failovers per request, in its decode
        k = np.arange(K_MAX)
        d_mean = down / max(len(fixed), 1)
        rate = MS_PER_S * (out_mean - 1.0) / (decode + k * (d_mean + x))
        rate[0] = float(m["tokens_per_s"])
        m["tokens_per_s"] = float((pk * rate).sum() / pk.sum())
    failed_fixed = min(failed_fixed, requests - float(m.get("failed_requests", 0.0)))
    # a request failed in its decode had produced 1 + c tokens, c uniform over the decode
    partial = in_decode * (1.0 + (out_mean - 1.0) / 2.0)
    m["throughput_tokens_per_s"] = (
        MS_PER_S * (requests * produced - failed_fixed * (out_mean - partial)) / makespan
    )
    m["goodput_tokens_per_s"] = (
        MS_PER_S * (requests * finished - failed_fixed * out_mean) / makespan
    )
    m["failed_requests"] = float(m.get("failed_requests", 0.0)) + failed_fixed
    m["availability"] = 1.0 - (rated_down + down) / makespan
    util = [u * base_makespan / makespan for u in m["stage_utilization"]]
    m["stage_utilization"] = util
    m["bubble_fraction"] = 1.0 - float(np.mean(util))
    details = {
        **base.details,
        "fixed_failures": {"downtime_ms": down, "added_ring_ms": x, "failed": failed_fixed},
    }
    trust = dict(base.approximation or {})
    trust["why"] = (
        "open arrivals with failures at fixed times: the outage, the queue it leaves and its"
        " drain on the open run (wansim/analytical/open_arrivals.py), checked against the DES"
        " in tests/physics/test_open_faults.py, not on the approximation-error grid"
    )
    return Result.analytical(scenario, m, details, trust)


def _added_ring_ms(scenario, analyze, in_service: int) -> float:
    """The ring time a failover adds to each request it hits (lost work, re-prefill, the other
    hit requests' re-prefills ahead of it): the closed model's at ``in_service`` requests."""
    from wansim.config.faults import FaultEvent

    first = next(e for e in scenario.faults.events if e.at_s is not None)
    probe_event = FaultEvent(
        stage=first.stage, link=first.link, rate_per_hour=1.0, downtime_s=first.downtime_s
    )
    wl = dataclasses.replace(
        scenario.workload,
        arrival="closed",
        concurrency=int(in_service),
        requests=max(int(scenario.workload.requests), 2 * int(in_service)),
    )
    faults = dataclasses.replace(scenario.faults, events=(probe_event,))
    res = analyze(dataclasses.replace(scenario, workload=wl, faults=faults))
    return float(res.details["faults"]["added_ring_ms_per_failover"])


def analyze_open(scenario, analyze) -> Result:
    """The open-arrival scenario by the flow-equivalent server (module docstring); ``analyze``
    answers the closed scenario at each number in service."""
    from wansim.analytical.engine import kv_admitted
    from wansim.analytical.mixture import varies
    from wansim.analytical.regime import UNVALIDATED_BAND
    from wansim.analytical.serving import _coarsen, quantiles_of_atoms, sum_quantiles
    from wansim.numerics import normal_functions as nf

    events = scenario.faults.events
    if any(e.at_s is not None for e in events):  # the run at the rates, then the fixed times
        rated = tuple(e for e in events if e.at_s is None)
        faults = dataclasses.replace(scenario.faults, events=rated)
        base = analyze_open(dataclasses.replace(scenario, faults=faults), analyze)
        return _fixed_time_faults(scenario, base, analyze)
    wl = scenario.workload
    requests = int(wl.requests)
    closed_wl = dataclasses.replace(wl, arrival="closed")
    slots = int(kv_admitted(dataclasses.replace(scenario, workload=closed_wl)).workload.concurrency)
    slots = max(min(slots, requests), 1)
    states = service_states(slots)
    differ = varies(scenario)
    answers = []
    for n in states:
        # requests that differ: enough of them that the closed run's throughput is its steady one
        many = max(requests, (32 if differ else 2) * n)
        w_n = dataclasses.replace(closed_wl, concurrency=int(n), requests=many)
        answers.append(analyze(dataclasses.replace(scenario, workload=w_n)))
    if scenario.faults.events and any(a.metrics["tokens_per_s"] is None for a in answers):
        from wansim.errors import ScenarioError

        raise ScenarioError(
            "faults.events",
            "failures come faster than the ring recovers (rate x recovery time >= 1)",
            f"{len(scenario.faults.events)} events",
        )
    ttft = np.array([a.metrics["ttft_ms_mean"] for a in answers])
    n_all = np.arange(1, slots + 1)

    def at_all(values):  # linear in n between the evaluated states
        return np.interp(n_all, states, np.asarray(values, dtype=float))

    top = answers[-1]
    res_c = residences(top.scenario, analyze)
    mean_out = float(res_c.weights @ res_c.outputs)
    fail = bool(scenario.faults.events) and scenario.faults.recovery == "fail"
    if fail:  # departures, finished or failed: a slot is held for the ring's up time per request
        x = at_all(
            [
                a.scenario.workload.requests
                / (a.details["faults"]["makespan_ms"] - a.details["faults"]["downtime_ms"])
                for a in answers
            ]
        )
    elif differ:  # completions from the closed run's throughput: E[residence] of mixed requests
        steady = [  # the closed run's rate with its slots busy (not its finite run's drain)
            a.details.get("steady_throughput", a.metrics["throughput_tokens_per_s"])
            for a in answers
        ]
        x = at_all([t / (1e3 * mean_out) for t in steady])
    else:
        rate_n = np.array([a.metrics["tokens_per_s"] for a in answers])
        x = at_all(states / (ttft + 1e3 * (mean_out - 1.0) / rate_n))
    lam, ca2 = arrival_rate_and_scv(wl)
    queue = birth_death(lam, x)
    cs2 = res_c.scv()
    x_c = float(x[-1])
    factor = wait_factor(ca2, cs2, lam / x_c, slots) * finite_run_share(lam, x_c, requests)
    if queue.stable:
        wait_mean = factor * queue.wait_mean_ms
        decay = (
            tail_decay_per_ms(lam, 1.0 / x_c, cs2)
            if wl.arrival == "poisson"
            else (x_c - lam) / (0.5 * (ca2 + cs2))
        )
        values, mass = wait_atoms(queue, wait_mean, decay, 0.0)
    else:
        span = max(requests - 1, 0) * (1.0 / x_c - 1.0 / lam)
        values, mass = wait_atoms(queue, 0.0, 0.0, span)
        wait_mean = float(values @ mass)

    pi_s = queue.in_service[1:]  # n = 1..C
    customers = n_all * pi_s
    w_cust = customers / customers.sum() if customers.sum() > 0 else np.eye(slots)[0]
    admit = queue.in_service[:-1].copy()  # finds n - 1 in service, joins as the n-th
    admit[-1] += queue.p_wait  # a queued arrival takes a freed slot: the C-th
    admit = admit / admit.sum()

    metrics: dict = {}
    for key in FLOAT_KEYS:
        metrics[key] = float(w_cust @ at_all([a.metrics[key] for a in answers]))
    prefill_mean = float(admit @ at_all(ttft))
    metrics["ttft_ms_mean"] = wait_mean + prefill_mean
    busy = pi_s / max(pi_s.sum(), 1e-300)
    util = [
        float(busy @ at_all([a.metrics["stage_utilization"][i] for a in answers]))
        for i in range(len(top.metrics["stage_utilization"]))
    ]
    metrics["stage_utilization"] = util
    metrics["bubble_fraction"] = 1.0 - float(np.mean(util))
    metrics["target_exact"] = top.metrics["target_exact"]
    # the last request arrives (R - 1) / lambda in (starts (R - 1) / X(C) in, overloaded)
    served = min(lam, x_c)
    last_wait = wait_mean if queue.stable else 0.0
    residence = prefill_mean + 1e3 * (mean_out - 1.0) / metrics["tokens_per_s"]
    makespan = (requests - 1) / served + last_wait + residence
    metrics["throughput_tokens_per_s"] = 1e3 * requests * mean_out / makespan

    # tails: the wait convolved with the prefill, then the decode time added (the nodes'
    # prefills and decode times scaled to the loads the requests see)
    prefill_atoms, prefill_mass = res_c.prefill_atoms(
        prefill_mean - float(res_c.weights @ res_c.ttft_ms)
    )
    prefill_atoms, prefill_mass = _coarsen(prefill_atoms, prefill_mass)
    t_values = (values[:, None] + prefill_atoms[None, :]).ravel()
    t_mass = (mass[:, None] * prefill_mass[None, :]).ravel()
    order = np.argsort(t_values, kind="stable")
    t_values, t_mass = _coarsen(t_values[order], t_mass[order])
    metrics["ttft_ms_p50"], metrics["ttft_ms_p99"] = (
        float(q) for q in quantiles_of_atoms(t_values, t_mass, [0.5, 0.99])
    )
    stretch = top.metrics["tokens_per_s"] / metrics["tokens_per_s"]
    w_dec, mean_dec, sd_dec = res_c.decode_mixture(stretch)
    metrics["e2e_ms_p50"], metrics["e2e_ms_p99"] = (
        float(q) for q in sum_quantiles(t_values, t_mass, w_dec, mean_dec, sd_dec, [0.5, 0.99])
    )
    metrics["queue_ms_mean"] = wait_mean
    metrics["queue_ms_p99"] = float(quantiles_of_atoms(values, mass, [0.99])[0])
    if scenario.faults.events:
        metrics.update(_open_faults(scenario, metrics))
    if fail:  # a share of the requests fails: the closed model's at the customers' n
        failed = float(
            w_cust
            @ at_all([a.metrics["failed_requests"] / a.scenario.workload.requests for a in answers])
        )
        kept = float(
            w_cust
            @ at_all(
                [
                    a.metrics["goodput_tokens_per_s"] / a.metrics["throughput_tokens_per_s"]
                    for a in answers
                ]
            )
        )
        # produced per request = out (1 - failed) / kept: the finished tokens' share of them
        produced = mean_out * (1.0 - failed) / max(kept, 1e-300)
        metrics["throughput_tokens_per_s"] *= produced / mean_out
        metrics["goodput_tokens_per_s"] = metrics["throughput_tokens_per_s"] * kept
        metrics["failed_requests"] = failed * requests
    attain = 1.0
    if wl.slo.ttft_ms is not None:
        attain *= float(t_mass[t_values <= wl.slo.ttft_ms].sum())
    if wl.slo.tpot_ms is not None:
        m_each = np.concatenate(
            [np.full(len(d[0]), o - 1.0) for o, d in zip(res_c.outputs, res_c.decode, strict=True)]
        )
        z = (wl.slo.tpot_ms * m_each - mean_dec) / np.maximum(sd_dec, 1e-12)
        attain *= float(w_dec @ nf.norm_cdf(z))
    attain = min(max(attain, 0.0), 1.0)
    metrics["slo_attainment"] = attain
    metrics["goodput_requests_per_s"] = attain * metrics["throughput_tokens_per_s"] / mean_out

    closed = dict(top.approximation or {})
    trust = {
        "regime": f"open arrivals ({wl.arrival}) over {closed.get('regime', 'sync')}",
        "validated": False,
        "error_band": dict(UNVALIDATED_BAND),
        "why": (
            "open arrivals: the closed model at each number in service as a birth-death queue"
            " (wansim/analytical/open_arrivals.py), checked against the DES in"
            " tests/engines/test_open_arrivals.py, not on the approximation-error grid"
        ),
    }
    details = {
        "open_arrivals": {
            "rate_per_s": 1e3 * lam,
            "arrival_scv": ca2,
            "residence_scv": cs2,
            "capacity_requests_per_s": 1e3 * float(x[-1]),
            "utilisation": lam / float(x[-1]),
            "p_wait": queue.p_wait,
            "stable": queue.stable,
            "mean_in_service": float(n_all @ pi_s),
            "slots": slots,
            "makespan_ms": makespan,
            "states_evaluated": len(states),
        }
    }
    return Result.analytical(scenario, metrics, details, trust)

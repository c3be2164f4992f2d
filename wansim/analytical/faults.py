"""Faults in expected value (closed loop, either schedule), the DES's model of
:mod:`wansim.sim.faults` (a failure stops the ring for its downtime D and loses the passes in
flight; ``failover`` re-prefills the request, ``fail`` fails it).

A failure hits the request cycle at a uniform point of its ring time (renewal: the cycle of
T0 = prefill P0 + N laps of mean L, variance Var L, as without faults; faults rare against a
request's length, so the re-prefills and lost work they add are not themselves a cycle's
phases). Per failure:

- failover: the request loses the time since its last verify (or its admission): E[elapsed]
  = (P0^2 + N E[L^2]) / (2 T0); if the failure fell in the decode (probability N L / T0) it
  re-prefills prompt + c tokens, c uniform over the decode (the mean of P(prompt + c) over c
  in [0, M)); X = E[elapsed] + (N L / T0) E[P(prompt + c)] is added ring time, D down time.
- fail: the request fails at age a, E[a] = (T0^2 + Var T) / (2 T0) (length-biased), Var T =
  L^2 Var N + N Var L; it produced 1 + c tokens if it had its first token (E[c] = M / 2).
  Under failures at rate lambda each request races the clock: it fails with probability
  1 - exp(-lambda T0) and holds the ring E[min(Exp(lambda), T0)] = (1 - exp(-lambda T0)) /
  lambda (exact for a deterministic T0).

Run of R requests: fixed-time failures in time order, each counted while the run lasts (one
during an earlier outage extends it and hits nobody); failures at rate lambda (per ms of ring
up time, the DES's clock) add lambda U of them, U the up time:

  failover  U = R T0 e^(lambda X) + F_fix (e^(lambda X) - 1) / lambda
            (a failure during the X a failover adds restarts it; :func:`up_time_ms`;
            null where lambda X >= 1: restarts dominate the run)
  fail      F = F_fix + (R - F_fix) (1 - e^{-lambda T0}),
            U = F_fix E[a] + (R - F_fix) (1 - e^{-lambda T0}) / lambda
  makespan = U + sum of downtimes;  availability = 1 - downtime / makespan;
  goodput = finished (M + 1) / makespan

Several requests in flight (N slots: concurrency, continuous batching, micro-batches): T0 is a
request's loaded ring time (its loaded TTFT plus N laps of the loaded lap), the run's up time
R T0 / N, every failure hits the N requests in the ring (fail: N fail; failover: N re-prefill,
queued behind each other at the slowest station a prefill crosses, (N - 1) times its service
added to X; with continuous batching one batched prefill of the N), and a request's hits are
those of the failures that found it in the ring outside re-prefills (F_fix + lambda W), each
costing its re-prefill restarted by the failures during it (e^(lambda r) downtimes,
(e^(lambda r) - 1) / lambda of ring time; 120 failures an hour on a 16-request batch whose
re-prefill takes 16 s: tokens/s -44% -> +6.7%, throughput -44% -> +0.6% against the DES). With
micro-batches the N re-prefills are a cold wave into the idle ring, b = N / N' prompts of
prompt + c tokens per micro-batch in chunk passes
(:func:`wansim.analytical.micro_batched.cold_wave_ttft_ms`, its mean over the members: a
member decodes again from its own last chunk, beside the others' chunks), and the run's up time
without faults is the micro-batched model's makespan (its cold start, the prompts queued for
the chunk budget and the drain), not R T0 / N (fail: the slots' held time stretched by the same
ratio). A request hit in its prefill re-prefills last in its micro-batch's wave (TTFT + D + the
wave's last first token W), and the replacements admitted during the wave wait for the rest
of it (N W^2 / (6 x decode time) in all per failure: the members resume uniformly over the
wave and finish within it in proportion to the wave left). With ``fail`` the N requests
admitted when the ring serves again enter together: a cold wave of fresh prompts, not the
steady TTFT, which also adds its excess over the steady TTFT to the up time. The same holds
for any N > 1 with ``fail`` (continuous batching: one batched prefill of N prompts; without
batching: N prefills queued at the slowest station, (N - 1) / 2 services on average), and
the failed requests that had their first token are fewer by the share admitted cold (a
16-sequence batch re-prefilling for 16 s, 41 of 64 failing: goodput +54% -> +6.9%, TTFT
-2.8%, throughput +100% -> +24% against the DES).

The block schedule (async, an overlapped drafter): a request's verify-to-verify laps are of
two kinds, short spacings inside a chain and a whole lap after each lost bet, so the lap a
failure interrupts has the residual E[L^2] / 2 E[L] over the blocks model's laps (its
``lap_atoms``), not over one lap of the mean length; and after the re-prefill the new chain's
first verdict comes a first lap F (one block through the drafting and the whole ring) later,
where the interrupted chain's would have come a residual after the failure. So a failover in
the decode adds the residual (lost) + P(prompt + c) + F - 2 x residual (the engine gives F and
the residual as ``first_lap_ms``, ``lap_residual_ms``; with N in flight both carry the loaded
ring's queueing per lap). A sync ring's next lap is like the one lost (F - 2 x residual ~ 0:
left out, the model as above).

Requests that differ (:func:`fault_run_mixed`, kinds i with shares w_i): T0 is the mean
sum w_i T0_i; a failure finds kind i with probability w_i T0_i / T0 (its share of the ring
time), so X, a failed request's age and lost time are those time-weighted means; with ``fail``
each kind races the rate clock with its own T0; tokens/s and TTFT are each kind's (its hits
per request) averaged over the requests; produced tokens count each kind's own M.

tokens_per_s (mean over finished requests of M / decode time): failover mixes in the requests
hit k times in their decode (k Poisson with mean F (N L / T0) / R), whose decode time grows by
k (D + E[elapsed in a lap] + E[P(prompt + c)]); ttft: requests hit in prefill wait D + P0 / 2
more (failover); the request admitted at a failure waits D, and finishes with probability
1 - F / R (fail). Lap and TPOT percentiles are left as without faults.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from wansim.config.scenario import Scenario
from wansim.serving.micro_batching import micro_batched

MS_PER_S = 1e3
MS_PER_HOUR = 3.6e6
C_POINTS = 64  # midpoints of the decode for E[P(prompt + c)]
K_MAX = 64  # failures per request's decode summed over (Poisson)
DIVERGES = "undefined: failures come faster than the ring recovers (rate x recovery time >= 1)"


@dataclasses.dataclass(frozen=True)
class FaultAnswer:
    """The expected run with faults: metrics to replace or add, and the reasons of those that
    are undefined (None)."""

    metrics: dict
    undefined: dict[str, str]
    details: dict


def downtime_ms(scenario: Scenario, event) -> float:
    d = event.downtime_s if event.downtime_s is not None else scenario.faults.detection_s
    return d * MS_PER_S


def reprefill_ms(scenario: Scenario, committed: np.ndarray) -> np.ndarray:
    """P(prompt + c): the prefill path (every stage, the forward hops) of prompt + c tokens."""
    from wansim.analytical.sync import sync_metrics

    prompt = scenario.workload.prompt_tokens + np.asarray(committed)
    sc = dataclasses.replace(
        scenario, workload=dataclasses.replace(scenario.workload, prompt_tokens=prompt)
    )
    return np.asarray(sync_metrics(sc)["prefill_ms"], dtype=float)


def prefill_station_ms(scenario: Scenario, committed: np.ndarray) -> np.ndarray:
    """The slowest station a prefill of prompt + c tokens crosses: a stage's compute or a
    forward hop's sender (software and serialisation)."""
    from wansim.analytical.path import hop_bytes, hop_service_ms
    from wansim.links.wire_bytes import forward_bytes
    from wansim.stages.compute import stage_ms_each

    tokens = scenario.workload.prompt_tokens + np.asarray(committed, dtype=float)
    p = int(scenario.stages)
    slowest = np.max(
        np.stack([np.asarray(x, dtype=float) for x in stage_ms_each(scenario, tokens)]), 0
    )
    size = forward_bytes(scenario.payload, scenario.model.hidden_size, tokens)
    for h in range(p - 1):
        slowest = np.maximum(slowest, hop_service_ms(scenario, h, hop_bytes(size, h)))
    return slowest


def without_faults(scenario: Scenario) -> Scenario:
    """The same scenario with no fault events (the calm run a fault model starts from)."""
    return dataclasses.replace(scenario, faults=dataclasses.replace(scenario.faults, events=()))


def poisson_weights(mu: float) -> np.ndarray:
    """P(k failures) for k = 0 .. K_MAX - 1, Poisson with mean ``mu`` (unnormalised tail)."""
    k = np.arange(K_MAX)
    log_k_fact = np.cumsum(np.log(np.maximum(k, 1)))
    return np.exp(k * np.log(max(mu, 1e-300)) - mu - log_k_fact)


def up_time_ms(work_ms: float, fixed_failures: float, rate_per_ms: float, x_ms: float) -> float:
    """The ring's up time with failovers (module docstring): ``work_ms`` of ring time without
    faults, hit by ``fixed_failures`` and by failures at ``rate_per_ms`` while up; each
    failure adds ``x_ms`` of ring time (the lost lap and the re-prefills), which a failure
    during it restarts from the start. x done without a failure takes (e^(lambda x) - 1) /
    lambda in expectation (exponential clocks, renewal), and the failures outside those
    stretches are F_fix + lambda W, so U = W e^(lambda x) + F_fix (e^(lambda x) - 1) / lambda
    (W + F_fix x as lambda -> 0; to first order the linear (W + F_fix x) / (1 - lambda x))."""
    if rate_per_ms <= 0:
        return work_ms + fixed_failures * x_ms
    growth = rate_per_ms * x_ms
    return work_ms * math.exp(growth) + fixed_failures * math.expm1(growth) / rate_per_ms


def fault_run(scenario: Scenario, means: dict, in_flight: int = 1) -> FaultAnswer:
    """Expected metrics of a run with ``scenario.faults`` (module docstring); ``means``: the
    model's mean metrics (scalars) without faults; ``in_flight``: the requests in the ring at
    once (the slots). With N > 1 (module docstring, the loaded ring): a request's ring time is
    its loaded TTFT plus its passes at the loaded lap, the run's up time R T0 / N, every failure
    hits the N requests in flight, and a failover's N re-prefills queue behind each other at
    the slowest station they cross."""
    return fault_run_mixed(scenario, [(1.0, scenario, means)], in_flight)


def fault_run_mixed(
    scenario: Scenario, kinds: list[tuple[float, Scenario, dict]], in_flight: int = 1
) -> FaultAnswer:
    """:func:`fault_run` for requests that differ: ``kinds`` lists (share of the requests,
    scenario of such requests, their means without faults). A failure finds a kind's request in
    the ring in proportion to the ring time its requests take (w_i T0_i: long requests are hit
    more often), so a failure's added ring time, the hit request's age and whether it was
    decoding are those time-weighted means; each kind's requests race the rate clock with their
    own T0 (fail), and a kind's tokens/s and TTFT take the hits per request of that kind. One
    kind is the module docstring's model exactly."""
    faults = scenario.faults
    wl = scenario.workload
    r_requests = float(wl.requests)
    slots = float(max(min(in_flight, wl.requests), 1))
    w = np.array([float(x) for x, _, _ in kinds])
    w = w / w.sum()
    k_means = [mm for _, _, mm in kinds]

    def per_kind(key, default=None) -> np.ndarray:
        return np.array(
            [float(mm.get(key, default) if default is not None else mm[key]) for mm in k_means]
        )

    m = np.array([float(sc.workload.output_tokens - 1) for _, sc, _ in kinds])
    p0 = per_kind("prefill_ms") if slots == 1 else per_kind("ttft_ms_mean")
    n = per_kind("passes_per_request")
    lap = per_kind("lap_ms_mean")
    lap_var = per_kind("lap_ms_var")
    n_var = per_kind("passes_var", 0.0)
    decode = n * lap
    t0 = p0 + decode
    in_decode = decode / t0
    elapsed_lap = (lap**2 + lap_var) / (2.0 * lap)
    elapsed = (p0**2 + n * (lap**2 + lap_var)) / (2.0 * t0)
    # the block schedule: its laps are of two kinds (chain spacings, a restart after each lost
    # bet) with their own residual; the restarted chain's first verdict comes a first lap F
    # after the re-prefill, where the interrupted chain's would have come a residual after the
    # failure (sync: the next lap is like the one lost, F - 2 x residual ~ 0, left out)
    blocks = per_kind("first_lap_ms", -1.0) >= 0.0
    residual = per_kind("lap_residual_ms", 0.0)
    elapsed_lap = np.where(blocks, residual, elapsed_lap)
    elapsed = np.where(blocks, (p0**2 + n * 2.0 * lap * residual) / (2.0 * t0), elapsed)
    restart = np.where(blocks, per_kind("first_lap_ms", -1.0) - 2.0 * residual, 0.0)
    reprefill = np.empty(len(kinds))
    wave_ms = np.zeros(len(kinds))  # micro-batches: the re-prefill wave's last first token
    wave0_ms = np.zeros(len(kinds))  # N fresh prompts entering together: the mean first token
    for i, (_, sc, _) in enumerate(kinds):
        c = np.floor((np.arange(C_POINTS) + 0.5) / C_POINTS * m[i])
        if micro_batched(sc):  # the slots' re-prefills as a cold wave of chunk passes
            from wansim.analytical.micro_batched import cold_wave_ttft_ms
            from wansim.analytical.sync import lap_parts

            prompts, terms = sc.workload.prompt_tokens + c, lap_parts(sc)
            reprefill[i] = float(np.mean(cold_wave_ttft_ms(sc, prompts, terms)))
            wave_ms[i] = float(np.mean(cold_wave_ttft_ms(sc, prompts, terms, member=1.0)))
            wave0_ms[i] = float(cold_wave_ttft_ms(sc, sc.workload.prompt_tokens, terms))
            continue
        reprefill[i] = float(np.mean(reprefill_ms(sc, c)))
        if slots > 1:  # the N admitted after a failure (fail) prefill together
            wave0_ms[i] = float(reprefill_ms(sc, np.zeros(1))[0])
        if slots > 1 and sc.schedule.batching == "none":  # the others queue at the slowest
            # station (continuous batching: one batched prefill of the N, reprefill_ms's)
            reprefill[i] += (slots - 1.0) * float(np.mean(prefill_station_ms(sc, c)))
            wave0_ms[i] += (slots - 1.0) / 2.0 * float(prefill_station_ms(sc, np.zeros(1))[0])
    reprefill += restart
    ttft = per_kind("ttft_ms_mean")
    cold_excess = np.maximum(wave0_ms - ttft, 0.0)  # N fresh prompts together vs one steady
    failover = faults.recovery == "failover"
    x_k = elapsed + in_decode * reprefill  # ring time a failover adds
    var_t = lap**2 * n_var + n * lap_var
    age_k = (t0**2 + var_t) / (2.0 * t0)
    t0_mean = float((w * t0).sum())
    hit_share = w * t0 / t0_mean  # which kind a failure finds in the ring
    x = float((hit_share * x_k).sum())
    age = float((hit_share * age_k).sum())
    t_ring = t0_mean / slots  # ring time per request: N share the ring
    base_up = r_requests * t_ring  # the run's up time without faults
    if all(micro_batched(sc) and "makespan_ms" in mm for _, sc, mm in kinds):
        base_up = float((w * per_kind("makespan_ms")).sum())  # its cold start and drain
    rated = [e for e in faults.events if e.rate_per_hour is not None]
    lam = sum(e.rate_per_hour for e in rated) / MS_PER_HOUR
    d_rated = (
        sum(e.rate_per_hour * downtime_ms(scenario, e) for e in rated) / (lam * MS_PER_HOUR)
        if rated
        else 0.0
    )
    # fixed-time failures in order, while the run lasts (rated ones ignored here: rare)
    fixed = sorted(
        (e.at_s * MS_PER_S, downtime_ms(scenario, e)) for e in faults.events if e.at_s is not None
    )
    lost = float((hit_share * (t0 - age_k)).sum())  # fail: the hit request's remaining time
    hits, down, end_prev = 0, 0.0, -1.0  # hits: failures that found requests in the ring
    for t, d in fixed:
        up_work = base_up + hits * (x if failover else -lost)
        if t >= up_work + down or (not failover and hits * slots >= r_requests):
            break
        if t < end_prev:  # during an outage: it extends it
            extra = max(0.0, t + d - end_prev)
            down += extra
            end_prev += extra
            continue
        hits += 1
        down += d
        end_prev = t + d
    undefined: dict[str, str] = {}
    if failover:
        if lam * x >= 1.0:
            names = ("throughput_tokens_per_s", "goodput_tokens_per_s", "availability")
            names += ("tokens_per_s",)
            metrics = {**dict.fromkeys(names), "failed_requests": 0.0}
            return FaultAnswer(metrics, dict.fromkeys(names, DIVERGES), {})
        up = up_time_ms(base_up, hits, lam, x)
        f_rated = lam * up
        failed_k = np.zeros(len(kinds))
    else:  # each request left races the rate clock: it fails with 1 - exp(-lambda T0)
        hit_requests = min(hits * slots, r_requests)
        left = r_requests - hit_requests
        p_fail = -np.expm1(-lam * t0)
        failed_rated_k = left * w * p_fail
        held = left * w * (p_fail / lam if lam > 0 else t0)
        up = (hit_requests * age + float(held.sum())) / slots * base_up / (r_requests * t_ring)
        f_rated = float(failed_rated_k.sum()) / slots  # failures: each fails the N in flight
        failed_k = hit_requests * hit_share + failed_rated_k
        # the N admitted after each failure restart the ring together (a cold wave)
        up += (hits + f_rated) * float((w * cold_excess).sum())
    failed = float(failed_k.sum())
    downtime = down + f_rated * d_rated
    makespan = up + downtime
    finished_k = r_requests * w - failed_k
    finished = r_requests - failed
    hits_all = hits + f_rated
    # a failed request produced 1 + c tokens if it had its first token; with fail, the N
    # admitted after each failure spend their cold first wave in prefill (a share of them)
    cold_share = min(hits_all * slots / r_requests, 1.0) if not failover else 0.0
    had_token = decode / (t0 + cold_share * cold_excess)
    produced = float((finished_k * (m + 1)).sum() + (failed_k * had_token * (1.0 + m / 2.0)).sum())
    out = {
        "throughput_tokens_per_s": 1e3 * produced / makespan,
        "goodput_tokens_per_s": 1e3 * float((finished_k * (m + 1)).sum()) / makespan,
        "failed_requests": failed,
        "availability": 1.0 - downtime / makespan,
    }
    d_mean = downtime / hits_all if hits_all else 0.0
    tokens = per_kind("tokens_per_s")
    if failover and hits_all:
        # failures in a request's decode: Poisson with the mean of hits per request of its
        # kind; a hit costs the downtime, the lost lap and the re-prefill, which the failures
        # during it restart (the renewal of the up time above: e^(lambda r) downtimes and
        # (e^(lambda r) - 1) / lambda of ring time), so only the failures outside re-prefills
        # count as hits here (F_fix + lambda W of the F_fix + lambda U)
        primary = hits + lam * base_up
        hits_per_request = primary * slots * hit_share / (r_requests * w)
        growth = lam * reprefill  # the failures during a re-prefill restart it
        redone = np.expm1(growth) / lam if lam > 0 else reprefill
        cost = d_mean * np.exp(growth) + elapsed_lap + redone
        k = np.arange(K_MAX)
        rates = np.empty(len(kinds))
        for i in range(len(kinds)):
            pk = poisson_weights(hits_per_request[i] * in_decode[i])
            rate = 1e3 * m[i] / (decode[i] + k * cost[i])
            rate[0] = tokens[i]
            rates[i] = float((pk * rate).sum() / pk.sum())
        out["tokens_per_s"] = float((w * rates).sum())
        pre = hits_per_request * (1.0 - in_decode)
        # micro-batches: a prompt hit re-prefills last in its micro-batch's wave, and the
        # replacements admitted during the wave wait for the rest of it: a member resumes at
        # u W (u uniform) and finishes within the wave with probability W (1 - u) / decode,
        # its replacement then waiting W (1 - u) / 2: N W^2 / (6 decode) a failure in all
        lost_prefill = np.where(wave_ms > 0, wave_ms, p0 / 2.0)
        behind = hits_per_request * wave_ms**2 / (6.0 * decode)
        hit = d_mean * np.exp(growth) + lost_prefill + redone - reprefill
        out["ttft_ms_mean"] = float((w * (ttft + pre * hit + behind)).sum())
    elif not failover and finished > 0 and hits_all:
        # the request admitted at a failure waits the downtime; it finishes with 1 - F / R
        waited = min(hits_all * slots, r_requests) * (1.0 - failed / r_requests)
        # the N admitted at the outage's end enter together (a cold wave)
        cold = float((w * cold_excess).sum())
        out["ttft_ms_mean"] = float((w * ttft).sum()) + waited * (d_mean + cold) / finished
    details = {
        "failures": hits_all,
        "failures_per_request": hits_all * slots / r_requests,
        "fixed_failures": hits,
        "rated_failures": f_rated,
        "makespan_ms": makespan,
        "downtime_ms": downtime,
        "added_ring_ms_per_failover": x if failover else 0.0,
        "failed_request_age_ms": 0.0 if failover else age,
    }
    if len(kinds) > 1:
        details["hit_share_by_kind"] = [float(v) for v in hit_share]
    return FaultAnswer(out, undefined, details)

"""What a user of a serving system asks of one scenario (scalar): TTFT and end-to-end
percentiles, queueing delay, SLO attainment and goodput, from the mean metrics of the model that
covers the scenario (:mod:`wansim.analytical.engine`).

Model and assumptions:

- **TTFT** of one request alone is the prefill: the P stages' compute of ``prompt_tokens``
  (deterministic) plus the P - 1 forward hops carrying its activations (propagation, jitter,
  losses: the same discretised convolution as a lap, :func:`wansim.analytical.distribution.
  lap_distribution`). Under load (concurrency, batching, a queue for memory) the distribution
  is shifted so that its mean is the model's ``ttft_ms_mean``: the waits move it, their own
  spread is not modelled (so TTFT tails under load carry no measured band).
- **Decode time** of a request given its difficulty node z is normal (renewal CLT, as the
  TPOT percentiles: :mod:`wansim.analytical.distribution`) with mean E[N_z] T and variance
  T^2 Var N_z + E[N_z] Var T; under load every node's mean and sd are scaled so that the
  mixture's mean is M ``tpot_ms_mean`` (the stretch the engine applies to TPOT).
- **End-to-end latency** = TTFT + decode time, the two independent (the prefill's hops and
  the decode laps draw their own jitter); percentiles of the sum by root finding on its CDF.
- **Queueing delay**: the model's ``queue_ms_mean`` (0 without a queue); its p99 the model's
  ``queue_ms_p99`` where it gives one, else 0.
- **SLO**: attainment = P(TTFT <= ttft_ms) P(TPOT <= tpot_ms) (independent, as above); goodput
  = attainment x requests per second (throughput / output tokens per request).
"""

from __future__ import annotations

import numpy as np

from wansim.analytical.distribution import lap_distribution, quantiles
from wansim.links.wire_bytes import forward_bytes
from wansim.numerics import normal_functions as nf
from wansim.stages import slowdown
from wansim.stages.compute import stage_ms_each

TTFT_ATOMS = 256  # the TTFT distribution is coarsened to this many atoms for the sum


def ttft_distribution(scenario, ttft_mean_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """(values ms, probabilities) of a request's TTFT (module docstring), mean ``ttft_mean_ms``."""
    prompt = scenario.workload.prompt_tokens
    each = [float(np.asarray(x)) for x in stage_ms_each(scenario, prompt, mean=False)]
    compute, stage_terms = slowdown.lap_terms(scenario.model, each)  # noise, stragglers
    hops = list(scenario.resolved_hops())[:-1]
    p = len(hops) + 1
    payload, hidden = scenario.payload, scenario.model.hidden_size
    sizes = [float(forward_bytes(payload, hidden, prompt, h, p)) for h in range(p - 1)]
    values, pmf, _ = lap_distribution(hops, sizes, compute, stage_terms)
    values = values + (ttft_mean_ms - float(values @ pmf))
    return _coarsen(values, pmf)


def _coarsen(values: np.ndarray, pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most ``TTFT_ATOMS`` atoms: consecutive bins merged at their mean (mean kept)."""
    if len(values) <= TTFT_ATOMS:
        return values, pmf
    group = np.arange(len(values)) * TTFT_ATOMS // len(values)
    mass = np.bincount(group, weights=pmf)
    centre = np.bincount(group, weights=pmf * values) / np.maximum(mass, 1e-300)
    keep = mass > 0
    return centre[keep], mass[keep]


def decode_mixture(scenario, means: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, mean ms, sd ms) of a request's decode time over the difficulty nodes, scaled
    to the loaded TPOT (module docstring)."""
    from wansim.analytical.blocks import block_schedule
    from wansim.analytical.sync import passes_per_node
    from wansim.speculation.block_schedule import uses_blocks

    m = float(scenario.workload.output_tokens - 1)
    if uses_blocks(scenario):
        chains = block_schedule(scenario).chains
        w = np.asarray(chains.weights[0], dtype=float)
        mean = np.asarray(chains.decode_node_ms[0], dtype=float)
        sd = np.sqrt(np.maximum(np.asarray(chains.decode_node_var[0], dtype=float), 0.0))
    else:
        w, n_mean, n_var = passes_per_node(scenario)
        lap = float(means["lap_ms_mean"])
        lap_var = float(means.get("lap_ms_var", 0.0))
        mean = n_mean * lap
        sd = np.sqrt(np.maximum(lap**2 * n_var + n_mean * lap_var, 0.0))
    scale = m * float(means["tpot_ms_mean"]) / max(float(w @ mean), 1e-300)
    return w, mean * scale, sd * scale


def sum_quantiles(atoms, mass, w, mean, sd, qs) -> np.ndarray:
    """Quantiles of X + Y, X discrete (``atoms``, ``mass``), Y ~ sum_i w_i N(mean_i, sd_i^2)
    independent of X."""
    from wansim.numerics.brentq import (
        brentq,
    )  # scipy.optimize.brentq to the bit, without its import

    sd = np.maximum(sd, 1e-12 * np.maximum(1.0, np.abs(mean)))
    loc = atoms[:, None] + mean[None, :]
    weight = mass[:, None] * w[None, :]

    def cdf(x: float) -> float:
        return float((weight * nf.norm_cdf((x - loc) / sd[None, :])).sum())

    lo = float((loc - 12 * sd).min())
    hi = float((loc + 12 * sd).max())

    def quantile(q: float) -> float:
        # 12 sd below the float resolution of X (an atom of ~1e7 ms, sd ~0): the bounds
        # coincide and bracket no sign change; the quantile is then the bound itself
        if cdf(lo) >= q:
            return lo
        if cdf(hi) <= q:
            return hi
        return brentq(lambda x: cdf(x) - q, lo, hi, xtol=1e-9)

    return np.array([quantile(q) for q in qs])


def serving_metrics(scenario, means: dict) -> dict[str, float]:
    """TTFT p50/p99, e2e p50/p99, queueing delay, SLO attainment and goodput (module
    docstring) from the model's mean metrics ``means`` (scalars)."""
    wl = scenario.workload
    m = float(wl.output_tokens - 1)
    atoms, mass = ttft_distribution(scenario, float(means["ttft_ms_mean"]))
    ttft_p50, ttft_p99 = quantiles_of_atoms(atoms, mass, [0.5, 0.99])
    w, mean, sd = decode_mixture(scenario, means)
    e2e_p50, e2e_p99 = sum_quantiles(atoms, mass, w, mean, sd, [0.5, 0.99])
    attain = 1.0
    if wl.slo.ttft_ms is not None:
        attain *= float(mass[atoms <= wl.slo.ttft_ms].sum())
    if wl.slo.tpot_ms is not None:
        z = (wl.slo.tpot_ms * m - mean) / np.maximum(sd, 1e-12)
        attain *= float(w @ nf.norm_cdf(z))
    requests_per_s = float(means["throughput_tokens_per_s"]) / float(wl.output_tokens)
    return {
        "ttft_ms_p50": float(ttft_p50),
        "ttft_ms_p99": float(ttft_p99),
        "e2e_ms_p50": float(e2e_p50),
        "e2e_ms_p99": float(e2e_p99),
        "queue_ms_mean": float(means.get("queue_ms_mean", 0.0)),
        "queue_ms_p99": float(means.get("queue_ms_p99", 0.0)),
        "slo_attainment": min(max(attain, 0.0), 1.0),
        "goodput_requests_per_s": min(max(attain, 0.0), 1.0) * requests_per_s,
    }


def quantiles_of_atoms(atoms: np.ndarray, mass: np.ndarray, qs) -> np.ndarray:
    """Quantiles of a discrete distribution on sorted atoms (the smallest atom whose cumulative
    mass reaches q); one atom: its value."""
    if len(atoms) > 1 and np.allclose(np.diff(atoms), atoms[1] - atoms[0]):
        return quantiles(atoms, mass, qs)
    cum = np.cumsum(mass)
    return np.array([atoms[min(int(np.searchsorted(cum, q - 1e-12)), len(atoms) - 1)] for q in qs])

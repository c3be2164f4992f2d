"""Event record -> the metrics of ``wansim.results.metric_names``.

Warm-up rule: none at concurrency 1 (each request runs alone from an idle pipeline). With
concurrency c > 1 the first c requests (ids 0..c-1, which start into an empty pipeline) are
excluded from the per-request statistics when at least 2c requests were run; otherwise nothing
is excluded.

Per-request statistics (over the measured, i.e. post-warm-up, requests):

- ``tokens_per_s``: mean over requests of M / decode time (decode time = first token to last
  verify = the sum of the request's laps; M = output_tokens - 1);
- ``lap_ms_mean/p50/p99``: over every decode lap of those requests (a lap = time between
  consecutive verify completions of a request, the first from the prefill completion);
- ``tpot_ms_p50/p99``: over requests of decode time / M;
- ``ttft_ms_mean/p50/p99``: arrival (before any admission wait) to the first token;
- ``e2e_ms_p50/p99``: arrival to the last verify (end-to-end latency of a request);
- ``queue_ms_mean/p99``: arrival to admission (the wait for a slot, or for KV memory);
- ``slo_attainment``: the share of measured requests meeting ``workload.slo`` (TTFT <=
  ``ttft_ms`` and TPOT <= ``tpot_ms``; a bound left null always holds);
  ``goodput_requests_per_s``: requests (all of them) meeting it / makespan.

Every percentile has a 95% interval beside it (``<name>_ci95``, method in
:func:`percentile_intervals`): a moving-block bootstrap over the measured requests in completion
order, seeded (same seed, same interval).

Whole-run statistics (every request, every pass):

- ``throughput_tokens_per_s``: all output tokens / makespan (first arrival to last finish);
- ``tau``: decode tokens committed / verify passes;
- ``stage_utilization``: per stage, busy time (compute + drafting on that stage, prefill
  included) / makespan; ``bubble_fraction`` = 1 - mean utilisation;
- ``bytes_per_token``: decode-phase wire bytes on all hops (forward messages of verify passes
  and every return message, retransmitted copies counted: bytes * (1 + G)) / decode tokens;
- ``wasted_token_fraction``: sum over verify passes of (n - committed) / sum of n; with the
  block schedule (async) counted in stage-tokens (a pass of n tokens computed by each of the P
  stages is P n), so cancelled blocks count the stages that computed them:
  (P (verified - committed) + cancelled stage-tokens) / (P verified + cancelled stage-tokens),
  which is the sync formula when nothing was cancelled;
- ``target_exact``: false for typical acceptance (a lossy rule), else true.

``tokens_per_s_ci95`` (method in :func:`rate_interval`, named by :func:`ci_method`):

- with at least ``MIN_REQUESTS_FOR_REQUEST_CI`` (10) measured requests, at concurrency 1 the
  requests are independent replications (each runs alone; the links are idle between
  requests), so a Student-t interval over the per-request rates, corrected for their skewness
  (``wansim.numerics.intervals.skew_corrected_interval``: when prompts differ in difficulty a
  few easy ones run several times faster, and a plain t-interval held the true mean in about
  91% of runs where 95% was meant); at concurrency > 1 requests
  overlap and interact, so batch means: the measured requests in completion order are cut into
  b = min(20, max(2, n // 5)) contiguous batches and the t-interval (b - 1 degrees of freedom)
  is taken over the batch means;
- with fewer requests (one long request, or a handful), batch means over the laps of the run:
  each measured request's laps, in order, are cut into the same number b = min(20, max(2,
  L // 5)) of contiguous batches (L = the fewest laps of any measured request); batch j's
  estimate is the mean over requests of (tokens committed in the request's j-th batch) / (its
  duration); the interval is the point estimate +- t_{b-1} * sd(batch estimates) / sqrt(b).
  Laps of one request are close to independent (acceptance and jitter are drawn afresh each
  pass), so contiguous batches of several laps behave as replications;
- undefined (``None``, with the reason in ``details["ci_method"]``) when a request has fewer
  than two laps;
- a rate is positive, so a lower bound below zero (very few, very noisy batches) is reported
  as 0.
"""

from __future__ import annotations

import numpy as np

from wansim.numerics.intervals import skew_corrected_interval, t_interval
from wansim.results.metric_names import stage_utilization
from wansim.sim.record import RunRecord

MAX_BATCHES = 20


def warmup_requests(concurrency: int, requests: int) -> int:
    """Requests excluded from the per-request statistics (see the module docstring)."""
    if concurrency > 1 and requests >= 2 * concurrency:
        return concurrency
    return 0


def request_rates(record: RunRecord) -> np.ndarray:
    """Tokens/s of every request: M / decode time."""
    return 1e3 * record.decode_tokens / record.decode_ms


def measured_mask(record: RunRecord) -> np.ndarray:
    """The requests the per-request statistics cover: past the warm-up, and finished (a
    request that failed in a fault has no decode rate)."""
    n = len(record.arrival_ms)
    mask = np.arange(n) >= warmup_requests(record.concurrency, n)
    if record.failed.any():
        mask &= ~record.failed
    return mask


MIN_REQUESTS_FOR_REQUEST_CI = 10
UNDEFINED_CI = "undefined: a request has fewer than two laps (no spread to estimate)"
NO_FINISHED = "undefined: no request finished (every one failed in a fault)"
REQUEST_CI = "skewness-corrected t-interval over requests"


def ci_method(record: RunRecord) -> str:
    """The method :func:`rate_interval` uses for this run (module docstring)."""
    mask = measured_mask(record)
    if not mask.any():
        return NO_FINISHED
    if mask.sum() >= MIN_REQUESTS_FOR_REQUEST_CI:
        if record.concurrency == 1:
            return REQUEST_CI
        return "batch means over requests"
    laps = np.bincount(record.lap_request, minlength=len(mask))[mask]
    return "batch means over laps" if laps.min() >= 2 else UNDEFINED_CI


def rate_interval(record: RunRecord, level: float = 0.95) -> tuple[float, float]:
    """Confidence interval of ``tokens_per_s`` at ``level`` (module docstring: the method);
    NaN when undefined, the lower bound never below 0."""
    method = ci_method(record)
    mask = measured_mask(record)
    if method == REQUEST_CI:
        low, high = skew_corrected_interval(request_rates(record)[mask], level)
    elif method == "batch means over requests":
        order = np.argsort(record.finish_ms[mask], kind="stable")
        low, high = batch_means_interval(request_rates(record)[mask][order], level)
    elif method == "batch means over laps":
        low, high = lap_batch_means_interval(record, mask, level)
    else:
        return float("nan"), float("nan")
    return max(low, 0.0), high


def batch_means_interval(ordered: np.ndarray, level: float) -> tuple[float, float]:
    """Batch means over values in completion order, centred on the mean of all values."""
    n = len(ordered)
    if n < 4:
        return float("nan"), float("nan")
    b = min(MAX_BATCHES, max(2, n // 5))
    means = np.array([chunk.mean() for chunk in np.array_split(ordered, b)])
    return t_interval(means, level, centre=float(np.mean(ordered)))


def lap_batch_means_interval(
    record: RunRecord, mask: np.ndarray, level: float
) -> tuple[float, float]:
    """Batch means over each measured request's laps (module docstring), centred on
    ``tokens_per_s``. Laps can take 0 ms (several blocks of a request verified in one pass):
    a batch of such laps only has no rate, so b shrinks until every batch has a duration;
    NaN if even two batches cannot."""
    ids = np.flatnonzero(mask)
    per_request = [np.flatnonzero(record.lap_request == i) for i in ids]
    for b in range(min(MAX_BATCHES, max(2, min(len(x) for x in per_request) // 5)), 1, -1):
        tokens = np.zeros((len(ids), b))
        ms = np.zeros((len(ids), b))
        for r, laps in enumerate(per_request):
            for j, chunk in enumerate(np.array_split(laps, b)):
                tokens[r, j] = record.lap_tokens[chunk].sum()
                ms[r, j] = record.laps_ms[chunk].sum()
        if (ms > 0).all():
            break
    else:
        return float("nan"), float("nan")
    estimates = (1e3 * tokens / ms).mean(axis=0)
    return t_interval(estimates, level, centre=float(request_rates(record)[mask].mean()))


def wasted_fraction(record: RunRecord) -> float:
    """Verified-but-rejected plus cancelled tokens over all processed (module docstring)."""
    if not record.cancelled_stage_tokens:
        return 1.0 - record.tokens_committed / record.tokens_verified
    p = len(record.stage_busy_ms)
    processed = p * record.tokens_verified + record.cancelled_stage_tokens
    return 1.0 - p * record.tokens_committed / processed


BOOTSTRAP_RESAMPLES = 400
BOOTSTRAP_STREAM = 15  # the bootstrap's generator: default_rng([seed, BOOTSTRAP_STREAM])
PERCENTILE_CI_METHOD = (
    "moving-block bootstrap over measured requests in completion order"
    f" ({BOOTSTRAP_RESAMPLES} resamples, percentile interval)"
)
UNDEFINED_PERCENTILE_CI = "undefined: fewer than two measured requests (no spread to resample)"
UNBOUNDED_PERCENTILE_CI = (
    "a side is null: too few values to bound the percentile there (n values bound a p99 from"
    " above at 95% only if 0.99^n <= 2.5%, i.e. n >= 368: the sample's maximum may lie below it)"
)
PERCENTILES = (0.5, 0.99)


def weighted_quantile(sorted_values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``weights`` (resamples x values, aligned with ``sorted_values``): the
    smallest value whose cumulative weight reaches ``q`` of the row's total."""
    cum = np.cumsum(weights, axis=1)
    idx = np.argmax(cum >= q * cum[:, -1:] - 1e-9, axis=1)
    return sorted_values[idx]


BLOCK_TABLE_ENTRIES = 4_000_000  # bounds the (owners x blocks) table of owner_quantiles
CHUNK_ENTRIES = 1_000_000  # bounds the (resamples x values) work arrays, chunked by resamples


def owner_quantiles(
    sorted_values: np.ndarray, owner: np.ndarray, counts: np.ndarray, qs
) -> list[np.ndarray]:
    """:func:`weighted_quantile` of ``sorted_values`` with weights ``counts[:, owner]`` for each
    q in ``qs``: the same indices without the (resamples x values) weight matrix.

    Weights are whole counts, so every cumulative sum is an exact integer whatever the order of
    the additions. The values are cut into blocks (of at least 64 values, as many as a table
    of ``BLOCK_TABLE_ENTRIES`` allows: the gather of the second step, not the product, is the
    costly part); each owner's number of values per block (a table) times the
    counts gives each block's weight per resample (exact), their running sum finds the block
    where the threshold ``q * total - 1e-9`` is first reached, and only that block's weights
    are summed value by value, a chunk of resamples at a time. Same threshold, same first
    index."""
    n_values = len(sorted_values)
    resamples, owners = counts.shape
    n_blocks = max(1, min(n_values // 64, BLOCK_TABLE_ENTRIES // max(owners, 1)))
    width = -(-n_values // n_blocks)
    n_blocks = -(-n_values // width)
    block_of = np.arange(n_values) // width
    table = np.bincount(  # float counts (weights of one): no integer copy of the table
        owner * n_blocks + block_of, weights=np.ones(n_values), minlength=owners * n_blocks
    ).reshape(owners, n_blocks)
    # in float64, a chunk of owners at a time (whole numbers: the partial sums add exactly;
    # OpenBLAS is slow on a few rows times many owners, fast on all rows times a few owners)
    block_weights = np.zeros((resamples, n_blocks))
    step = max(1, CHUNK_ENTRIES // max(resamples, 1))
    for lo in range(0, owners, step):
        block_weights += counts[:, lo : lo + step].astype(float) @ table[lo : lo + step]
    cum_blocks = np.cumsum(block_weights, axis=1)
    total = cum_blocks[:, -1:]
    step = max(1, CHUNK_ENTRIES // width)
    out = []
    for q in qs:
        threshold = q * total - 1e-9
        b = np.argmax(cum_blocks >= threshold, axis=1)
        picked = np.empty(resamples, dtype=np.int64)
        for lo in range(0, resamples, step):
            rows = np.arange(lo, min(lo + step, resamples))
            bb = b[rows]
            before = np.where(bb > 0, cum_blocks[rows, np.maximum(bb - 1, 0)], 0.0)
            idx = bb[:, None] * width + np.arange(width)
            inside = idx < n_values
            idx = np.minimum(idx, n_values - 1)
            w = np.where(inside, counts[rows[:, None], owner[idx]].astype(float), 0.0)
            cum = before[:, None] + np.cumsum(w, axis=1)
            picked[rows] = bb * width + np.argmax(cum >= threshold[rows], axis=1)
        out.append(sorted_values[picked])
    return out


def resample_counts(
    order: np.ndarray, rng: np.random.Generator, resamples: int, block: int, total: int
) -> np.ndarray:
    """(resamples, total): how often each request id is in each resample. A resample is
    ceil(n / ``block``) blocks of ``block`` consecutive entries of ``order`` (starts uniform
    from ``rng``, one row of starts per resample), cut to n = len(order). Drawn and counted a
    chunk of resamples at a time: the generator gives the same starts as one draw of all rows
    (its 32-bit buffer lives in its state; tested). Counts are whole numbers <= n <= 2^24:
    exact in float32, which halves the largest array of the bootstrap."""
    n = len(order)
    blocks = -(-n // block)
    counts = np.empty((resamples, total), dtype=np.float32)
    step = max(1, CHUNK_ENTRIES // max(n, 1))
    for lo in range(0, resamples, step):
        m = min(step, resamples - lo)
        starts = rng.integers(0, n - block + 1, size=(m, blocks))
        picks = (starts[:, :, None] + np.arange(block)).reshape(m, -1)[:, :n]
        ids = order[picks] + (np.arange(m) * total)[:, None]
        counts[lo : lo + m] = np.bincount(ids.ravel(), minlength=m * total).reshape(m, total)
    return counts


def percentile_intervals(
    per_request: dict[str, np.ndarray],
    per_lap: dict[str, tuple[np.ndarray, np.ndarray]],
    order: np.ndarray,
    block: int,
    seed: int,
    level: float = 0.95,
) -> dict[str, list[float] | None]:
    """95% intervals of the p50 and p99 of each series (name -> ``name_p50_ci95``, ...).

    Moving-block bootstrap: ``order`` lists the measured requests (ids) in completion order;
    a resample concatenates n / ``block`` blocks of ``block`` consecutive requests (starts
    uniform), so requests that overlapped in the pipe (correlated) stay together; ``block`` is
    1 where requests run alone (independent). ``per_request``: one value per request id;
    ``per_lap``: (values, request id of each value), a request's values resampled with it. The
    interval is the (1 - level)/2 and (1 + level)/2 quantiles of the resampled percentile (the
    percentile interval). ``BOOTSTRAP_RESAMPLES`` resamples from
    ``default_rng([seed, BOOTSTRAP_STREAM])``: deterministic. Fewer than two measured
    requests: every interval is None."""
    names = [f"{k}_p{round(100 * q)}_ci95" for k in (*per_request, *per_lap) for q in PERCENTILES]
    n = len(order)
    if n < 2:
        return dict.fromkeys(names)
    block = max(1, min(block, n))
    rng = np.random.default_rng([seed, BOOTSTRAP_STREAM])
    total = int(max(order.max(), *(r.max() for _, r in per_lap.values()), 0)) + 1
    counts = resample_counts(order, rng, BOOTSTRAP_RESAMPLES, block, total)
    tails = [(1 - level) / 2, (1 + level) / 2]
    out: dict[str, list[float] | None] = {}
    series = {k: (v[order], order) for k, v in per_request.items()} | per_lap
    for name, (values, owner) in series.items():
        sort = np.argsort(values, kind="stable")
        values, owner = values[sort], owner[sort]
        stats = owner_quantiles(values, owner, counts, PERCENTILES)
        for q, resampled in zip(PERCENTILES, stats, strict=True):
            low, high = np.quantile(resampled, tails)
            out[f"{name}_p{round(100 * q)}_ci95"] = bounded_sides(
                float(low), float(high), q, len(values), tails[0]
            )
    return out


def bounded_sides(low: float, high: float, q: float, n: int, tail: float) -> list:
    """[low, high] with a side set to None where n values cannot bound the q-quantile there
    (distribution-free: the sample's maximum lies below the q-quantile with probability q^n,
    its minimum above it with (1 - q)^n; where that exceeds ``tail`` no order statistic of
    the sample is a bound at that level, and a resampled quantile, which never passes the
    sample's extremes, would claim one). A p99 needs 368 values for an upper bound at 95%, a
    p50 6 values for either side."""
    high_ok = q**n <= tail
    low_ok = (1.0 - q) ** n < tail
    return [low if low_ok else None, high if high_ok else None]


def meets_slo(record: RunRecord, slo) -> np.ndarray:
    """Per request: TTFT and TPOT within ``slo`` (a None bound always holds)."""
    ok = np.ones(len(record.arrival_ms), dtype=bool)
    if slo is not None and slo.ttft_ms is not None:
        ok &= record.first_token_ms - record.arrival_ms <= slo.ttft_ms
    if slo is not None and slo.tpot_ms is not None:
        ok &= record.decode_ms / record.decode_tokens <= slo.tpot_ms
    return ok


def compute_metrics(record: RunRecord, slo=None, seed: int = 0) -> dict:
    """The metrics of the module docstring; ``slo``: ``workload.slo`` (None: no bounds);
    ``seed``: the bootstrap's."""
    mask = measured_mask(record)
    if not mask.any():  # every request failed in a fault: no per-request statistic
        return _all_failed(record, seed)
    rates = request_rates(record)[mask]
    laps = record.laps_ms[mask[record.lap_request]]
    tpot = (record.decode_ms / record.decode_tokens)[mask]
    ttft = (record.first_token_ms - record.arrival_ms)[mask]
    makespan = record.makespan_ms
    utilisation = np.asarray(stage_utilization(record.stage_busy_ms, makespan))
    low, high = rate_interval(record)
    interval = None if np.isnan(low) else [low, high]
    lap_p50, lap_p99 = np.quantile(laps, [0.5, 0.99])
    tpot_p50, tpot_p99 = np.quantile(tpot, [0.5, 0.99])
    e2e_all = record.finish_ms - record.arrival_ms
    queue_all = record.admitted_ms - record.arrival_ms
    e2e, queue = e2e_all[mask], queue_all[mask]
    ids = np.flatnonzero(mask)
    order = ids[np.argsort(record.finish_ms[mask], kind="stable")]
    n_measured = len(ids)
    block = 1 if record.concurrency == 1 else -(-n_measured // MAX_BATCHES)
    intervals = percentile_intervals(
        {
            "tpot_ms": record.decode_ms / record.decode_tokens,
            "ttft_ms": record.first_token_ms - record.arrival_ms,
            "e2e_ms": e2e_all,
            "queue_ms": queue_all,
        },
        {"lap_ms": (record.laps_ms, record.lap_request)},
        order,
        block,
        seed,
    )
    ok = meets_slo(record, slo) & ~failed_mask(record)
    out = {
        "tokens_per_s": float(rates.mean()),
        "throughput_tokens_per_s": 1e3 * record.output_tokens / makespan,
        "tau": record.tokens_committed / record.verify_passes,
        "lap_ms_mean": float(laps.mean()),
        "lap_ms_p50": float(lap_p50),
        "lap_ms_p99": float(lap_p99),
        "tpot_ms_p50": float(tpot_p50),
        "tpot_ms_p99": float(tpot_p99),
        "ttft_ms_mean": float(ttft.mean()),
        "ttft_ms_p50": float(np.quantile(ttft, 0.5)),
        "ttft_ms_p99": float(np.quantile(ttft, 0.99)),
        "e2e_ms_p50": float(np.quantile(e2e, 0.5)),
        "e2e_ms_p99": float(np.quantile(e2e, 0.99)),
        "queue_ms_mean": float(queue.mean()),
        "queue_ms_p99": float(np.quantile(queue, 0.99)),
        "slo_attainment": float(ok[mask].mean()),
        "goodput_requests_per_s": 1e3 * float(ok.sum()) / makespan,
        "bubble_fraction": float(1.0 - utilisation.mean()),
        "stage_utilization": [float(u) for u in utilisation],
        "bytes_per_token": float(record.link_bytes_decode.sum() / record.tokens_committed),
        "wasted_token_fraction": wasted_fraction(record),
        "target_exact": record.target_exact,
        "tokens_per_s_ci95": interval,
        **intervals,
    }
    if record.faults is not None:
        out.update(fault_metrics(record))
    return out


def failed_mask(record: RunRecord) -> np.ndarray:
    """Per request: failed in a fault (all False without faults)."""
    n = len(record.arrival_ms)
    return record.failed if len(record.failed) == n else np.zeros(n, dtype=bool)


def _all_failed(record: RunRecord, seed: int) -> dict:
    makespan = record.makespan_ms
    utilisation = np.asarray(stage_utilization(record.stage_busy_ms, makespan))
    passes = record.verify_passes
    out = dict.fromkeys(PER_REQUEST)
    empty = np.zeros(0, dtype=np.int64)
    series = ("tpot_ms", "ttft_ms", "e2e_ms", "queue_ms")
    out.update(
        percentile_intervals({k: empty for k in series}, {"lap_ms": (empty, empty)}, empty, 1, seed)
    )
    out.update(
        {
            "goodput_requests_per_s": 0.0,
            "tau": record.tokens_committed / passes if passes else None,
            "bubble_fraction": float(1.0 - utilisation.mean()),
            "stage_utilization": [float(u) for u in utilisation],
            "bytes_per_token": float(record.link_bytes_decode.sum() / record.tokens_committed)
            if record.tokens_committed
            else None,
            "wasted_token_fraction": wasted_fraction(record) if record.tokens_verified else None,
            "target_exact": record.target_exact,
            "tokens_per_s_ci95": None,
        }
    )
    out.update(fault_metrics(record))
    return out


PER_REQUEST = ("tokens_per_s", "lap_ms_mean", "lap_ms_p50", "lap_ms_p99")
PER_REQUEST += ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99")
PER_REQUEST += ("e2e_ms_p50", "e2e_ms_p99", "queue_ms_mean", "queue_ms_p99", "slo_attainment")


def fault_metrics(record: RunRecord) -> dict:
    """With faults: ``goodput_tokens_per_s`` (output tokens of the requests that finished /
    makespan), ``failed_requests``, ``availability`` (1 - the ring's outage time within the
    run / makespan); ``throughput_tokens_per_s`` counts what failed requests produced before
    they failed (their first token and committed tokens)."""
    makespan = record.makespan_ms
    ok = ~record.failed
    finished = float((record.decode_tokens[ok] + 1).sum())
    started = np.isfinite(record.first_token_ms)
    produced = finished + float((record.committed + started)[record.failed].sum())
    end = float(record.finish_ms.max())
    return {
        "throughput_tokens_per_s": 1e3 * produced / makespan,
        "goodput_tokens_per_s": 1e3 * finished / makespan,
        "failed_requests": int(record.failed.sum()),
        "availability": 1.0 - record.faults.down_ms(end) / makespan,
    }

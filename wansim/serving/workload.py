"""Requests as a workload describes them: arrival times, prompt and output lengths, and the
acceptance row (profile workload) of each request. One plan of the run's requests serves the
DES (drawn once, before the run) and the analytical engine (the same distributions, as nodes).

Arrivals (``workload.arrival``):

- ``closed``: ``concurrency`` users; a request arrives when the user's previous one ends;
- ``poisson``: exponential gaps of mean 1 / ``rate_per_s``;
- ``gamma``: gamma gaps of mean 1 / ``rate_per_s`` and coefficient of variation
  ``arrival_cv`` (shape 1 / cv^2: cv > 1 is burstier than Poisson, cv < 1 smoother; cv = 1 is
  Poisson);
- ``onoff``: Poisson at ``rate_per_s`` while on, nothing while off; on and off periods are
  exponential with means ``on_ms`` and ``off_ms``, starting on (a Markov-modulated Poisson
  process; long-run rate ``rate_per_s`` on / (on + off));
- ``trace``: the ``arrival_ms`` column of ``workload.trace``, relative to its first row.

Lengths (``workload.lengths.kind``):

- ``fixed``: ``prompt_tokens`` and ``output_tokens`` for every request;
- ``lognormal``: each request draws prompt ~ LogNormal with mean ``prompt_tokens`` and
  coefficient of variation ``lengths.prompt_cv``, output likewise (``output_cv``),
  independently; rounded, and clipped to [1, ``max_prompt_tokens``] and [2,
  ``max_output_tokens``];
- ``empirical``: (prompt, output) pairs drawn with replacement from the rows of
  ``workload.trace`` (the trace's joint length distribution, arrivals ignored);
- ``trace``: the trace's rows in order, request i takes row i.

Mix (``workload.mix``: rows ``{workload, share}``): each request draws a profile workload row
(math, code, chat, ...) with those shares; its acceptance is that row's.

Random numbers come from the arrival stream (the DES's stream 2), in this order, each drawn
only when used: the gaps, the prompt lengths, the output lengths, the pair indices, the mix rows.
A fixed workload draws nothing beyond the Poisson gaps (runs from before these fields are
unchanged).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from wansim.errors import ScenarioError

TRACE_COLUMNS = ("arrival_ms", "prompt_tokens", "output_tokens")
MAX_TRACE_ROWS = 1_000_000
MAX_TRACE_TOKENS = 10_000_000  # a row's prompt or output
CELL_EDGES = (1 / 3, 2 / 3, 0.95)  # quantiles cutting a trace's lengths into nodes


@dataclasses.dataclass(frozen=True)
class RequestPlan:
    """Every request of a run, drawn before it starts (index = request id)."""

    gaps_ms: np.ndarray | None  # open arrivals: the gap before each arrival; None when closed
    prompt_tokens: np.ndarray  # int
    output_tokens: np.ndarray  # int, >= 2
    row: np.ndarray  # index into ``rows`` (the mix), 0 without one
    rows: tuple[str | None, ...]  # profile workload of each mix row (None: the scenario's own)


@dataclasses.dataclass(frozen=True)
class Trace:
    """A request trace: arrival times (ms, non-decreasing; may be absent), prompt and output
    tokens per row."""

    arrival_ms: np.ndarray | None
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray


@functools.lru_cache(maxsize=16)
def read_trace(path: str, field: str = "workload.trace") -> Trace:
    """A CSV (``#`` comment lines allowed) or Parquet (``.parquet``) file with columns
    ``prompt_tokens``, ``output_tokens`` and optionally ``arrival_ms``. Bad content is one line
    naming the field, the row and the value: lengths must be whole numbers (prompt >= 1,
    output >= 2), times finite, >= 0 and sorted."""
    import pandas as pd

    try:
        if str(path).endswith(".parquet"):
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path, comment="#", skipinitialspace=True)
    except (OSError, ValueError, ImportError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ScenarioError(field, f"cannot read the trace ({why})", os.fspath(path)) from None
    missing = [c for c in TRACE_COLUMNS[1:] if c not in frame.columns]
    if missing:
        raise ScenarioError(
            field,
            f"the trace needs columns {', '.join(TRACE_COLUMNS[1:])} (and arrival_ms for"
            f" arrival: trace); missing {', '.join(missing)}",
            os.fspath(path),
        )
    if len(frame) == 0:
        raise ScenarioError(field, "the trace has no rows", os.fspath(path))
    if len(frame) > MAX_TRACE_ROWS:
        raise ScenarioError(field, f"more than {MAX_TRACE_ROWS} rows", len(frame))

    def column(name: str, minimum: float, whole: bool) -> np.ndarray:
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < minimum)
        if whole:
            bad |= values > MAX_TRACE_TOKENS
        if whole:
            bad |= values != np.round(values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = f"a whole number <= {MAX_TRACE_TOKENS:g}" if whole else "a finite number"
            raise ScenarioError(
                f"{field}[row {i + 1}].{name}",
                f"must be {what} >= {minimum:g}",
                frame[name].iloc[i],
            )
        return values

    prompt = column("prompt_tokens", 1, True).astype(np.int64)
    output = column("output_tokens", 2, True).astype(np.int64)
    arrival = None
    if "arrival_ms" in frame.columns:
        arrival = column("arrival_ms", 0, False)
        back = np.flatnonzero(np.diff(arrival) < 0)
        if len(back):
            i = int(back[0]) + 1
            raise ScenarioError(
                f"{field}[row {i + 1}].arrival_ms",
                f"times must be sorted (row {i} is at {arrival[i - 1]:g})",
                arrival[i],
            )
    return Trace(arrival, prompt, output)


def lognormal_lengths(rng, mean: float, cv: float, n: int, low: int, high: int) -> np.ndarray:
    """n lengths ~ LogNormal(mean, cv) rounded and clipped to [low, high] (cv 0: the mean)."""
    if cv <= 0:
        return np.full(n, int(np.clip(round(mean), low, high)), dtype=np.int64)
    s2 = np.log1p(cv * cv)
    mu = np.log(mean) - s2 / 2
    return np.clip(np.rint(rng.lognormal(mu, np.sqrt(s2), n)), low, high).astype(np.int64)


def arrival_gaps_ms(workload, rng, n: int) -> np.ndarray:
    """Gaps before each of n open arrivals (the first from t = 0), module docstring."""
    mean = 1e3 / workload.rate_per_s
    if workload.arrival == "poisson":
        return rng.exponential(mean, n)
    if workload.arrival == "gamma":
        shape = 1.0 / workload.arrival_cv**2
        return rng.gamma(shape, mean / shape, n)
    if workload.arrival == "onoff":
        # Poisson while on: an exponential clock of on-time; off periods inserted whenever the
        # on period in progress runs out (memoryless: drawn lazily, in order)
        on_clock = rng.exponential(mean, n)
        gaps = np.empty(n)
        left = rng.exponential(workload.on_ms)  # on-time left in the current on period
        for i, need in enumerate(on_clock):
            wall = 0.0
            while need > left:
                need -= left
                wall += left + rng.exponential(workload.off_ms)
                left = rng.exponential(workload.on_ms)
            left -= need
            gaps[i] = wall + need
        return gaps
    raise ValueError(workload.arrival)


def plan_requests(workload, rng: np.random.Generator) -> RequestPlan:
    """The run's requests (module docstring), from the arrival stream ``rng``."""
    n = workload.requests
    lengths = workload.lengths
    gaps = None
    if workload.arrival == "trace":
        times = read_trace(workload.trace).arrival_ms[:n]
        gaps = np.diff(times, prepend=times[0])
    elif workload.arrival != "closed":
        gaps = arrival_gaps_ms(workload, rng, n)
    if lengths.kind == "fixed":
        prompt = np.full(n, workload.prompt_tokens, dtype=np.int64)
        output = np.full(n, workload.output_tokens, dtype=np.int64)
    elif lengths.kind == "lognormal":
        prompt = lognormal_lengths(
            rng, workload.prompt_tokens, lengths.prompt_cv, n, 1, lengths.max_prompt_tokens
        )
        output = lognormal_lengths(
            rng, workload.output_tokens, lengths.output_cv, n, 2, lengths.max_output_tokens
        )
    else:
        trace = read_trace(workload.trace)
        rows = (
            np.arange(n)
            if lengths.kind == "trace"
            else rng.integers(0, len(trace.prompt_tokens), n)
        )
        prompt, output = trace.prompt_tokens[rows], trace.output_tokens[rows]
    mix_rows: tuple[str | None, ...] = (None,)
    row = np.zeros(n, dtype=np.int64)
    if workload.mix:
        mix_rows = tuple(r.workload for r in workload.mix)
        shares = np.array([r.share for r in workload.mix], dtype=float)
        row = rng.choice(len(shares), n, p=shares / shares.sum())
    return RequestPlan(gaps, prompt, output, row, mix_rows)


def length_nodes(workload, points: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, prompt tokens, output tokens) of nodes standing for the length distribution
    in expectations (the analytical engine): fixed: one node; lognormal: ``points`` x
    ``points`` Gauss-Hermite nodes in log space (prompt and output independent), rounded and
    clipped as the draws are; trace/empirical: the trace's first ``requests`` rows (trace) or
    all its rows (empirical) grouped into at most 16 cells by the quantiles ``CELL_EDGES`` of
    prompt and output (finer in the upper tail, where the p99s come from), each cell at its
    mean lengths."""
    lengths = workload.lengths
    if lengths.kind == "fixed":
        return np.ones(1), np.array([workload.prompt_tokens]), np.array([workload.output_tokens])
    if lengths.kind == "lognormal":

        def nodes(mean, cv, low, high):
            if cv <= 0:
                return np.ones(1), np.array([float(np.clip(round(mean), low, high))])
            x, w = np.polynomial.hermite_e.hermegauss(points)
            s = np.sqrt(np.log1p(cv * cv))
            values = np.clip(np.rint(np.exp(np.log(mean) - s * s / 2 + s * x)), low, high)
            return w / w.sum(), values

        wp, p = nodes(workload.prompt_tokens, lengths.prompt_cv, 1, lengths.max_prompt_tokens)
        wo, o = nodes(workload.output_tokens, lengths.output_cv, 2, lengths.max_output_tokens)
        weight = np.outer(wp, wo).ravel()
        return weight, np.repeat(p, len(o)), np.tile(o, len(p))
    inverse, prompt, output = trace_rows(workload)
    count = np.bincount(inverse).astype(float)
    mean_p = np.rint(np.bincount(inverse, weights=prompt) / count)
    mean_o = np.rint(np.bincount(inverse, weights=output) / count)
    return count / count.sum(), mean_p, mean_o


def trace_rows(workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node of each row, prompt tokens, output tokens) of the rows a trace workload's
    requests take (``trace``: the first ``requests`` rows in order; ``empirical``: all rows,
    drawn with replacement), each row's node being its cell in :func:`length_nodes`."""
    trace = read_trace(workload.trace)
    prompt, output = trace.prompt_tokens.astype(float), trace.output_tokens.astype(float)
    if workload.lengths.kind == "trace":
        prompt, output = prompt[: workload.requests], output[: workload.requests]
    cells = np.zeros(len(prompt), dtype=np.int64)
    for values in (prompt, output):
        edges = np.unique(np.quantile(values, CELL_EDGES))
        cells = cells * (len(CELL_EDGES) + 1) + np.searchsorted(edges, values, side="right")
    _, inverse = np.unique(cells, return_inverse=True)
    return inverse, prompt, output


def check_workload(workload, path: str = "workload") -> None:
    """Cross-field rules of the workload (also what needs the trace file read)."""
    needs_trace = workload.arrival == "trace" or workload.lengths.kind in ("trace", "empirical")
    if needs_trace and workload.trace is None:
        what = (
            "arrival: trace"
            if workload.arrival == "trace"
            else (f"lengths.kind: {workload.lengths.kind}")
        )
        raise ScenarioError(f"{path}.trace", f"{what} needs a trace file (CSV or Parquet)", None)
    if workload.trace is None:
        return
    trace = read_trace(workload.trace, f"{path}.trace")
    rows = len(trace.prompt_tokens)
    if workload.arrival == "trace" and trace.arrival_ms is None:
        raise ScenarioError(
            f"{path}.trace", "arrival: trace needs an arrival_ms column", workload.trace
        )
    in_order = workload.arrival == "trace" or workload.lengths.kind == "trace"
    if in_order and workload.requests > rows:
        raise ScenarioError(
            f"{path}.requests",
            f"the trace has {rows} rows (requests take its rows in order: at most {rows})",
            workload.requests,
        )
    if workload.kv_capacity_tokens is not None and workload.lengths.kind in ("trace", "empirical"):
        from wansim.config.workload import check_fits

        used = slice(0, workload.requests) if workload.lengths.kind == "trace" else slice(None)
        sizes = trace.prompt_tokens[used] + trace.output_tokens[used]
        row = int(np.argmax(sizes))
        check_fits(
            workload.kv_capacity_tokens,
            int(sizes[row]),
            f"the trace's row {row + 1} prompt + output",
            path,
        )

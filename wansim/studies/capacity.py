"""The highest load a configuration sustains under an SLO (``wansim capacity``).

What is searched: with closed arrivals (``workload.arrival: closed``) the number of users,
``workload.concurrency`` (an integer, 1 .. ``max_concurrency``); with open arrivals the request
rate ``workload.rate_per_s``, on the geometric grid r0 (1 + ``RATE_STEP``)^i (r0 the scenario's
rate), so the answer is within ``RATE_STEP`` (2%) of the highest sustained rate on that grid.

How (every metric the engines report may be bounded: :mod:`wansim.studies.constraints`):

1. **Bracketing** from a start point: while the SLO holds, step up by 1, 2, 4, ... grid points
   (so from 1 user: 2, 4, 8, ...); when it fails at the start, step down likewise until it
   holds (none does: the answer is null, with the reason).
2. **Bisection** between the last point that holds and the first that fails, to adjacent grid
   points.
3. **DES confirmation**: the search runs on the analytical engine where it models the scenario
   (closed arrivals, and open ones through :mod:`wansim.analytical.open_arrivals`, never
   validated), then again on the DES starting from the analytical answer (so the DES usually
   runs the answer and its neighbour only); the DES's answer is reported, the analytical one
   beside it. What the analytical engine refuses is searched with the DES alone.

How far the analytical answer is trusted: :func:`_analytical_check` (``analytical_range``,
``analytical_validated``, ``analytical_why``).

Assumption: the SLO metrics worsen monotonically with load (more users or a higher rate), so
the first failure bounds the answer; each DES run is seeded (the scenario's seed), so the
search is deterministic, but near the boundary a DES run's noise can move the answer by a grid
point. A DES run of c users simulates at least ``DES_ROUNDS`` x c requests (the first c, a
cold start, are left out of its per-request statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from wansim.errors import WansimInputError
from wansim.studies.constraints import Bound

RATE_STEP = 0.02
MAX_RATE_STEPS = 800  # r0 (1.02)^+-800: a factor of ~7e6 either way
DES_ROUNDS = 3
DEFAULT_MAX_CONCURRENCY = 1024


def search_index(holds: Callable[[int], bool], start: int, low: int, high: int) -> int | None:
    """The largest i in [low, high] with holds(i), assuming holds is monotone (true then
    false): geometric bracketing from ``start``, then bisection (module docstring). None when
    it fails even at ``low``."""
    seen: dict[int, bool] = {}

    def test(i: int) -> bool:
        if i not in seen:
            seen[i] = holds(i)
        return seen[i]

    step = 1
    if test(start):
        lo = start
        while True:
            i = min(lo + step, high)
            if i == lo:
                return lo
            if not test(i):
                hi = i
                break
            lo, step = i, step * 2
    else:
        hi = start
        while True:
            i = max(hi - step, low)
            if i == hi:
                return None
            if test(i):
                lo = i
                break
            hi, step = i, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if test(mid) else (lo, mid)
    return lo


def capacity(
    path: str,
    bounds: list[Bound],
    *,
    sets: list[str] | None = None,
    engine: str = "auto",
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> dict:
    """The search of the module docstring; returns the JSON-ready answer."""
    import wansim
    from wansim.analytical import check_supported
    from wansim.config.scenario import load_scenario

    sets = list(sets or [])
    base = load_scenario(path, sets)
    closed = base.workload.arrival == "closed"
    if engine not in ("auto", "analytical", "des"):
        raise WansimInputError("--engine", "must be auto, analytical or des", engine)
    analytical_ok = True
    try:
        check_supported(base)
    except WansimInputError:
        analytical_ok = False
    if engine == "analytical" and not analytical_ok:
        raise WansimInputError(
            "--engine",
            "the analytical engine does not model this scenario (a mechanism it refuses): use"
            " --engine des",
            engine,
        )
    engines = {"auto": ["analytical", "des"] if analytical_ok else ["des"]}.get(engine, [engine])

    if closed:
        field = "workload.concurrency"

        def value(i: int) -> int:
            return i

        low, high, start = 1, max_concurrency, 1
    else:
        field = "workload.rate_per_s"
        r0 = base.workload.rate_per_s

        def value(i: int) -> float:
            return r0 * (1.0 + RATE_STEP) ** i

        low, high, start = -MAX_RATE_STEPS, MAX_RATE_STEPS, 0

    log: list[dict] = []
    results: dict[tuple[str, int], dict] = {}

    trust: dict[int, dict] = {}  # the analytical result's approximation per grid index

    def run(name: str, i: int) -> dict:
        key = (name, i)
        if key not in results:
            x = value(i)
            extra = [f"{field}={x!r}"]
            if closed:  # both engines run the same scenario (c users need >= c requests)
                extra.append(f"workload.requests={max(base.workload.requests, DES_ROUNDS * x)}")
            sc = load_scenario(path, sets + extra)
            res = wansim.analyze(sc) if name == "analytical" else wansim.simulate(sc)
            out = res.to_json()
            results[key] = out["metrics"]
            if name == "analytical":
                trust[i] = out.get("approximation") or {}
            ok = all(b.holds(results[key]) for b in bounds)
            log.append({"engine": name, field: x, "holds": ok})
        return results[key]

    answers: dict[str, int | None] = {}
    for name in engines:
        answers[name] = search_index(
            lambda i, name=name: all(b.holds(run(name, i)) for b in bounds), start, low, high
        )
        if answers[name] is not None:
            start = answers[name]
    checked = None
    if "analytical" in engines and answers["analytical"] is not None:
        checked = _analytical_check(answers["analytical"], bounds, run, trust, low, high, value)
    final_engine = engines[-1]
    best = answers[final_engine]
    key = "max_concurrency" if closed else "max_request_rate_per_s"
    out: dict = {
        "scenario": base.name,
        "slo": [str(b) for b in bounds],
        "searched": field,
        key: None if best is None else value(best),
        "engine": final_engine,
        "at": None if best is None else run(final_engine, best),
        "method": "bracketing + bisection"
        + (" (analytical), confirmed by the DES" if len(engines) == 2 else f" ({final_engine})")
        + ("" if closed else f"; rate grid r0 (1 + {RATE_STEP})^i, r0 = {value(0):g}/s"),
        "evaluations": log,
    }
    if len(engines) == 2:
        a = answers["analytical"]
        out["analytical"] = None if a is None else value(a)
    if checked is not None:
        out["analytical_range"], out["analytical_validated"], why = checked
        if why:
            out["analytical_why"] = why
    if best is None:
        lowest = value(low)
        out["reason"] = f"the SLO fails at the lowest {field} searched ({_fmt(lowest)})" + (
            "" if closed else ": no rate is sustainable"
        )
    elif best == high:
        out["at_search_limit"] = (
            f"the SLO still holds at the search's upper end ({field} = {_fmt(value(high))})"
        )
    return out


def metric_band(metric: str, error_band: dict) -> tuple[float, bool]:
    """The documented error (value, relative?) that applies to a bounded metric: the regime's
    band on tokens/s for per-token and per-request times and rates (TPOT, laps, end-to-end,
    tau, bytes), on TTFT for TTFT and the queueing delay, on throughput for throughput and
    goodput, absolute for the bubble and wasted fractions. A tail takes its own band where one
    was measured (``tpot_ms_p99`` with varied lengths: docs/approximations.md), else its
    mean's (an assumption)."""
    if metric in ("bubble_fraction", "wasted_token_fraction"):
        return float(error_band[metric]), False
    if metric in error_band:
        return float(error_band[metric]), True
    if metric.startswith(("ttft_", "queue_")):
        return float(error_band["ttft_ms_mean"]), True
    if metric.startswith(("throughput_", "goodput_")):
        return float(error_band["throughput_tokens_per_s"]), True
    return float(error_band["tokens_per_s"]), True


def widened(bound: Bound, band: float, relative: bool, sign: int) -> Bound:
    """``bound`` loosened (sign +1) or tightened (sign -1) by the band."""
    step = abs(bound.value) * band if relative else band
    up = sign if bound.op == "<=" else -sign
    return Bound(bound.metric, bound.op, bound.value + up * step)


RANGE_RATIO = 1.5  # analytical answers whose band range spans more are not validated


def _analytical_check(answer: int, bounds, run, trust, low, high, value):
    """How far the analytical answer can be trusted: ``analytical_range`` = the answers with
    every bound tightened and loosened by the analytical engine's documented error band for
    its metric (:func:`metric_band`, the band the result at the answer carries), and
    ``analytical_validated``: the results at the answer and one above are validated and the
    range spans at most ``RANGE_RATIO`` (a metric nearly flat in the load, like a TTFT p99 set
    by one prefill, moves the answer by many users within the model's error: on the reference
    ring ``ttft_ms_p99<=1000`` gave 38 users analytically and 16 in the DES, with the two
    engines 2.5% apart on the metric)."""

    def search(sign: int) -> int | None:
        band = trust[answer].get("error_band") or {}
        moved = [widened(b, *metric_band(b.metric, band), sign) for b in bounds] if band else bounds
        return search_index(
            lambda i: all(b.holds(run("analytical", i)) for b in moved), answer, low, high
        )

    lo, hi = search(-1), search(+1)
    near = [trust[i] for i in (answer, answer + 1) if i in trust]
    why = next((t.get("why") or "not validated" for t in near if not t.get("validated")), "")
    if not why:
        why = unmeasured_tail([b.metric for b in bounds], trust[answer])
    if not why and (lo is None or hi is None or value(hi) > RANGE_RATIO * value(lo)):
        why = (
            "the SLO metric changes by less than the analytical engine's error band over this"
            " range of load: the answer rests on differences the model does not resolve"
        )
    rng = [None if lo is None else value(lo), None if hi is None else value(hi)]
    return rng, not why, why


def unmeasured_tail(metrics: list[str], trust: dict) -> str:
    """Why a bound on a tail cannot rest on a validated result of requests that differ
    (an expectation over workload nodes): only the tails in its error band were measured
    (TPOT p99: docs/approximations.md); the others take normals through each node's
    percentiles, a shape no grid measured (TTFT p99 with the shipped trace at 8 users: -46%
    to +58%). '' when every bounded tail was measured, or the requests are alike."""
    if "expectation over" not in str(trust.get("regime", "")):
        return ""
    band = trust.get("error_band") or {}
    for metric in metrics:
        if metric.endswith(("_p50", "_p99")) and metric not in band:
            return (
                f"{metric} with varied request lengths: no band measured for it (measured:"
                f" {', '.join(k for k in band if k.endswith(('_p50', '_p99'))) or 'none'})"
            )
    return ""


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:.4g}" if math.isfinite(x) else str(x)

"""The out-of-sample report: per-cell and per-mechanism errors beside the real run-to-run
spread, strict JSON, a text table, and two PNGs (no torch here).

Per cell: real = mean over its runs; spread = (max - min) / mean over the runs, per metric;
predicted = mean over the rounds' load-matched predictions; error = (predicted - real) / real.
``within_2x_spread``: |error| <= 2 x spread (a prediction cannot be judged better than the
system repeats itself); ``within_2x_timing_spread``: the tokens/s error against twice the spread
of the runs' rate per verify pass (tokens/s / tau: the timing's share, the prompt sample's tau
divided out). Summary: median |error| and the worst (signed) error per engine and
metric over the measured cells, per mechanism, and the bundle-only (no re-profile) errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from wansim.calibrate.workload_sample import cell_band, prompt_seeds, prompts_decoded

METRICS = ("tokens_per_s", "lap_ms_p50", "lap_ms_p99", "tpot_ms_p99")
ENGINES = ("des", "analytical")


def strict(obj):
    """NaN/inf -> None, numpy -> Python, recursively (for ``json.dumps(allow_nan=False)``)."""
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def rel_error(pred, real) -> float | None:
    if pred is None or real is None or not real or not math.isfinite(float(pred)):
        return None
    return (float(pred) - float(real)) / abs(float(real))


def spread(values: list[float]) -> float | None:
    """(max - min) / mean of a cell's runs."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2 or not np.mean(v):
        return None
    return float((max(v) - min(v)) / abs(np.mean(v)))


def chance_beyond_spread(rounds: int, draws: int = 200_000, seed: int = 0) -> float:
    """The chance that an unbiased prediction's error exceeds twice a cell's spread when the
    rounds' values differ only by independent noise of one sd: |mean| > 2 (max - min) over
    ``rounds`` normal draws (Monte Carlo). 2 rounds: 2 atan(1/4) / pi = 0.156, so
    "every cell within twice its spread" fails about one cell in six by chance alone; 4
    rounds: ~0.003. Where the noise is in the error but not in the spread (prompts replayed,
    their sample's deviation shared by every round) the chance is higher still."""
    x = np.random.default_rng(seed).normal(size=(draws, rounds))
    return float(np.mean(np.abs(x.mean(axis=1)) > 2 * np.ptp(x, axis=1)))


def _pass_rate(run: dict) -> float | None:
    tokens, tau = run.get("tokens_per_s"), run.get("tau")
    return tokens / tau if tokens is not None and tau else None


def _mean(values) -> float | None:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return float(np.mean(v)) if v else None


def cell_entry(cell, runs: list[dict], pred: dict) -> dict:
    entry = {
        "name": cell.label,
        "stages": cell.stages,
        "latency_ms": cell.latency_ms,
        "k": cell.k,
        "mechanism": cell.mechanism,
        "status": "measured" if runs else "pending",
        "config": dataclasses.asdict(cell),
    }
    if not runs:
        entry["real"] = None
        only = pred["bundle_only"]
        for engine in ENGINES:
            m = only.get(engine)
            entry[engine] = (
                {key: m.get(key) for key in (*METRICS, "tau")}
                if m
                else {"error": only.get("error")}
            )
        entry["pending_reason"] = (
            f"{cell.pending_reason or 'not run'} (predicted from the bundle only)"
        )
        return entry
    real = {key: _mean(r.get(key) for r in runs) for key in (*METRICS, "tau", "lap_ms_mean")}
    real["spread"] = {key: spread([r.get(key) for r in runs]) for key in (*METRICS, "tau")}
    # the timing's share: the runs' rate per verify pass (tokens/s / tau), the prompts' tau
    # divided out (with rounds of their own prompts the tokens/s spread holds the sample's too)
    real["spread"]["pass_rate"] = spread([_pass_rate(r) for r in runs])
    loads = [x for r in runs for x in r["load_avg_1min"]]
    real["load_avg_1min"] = {"min": min(loads), "max": max(loads)}
    real["host_cpu"] = host_cpu_range([r.get("host_cpu") for r in runs])
    real["stage_wait_ms_per_pass"] = per_stage_mean([r.get("stage_wait_ms_per_pass") for r in runs])
    real["runs"] = runs
    entry["real"] = real
    for engine in ENGINES:
        m = {key: _mean(p[engine].get(key) for p in pred["rounds"]) for key in (*METRICS, "tau")}
        m["error"] = {key: rel_error(m[key], real[key]) for key in (*METRICS, "tau")}
        m["within_2x_spread"] = {
            key: (
                abs(m["error"][key]) <= 2 * real["spread"][key]
                if m["error"][key] is not None and real["spread"][key] is not None
                else None
            )
            for key in METRICS
        }
        timing = real["spread"]["pass_rate"]
        m["within_2x_timing_spread"] = (
            abs(m["error"]["tokens_per_s"]) <= 2 * timing
            if m["error"]["tokens_per_s"] is not None and timing is not None
            else None
        )
        entry[engine] = m
    host_wait = per_stage_mean([p["des"].get("host_wait_ms_per_pass") for p in pred["rounds"]])
    if host_wait is not None:  # the DES's shared host: its processor sharing's wait a pass
        entry["des"]["host_wait_ms_per_pass"] = host_wait
    own = [p["workload_acceptance"] for p in pred["rounds"] if "workload_acceptance" in p]
    if own and len(own) == len(pred["rounds"]):
        # the cells' own prompts' acceptance (in process), every cost from the bundle
        entry["workload_acceptance"] = {}
        for engine in ENGINES:
            m = {key: _mean(p[engine].get(key) for p in own) for key in (*METRICS, "tau")}
            m["error"] = {key: rel_error(m[key], real[key]) for key in (*METRICS, "tau")}
            entry["workload_acceptance"][engine] = m
    band = next((p["sample_band"] for p in pred["rounds"] if "sample_band" in p), None)
    if band is not None:  # the DES's tokens/s over runs of the cell's request count
        entry["des"]["sample_band"] = band
        entry["des"]["real_inside_sample_band"] = (
            band["p2_5"] <= real["tokens_per_s"] <= band["p97_5"]
        )
    bets = bet_rates(runs, pred["rounds"], own if "workload_acceptance" in entry else None)
    if bets:
        entry["bets"] = bets
    entry["lap_parts_ms"] = lap_parts(runs, [p["components"] for p in pred["rounds"]])
    notes = [n for p in pred["rounds"] for n in p.get("unmodelled", ())]
    if notes:  # what the engines do not model about this cell (one line each)
        entry["unmodelled"] = list(dict.fromkeys(notes))
    only = pred["bundle_only"].get("analytical", {})
    entry["bundle_only"] = {
        "analytical": {
            **{key: only.get(key) for key in METRICS},
            "error": {key: rel_error(only.get(key), real[key]) for key in METRICS},
        }
    }
    return entry


def bet_rates(runs: list[dict], rounds: list[dict], own: list[dict] | None) -> dict | None:
    """Async: how often a bet won, real (bets placed; greedy runs repeat the same bets, so the
    counts are per run: their mean) and DES (per verified block) on the bundle's acceptance
    and, with ``own`` (the rounds' own-prompts predictions), on the cell's own prompts' (which
    separates the prompt sample from the bet model). None without real bets."""
    bets = [r["bets"] for r in runs if r.get("bets")]
    if not bets:
        return None
    won, lost = (float(np.mean([b[key] for b in bets])) for key in ("won", "lost"))
    out = {
        "real_won": won,
        "real_lost": lost,
        "real_win_rate": won / (won + lost) if won + lost else None,
        "des_win_rate": _mean(p["des"].get("bet_win_rate") for p in rounds),
    }
    if own:
        out["des_win_rate_own_prompts"] = _mean(p["des"].get("bet_win_rate") for p in own)
    return out


def lap_parts(runs: list[dict], predicted: list[dict]) -> dict:
    """Where a cell's mean lap differs: per part (stages, drafting, the per-message cost of the
    forward hops and of the return hop; the configured latencies are the same on both sides)
    the real mean over runs, the predicted mean over rounds, and the gap; ``largest_gap`` names
    the part the engines' inputs missed most (what a miss teaches)."""

    def parts(stage: list[float], draft: float, fwd: float, back: float, hops: int) -> dict:
        return {
            "stages": float(sum(stage)),
            "drafting": float(draft),
            "per_message_forward": float(fwd * (hops - 1)),
            "per_message_return": float(back),
        }

    hops = len(runs[0]["stage_service_ms_mean"])
    real = [
        parts(
            r["stage_service_ms_mean"],
            r["draft_ms_mean"],
            r["per_message_ms_mean"]["forward"],
            r["per_message_ms_mean"]["return"],
            hops,
        )
        for r in runs
    ]
    pred = [
        parts(
            p["stage_service_ms"],
            p["draft_ms"],
            p["per_message_ms"]["forward"],
            p["per_message_ms"]["return"],
            hops,
        )
        for p in predicted
    ]
    out = {}
    for key in real[0]:
        rv, pv = _mean(x[key] for x in real), _mean(x[key] for x in pred)
        out[key] = {"real": rv, "predicted": pv, "gap": (pv - rv) if None not in (rv, pv) else None}
    gaps = {k: abs(v["gap"]) for k, v in out.items() if v["gap"] is not None}
    out["largest_gap"] = max(gaps, key=gaps.get) if gaps else None
    out["real_stage_service_ms"] = [
        _mean(r["stage_service_ms_mean"][i] for r in runs) for i in range(hops)
    ]
    out["predicted_stage_service_ms"] = [
        _mean(p["stage_service_ms"][i] for p in predicted) for i in range(hops)
    ]
    return out


def _stats(errs: list[tuple[float, str]]) -> dict:
    if not errs:
        return {"median_abs_error": None, "worst": None, "worst_cell": None, "cells": 0}
    worst = max(errs, key=lambda e: abs(e[0]))
    return {
        "median_abs_error": float(np.median([abs(e) for e, _ in errs])),
        "worst": float(worst[0]),
        "worst_cell": worst[1],
        "cells": len(errs),
    }


def summarize(entries: list[dict]) -> dict:
    measured = [e for e in entries if e["status"] == "measured"]

    def errs(engine: str, key: str, cells=measured):
        return [
            (e[engine]["error"][key], e["name"])
            for e in cells
            if e[engine]["error"][key] is not None
        ]

    des = {key: _stats(errs("des", key)) for key in METRICS}
    ana = {key: _stats(errs("analytical", key)) for key in METRICS}
    only = {
        key: _stats(
            [
                (e["bundle_only"]["analytical"]["error"][key], e["name"])
                for e in measured
                if e["bundle_only"]["analytical"]["error"][key] is not None
            ]
        )
        for key in METRICS
    }
    own = [e for e in measured if "workload_acceptance" in e]
    workload = {
        engine: {
            key: _stats(
                [
                    (e["workload_acceptance"][engine]["error"][key], e["name"])
                    for e in own
                    if e["workload_acceptance"][engine]["error"][key] is not None
                ]
            )
            for key in (*METRICS, "tau")
        }
        for engine in ENGINES
    }
    mechs = sorted({e["mechanism"] for e in measured})
    per_mech = {
        m: {
            engine: {
                key: _stats(errs(engine, key, [e for e in measured if e["mechanism"] == m]))[
                    "median_abs_error"
                ]
                for key in METRICS
            }
            for engine in ENGINES
        }
        for m in mechs
    }
    within, either = _within(measured, "des")
    ana_within, ana_either = _within(measured, "analytical")
    halves = [(e.get("workload_sample") or {}).get("half_width") for e in measured]
    loads = [x for e in measured for x in e["real"]["load_avg_1min"].values()]
    hosts = [r.get("host_cpu") for e in measured for r in e["real"].get("runs", [])]
    return {
        "out_of_sample": True,
        "engine": "des",
        **des,
        "analytical": ana,
        "bundle_only_analytical": only,
        # the same predictions with the acceptance of the cells' own prompts (in process)
        "workload_acceptance": workload if own else None,
        "per_mechanism": per_mech,
        "tokens_per_s_within_2x_spread": f"{sum(within)}/{len(within)}",
        # + the tau band of the cell's prompt sample (None: the bundle has no traces)
        "tokens_per_s_within_2x_spread_or_sample": (
            f"{sum(either)}/{len(either)}" if either else None
        ),
        # the same counts for the analytical engine's predictions
        "analytical_tokens_per_s_within_2x_spread": (
            f"{sum(ana_within)}/{len(ana_within)}" if ana_within else None
        ),
        "analytical_tokens_per_s_within_2x_spread_or_sample": (
            f"{sum(ana_either)}/{len(ana_either)}" if ana_either else None
        ),
        # the same against the timing's spread alone (the runs' rate per verify pass)
        "tokens_per_s_within_2x_timing_spread": _count(
            e["des"].get("within_2x_timing_spread") for e in measured
        ),
        "analytical_tokens_per_s_within_2x_timing_spread": _count(
            e["analytical"].get("within_2x_timing_spread") for e in measured
        ),
        "workload_sample_half_width_median": _median(halves),
        # the real tokens/s inside the DES's 95% range over runs of the cell's request count
        "tokens_per_s_inside_des_sample_band": _count(
            e["des"].get("real_inside_sample_band") for e in measured
        ),
        "real_spread_median": {
            key: _median([e["real"]["spread"].get(key) for e in measured])
            for key in (*METRICS, "pass_rate")
        },
        "cells": len(entries),
        "measured": len(measured),
        "pending": [e["name"] for e in entries if e["status"] == "pending"],
        "load_avg_1min": {"min": min(loads), "max": max(loads)} if loads else None,
        "host_cpu": host_cpu_range(hosts),
    }


def _within(measured: list[dict], engine: str) -> tuple[list[bool], list[bool]]:
    """Per cell, whether ``engine``'s tokens/s error is within twice the cell's spread, and
    within twice the spread plus the prompt sample's half-width (cells that say)."""
    within = [(e[engine].get("within_2x_spread") or {}).get("tokens_per_s") for e in measured]
    either = [e[engine].get("within_2x_spread_or_sample") for e in measured]
    return [w for w in within if w is not None], [w for w in either if w is not None]


def host_cpu_range(loads: list[dict | None]) -> dict | None:
    """Over real runs' ``host_cpu`` records (:mod:`wansim.real.host_load`): the busy cores'
    range, the most cores other processes kept busy, the largest steal; None when no run
    recorded one (runs recorded before the field, or a host without ``/proc/stat``)."""
    loads = [x for x in loads if x]
    if not loads:
        return None
    busy = [x["busy_cores"] for x in loads]
    return {
        "busy_cores": {"min": min(busy), "max": max(busy)},
        "own_cores": {
            "min": min(x["own_cores"] for x in loads),
            "max": max(x["own_cores"] for x in loads),
        },
        "others_cores_max": max(x["others_cores"] for x in loads),
        "steal_fraction_max": max(x["steal_fraction"] for x in loads),
        "runs": len(loads),
    }


def per_stage_mean(lists: list[list | None]) -> list[float | None] | None:
    """Per stage, the mean over the lists that have the stage's value; None without any list
    (runs recorded before the field, a kernel without schedstats, no shared host)."""
    lists = [x for x in lists if x]
    if not lists:
        return None
    return [_mean(x[i] for x in lists) for i in range(len(lists[0]))]


def _count(flags) -> str | None:
    known = [f for f in flags if f is not None]
    return f"{sum(known)}/{len(known)}" if known else None


def _median(values):
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def add_workload_sample(entry: dict, cell, traces) -> None:
    """The cell's tau sampling band from the bundle's per-prompt traces
    (:mod:`wansim.calibrate.workload_sample`) and, per engine, whether the tokens/s error lies
    within 2x the cell's run-to-run spread plus the band's half-width (the prompt sample's
    share of a miss, which the runs cannot show)."""
    real = entry["real"]
    band = cell_band(traces, cell, real["tau"]) if real else None
    entry["workload_sample"] = band
    if not real:
        return
    for engine in ENGINES:
        err, sp = entry[engine]["error"]["tokens_per_s"], real["spread"]["tokens_per_s"]
        entry[engine]["within_2x_spread_or_sample"] = (
            abs(err) <= 2 * sp + band["half_width"]
            if band is not None and err is not None and sp is not None
            else None
        )


def build_result(cells, runs, predictions, rounds_info, bundle, settings, seconds) -> dict:
    entries = [cell_entry(c, runs.get(c.label, []), predictions[c.label]) for c in cells]
    samples = []
    for entry, cell in zip(entries, cells, strict=True):
        seeds = prompt_seeds(runs.get(cell.label, []))
        sample = dataclasses.replace(cell, prompts=prompts_decoded(cell, runs.get(cell.label, [])))
        add_workload_sample(entry, sample, getattr(bundle, "acceptance_traces", None))
        if entry["real"] is not None:
            entry["real"]["prompts"] = sample.prompts  # distinct prompts over its runs
            entry["real"]["prompt_samples"] = len(seeds)
            samples.append(len(seeds))
    summary = summarize(entries)
    # each round its own sample of the workload's prompts (the spread holds the sample's noise),
    # or one sample replayed (the spread holds the timing's alone)
    summary["prompts_per_round"] = (
        None if not samples else "own sample" if min(samples) > 1 else "replayed"
    )
    summary["chance_beyond_2x_spread_unbiased"] = (
        chance_beyond_spread(min(len(runs[e["name"]]) for e in entries if e["real"]))
        if samples
        else None
    )
    summary["rounds"] = rounds_info
    summary["bundle"] = str(bundle.path)
    summary["bundle_created_utc"] = bundle.manifest.get("created_utc")
    summary["settings"] = dataclasses.asdict(settings)
    summary["seconds"] = round(seconds, 1)
    return strict({"cells": entries, "summary": summary})


def dumps(result: dict) -> str:
    return json.dumps(strict(result), allow_nan=False)


# ----------------------------------------------------------------------------- outputs
def write_outputs(result: dict, out: Path) -> None:
    (out / "predict.json").write_text(json.dumps(strict(result), indent=1, allow_nan=False) + "\n")
    plot_scatter(result, out / "predict_scatter.png")
    plot_mechanisms(result, out / "predict_errors_by_mechanism.png")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scatter(result: dict, path: Path) -> None:
    """Real vs predicted tokens/s per measured cell (both engines), the y = x line, +-10%."""
    plt = _plt()
    measured = [c for c in result["cells"] if c["status"] == "measured"]
    fig, ax = plt.subplots(figsize=(6, 5.5))
    xs = [c["real"]["tokens_per_s"] for c in measured]
    for engine, marker in (("des", "o"), ("analytical", "x")):
        ys = [c[engine]["tokens_per_s"] for c in measured]
        ax.scatter(xs, ys, marker=marker, label=engine)
    for c in measured:
        ax.annotate(c["name"], (c["real"]["tokens_per_s"], c["des"]["tokens_per_s"]), fontsize=6)
    if xs:
        lo, hi = min(xs) * 0.8, max(xs) * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = real")
        ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.6, label="+-10%")
        ax.plot([lo, hi], [lo * 0.9, hi * 0.9], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        from matplotlib.ticker import ScalarFormatter

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("real tokens/s (mean over runs)")
    ax.set_ylabel("predicted tokens/s (profile bundle + configuration)")
    s = result["summary"]
    ax.set_title(
        f"out of sample: median |err| {_pct(s['tokens_per_s']['median_abs_error'])}, "
        f"worst {_pct(s['tokens_per_s']['worst'], signed=True)} (DES)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mechanisms(result: dict, path: Path) -> None:
    """Median |error| per mechanism and metric (DES), with the median real spread."""
    plt = _plt()
    s = result["summary"]
    mechs = list(s["per_mechanism"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(METRICS)
    for j, key in enumerate(METRICS):
        vals = [100 * (s["per_mechanism"][m]["des"][key] or 0.0) for m in mechs]
        ax.bar(np.arange(len(mechs)) + j * width, vals, width, label=key)
    for j, key in enumerate(METRICS):
        sp = s["real_spread_median"][key]
        if sp is not None:
            ax.axhline(100 * sp, color=f"C{j}", ls=":", lw=0.8)
    ax.set_xticks(np.arange(len(mechs)) + 0.4 - width / 2)
    ax.set_xticklabels(mechs or ["(none measured)"])
    ax.set_ylabel("median |error| %, DES (dotted: median real run-to-run spread)")
    ax.set_title(
        f"out-of-sample error by mechanism; pending: {len(s['pending'])} cells", fontsize=9
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _gap_words(parts: dict | None) -> str:
    if not parts or not parts.get("largest_gap"):
        return "-"
    key = parts["largest_gap"]
    return f"{key.replace('_', ' ')} {parts[key]['gap']:+.1f} ms"


def _bet_words(bets: dict | None) -> str:
    if not bets or bets["real_win_rate"] is None or bets["des_win_rate"] is None:
        return ""
    own = bets.get("des_win_rate_own_prompts")
    return (
        f"; bets won: real {bets['real_win_rate']:.2f} ({bets['real_won']:g} of "
        f"{bets['real_won'] + bets['real_lost']:g} a run), DES {bets['des_win_rate']:.2f}"
        + (f" (own prompts {own:.2f})" if own is not None else "")
    )


def _unmodelled_words(notes: list[str] | None) -> str:
    return "".join(f"; {n.split(':')[0]}" for n in notes or ())


def _host_words(h: dict | None) -> str:
    if not h:
        return ""
    b = h["busy_cores"]
    return (
        f", {b['min']:.1f}-{b['max']:.1f} cores busy over the decodes "
        f"(others up to {h['others_cores_max']:.1f}, steal up to {100 * h['steal_fraction_max']:.1f}%)"
    )


def _wait_words(real: dict, des: dict) -> str:
    """Where measured: the stages' mean wait for a core a pass, real and the DES's (processor
    sharing of the shared host; 0 without one)."""
    w = [x for x in real.get("stage_wait_ms_per_pass") or () if x is not None]
    if not w:
        return ""
    d = [x for x in des.get("host_wait_ms_per_pass") or () if x is not None]
    return f"; a pass waited {np.mean(w):.2f} ms for a core (DES {np.mean(d) if d else 0.0:.2f})"


def _load_words(real: dict) -> str:
    """A cell's load: the busy cores over its decodes (others' share) where recorded, else
    the 1-minute load average."""
    h = real.get("host_cpu")
    if h:
        b = h["busy_cores"]
        return f"{b['min']:.1f}-{b['max']:.1f} cores ({h['others_cores_max']:.1f} others)"
    return f"{real['load_avg_1min']['min']:.1f}-{real['load_avg_1min']['max']:.1f} avg"


def _pct(x, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def format_table(result: dict) -> str:
    s = result["summary"]
    lines = [
        f"wansim calibrate predict: OUT OF SAMPLE — {s['measured']} cells run "
        f"x {s['settings']['rounds']} rounds, {len(s['pending'])} pending; bundle {s['bundle']}; "
        f"load average {s['load_avg_1min']['min'] if s['load_avg_1min'] else '-'}-"
        f"{s['load_avg_1min']['max'] if s['load_avg_1min'] else '-'}"
        f"{_host_words(s.get('host_cpu'))}; {s['seconds']:.0f} s",
        "",
        f"{'cell':<24} {'mechanism':<18} {'real tok/s':>10} {'spread':>7} {'DES':>8} "
        f"{'anal.':>8} {'bundle':>8} {'<=2x':>5} | {'lap p50':>7} {'DES':>7} | {'lap p99':>7} "
        f"{'DES':>7} | {'TPOT p99':>8} {'DES':>7} | {'tau':>4} {'DES':>7} {'sample':>6} | load | "
        "largest "
        "gap in the mean lap (predicted - real)",
    ]
    for c in result["cells"]:
        if c["status"] == "pending":
            d = c["des"].get("tokens_per_s")
            lines.append(
                f"{c['name']:<24} {c['mechanism']:<18} {'pending':>10} {'':>7} "
                f"{(f'{d:.1f}' if d is not None else '-'):>8}  (predicted only)"
            )
            continue
        r, d, a = c["real"], c["des"], c["analytical"]
        b = c["bundle_only"]["analytical"]["error"]
        w = d["within_2x_spread"]["tokens_per_s"]
        lines.append(
            f"{c['name']:<24} {c['mechanism']:<18} {r['tokens_per_s']:>10.1f} "
            f"{_pct(r['spread']['tokens_per_s']):>7} {_pct(d['error']['tokens_per_s'], True):>8} "
            f"{_pct(a['error']['tokens_per_s'], True):>8} {_pct(b['tokens_per_s'], True):>8} "
            f"{('yes' if w else 'no' if w is not None else '-'):>5} | {r['lap_ms_p50']:>7.1f} "
            f"{_pct(d['error']['lap_ms_p50'], True):>7} | {r['lap_ms_p99']:>7.1f} "
            f"{_pct(d['error']['lap_ms_p99'], True):>7} | {r['tpot_ms_p99']:>8.1f} "
            f"{_pct(d['error']['tpot_ms_p99'], True):>7} | {r['tau']:>4.2f} "
            f"{_pct(d['error']['tau'], True):>7} "
            f"{_pct((c.get('workload_sample') or {}).get('half_width')):>6} | "
            f"{_load_words(r)}{_wait_words(r, d)} | "
            f"{_gap_words(c.get('lap_parts_ms'))}{_bet_words(c.get('bets'))}"
            f"{_unmodelled_words(c.get('unmodelled'))}"
        )
    lines += ["", "median |error| / worst (cell), measured cells:"]
    for name, block in (
        ("DES", s),
        ("analytical", s["analytical"]),
        ("bundle only (anal.)", s["bundle_only_analytical"]),
        *(
            (("DES, own prompts' acc.", s["workload_acceptance"]["des"]),)
            if s.get("workload_acceptance")
            else ()
        ),
    ):
        row = f"{name:<20}"
        for key in METRICS:
            st = block[key]
            row += f" {key} {_pct(st['median_abs_error'])} / {_pct(st['worst'], True)}"
            row += f" ({st['worst_cell']})" if st["worst_cell"] else ""
            row += ";"
        lines.append(row)
    sp = s["real_spread_median"]
    lines.append(
        "real run-to-run spread (median over cells): "
        + ", ".join(f"{k} {_pct(sp[k])}" for k in METRICS)
        + f"; DES tokens/s error within 2x the cell's spread: {s['tokens_per_s_within_2x_spread']}"
    )
    if s.get("tokens_per_s_inside_des_sample_band"):
        lines.append(
            "real tokens/s inside the DES's 95% range over runs of the cell's request count "
            f"(seeds): {s['tokens_per_s_inside_des_sample_band']}"
        )
    if s.get("prompts_per_round") == "own sample":
        lines.append(
            "each round decoded its own sample of the workload's prompts: the spread holds the "
            "sample's noise with the timing's (an unbiased prediction lands beyond 2x the spread "
            f"by chance {_pct(s['chance_beyond_2x_spread_unbiased'])} of the time)"
        )
    if s.get("tokens_per_s_within_2x_timing_spread"):
        lines.append(
            "the timing's spread alone (the runs' rate per verify pass, tokens/s / tau), median "
            f"{_pct(sp.get('pass_rate'))}; tokens/s error within 2x it: DES "
            f"{s['tokens_per_s_within_2x_timing_spread']}, analytical "
            f"{s.get('analytical_tokens_per_s_within_2x_timing_spread')}"
        )
    if s.get("tokens_per_s_within_2x_spread_or_sample"):
        lines.append(
            "the cells' prompts are a sample of the workload (where rounds replay one sample, "
            "greedy runs repeat it exactly and the spread cannot show it): tau's 95% band for "
            "a cell's prompts over its rounds, half-width "
            f"median {_pct(s['workload_sample_half_width_median'])} ('sample'); DES tokens/s "
            "error within 2x the spread + that half-width: "
            f"{s['tokens_per_s_within_2x_spread_or_sample']}"
        )
    if s.get("analytical_tokens_per_s_within_2x_spread"):
        band = s.get("analytical_tokens_per_s_within_2x_spread_or_sample")
        lines.append(
            "analytical tokens/s error within 2x the cell's spread: "
            f"{s['analytical_tokens_per_s_within_2x_spread']}"
            + (f" (+ the sample's half-width: {band})" if band else "")
        )
    for m, v in s["per_mechanism"].items():
        lines.append(
            f"  {m}: DES median |err| " + ", ".join(f"{k} {_pct(v['des'][k])}" for k in METRICS)
        )
    lines.append(
        "(spread: (max - min) / mean over a cell's runs; bundle: the bundle's costs without the "
        "rounds' re-profile; load: 1-minute load average around the cell's runs)"
    )
    return "\n".join(lines)

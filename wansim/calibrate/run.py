"""``wansim calibrate``: run a matrix of real pipelines, predict every cell with the DES and the
analytical engine from that cell's own measurements, and report the errors.

Matrix: stages x latency per hop x K (quick default 2,4 x 5,20 ms x 2,4). One real pipeline per
(stages, latency) (every hop, the return hop included, is an emulated link of that one-way
latency and ``bandwidth_mbps``), decoding the same prompts once per K, one request at a time.
Per cell (``OUT/cells/P{stages}-L{latency}-K{k}/``): the real run's per-pass decomposition
(``passes.csv``, :mod:`wansim.calibrate.measure`), the real metrics with the simulator's
definitions, the scenario built from them (``scenario.yaml``, :mod:`wansim.calibrate.cells`),
and both engines' predictions. ``OUT/calibration.json`` is rewritten after every cell, so an
interrupted run (Ctrl-C) keeps the cells it finished. The real runs' own records (trace,
profile, compute table, links, summary, raw logs) are under ``OUT/real/``.

torch is imported only when the real runs start (``wansim.real.runner`` starts the stage
processes); this module imports numpy, pandas and the engines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from wansim.calibrate.cells import DRAFTER_KINDS, PLACEMENT
from wansim.config.speculation import REAL_VERIFIERS
from wansim.data import models_dir
from wansim.errors import WansimInputError
from wansim.real.config import MTP_FILES  # no torch there (settings only)
from wansim.real.host_load import measured
from wansim.results import strict_json
from wansim.support.hold import checkpoint


def tiny_model(name: str) -> str:
    """A tiny model of the source checkout (wansim.data.models_dir), else ``models/NAME``
    (which the settings check then reports as missing, in one line)."""
    found = models_dir(name)
    return str(found if found is not None else Path("models") / name)


LINK_MODES = ("measured", "configured")
BITS = (32, 16, 8, 4, 3)
MAX_K = 64
COMPARED = ("tokens_per_s", "pooled_tokens_per_s", "lap_ms_p50", "lap_ms_p99", "tau")


def pooled_rate(metrics: dict) -> float | None:
    """1e3 tau / lap_ms_mean: all decode tokens over all decode time (renewal reward; exactly
    that ratio for the real run and the DES). Unlike ``tokens_per_s`` (a mean of per-request
    rates) it does not depend on how the lap times spread over the requests."""
    tau, lap = metrics.get("tau"), metrics.get("lap_ms_mean")
    return 1e3 * tau / lap if tau and lap else None


QUICK = {"prompts": 8, "tokens": 64}
FULL = {"prompts": 16, "tokens": 128}
TARGET_ERROR = 0.05


@dataclasses.dataclass(frozen=True)
class Settings:
    stages: tuple[int, ...] = (2, 4)
    latencies_ms: tuple[float, ...] = (5.0, 20.0)
    ks: tuple[int, ...] = (2, 4)
    prompts: int = QUICK["prompts"]
    tokens: int = QUICK["tokens"]
    prompt_tokens: int = 64
    workload: str = "code"
    verifier: str = "greedy"
    temperature: float = 0.0
    bandwidth_mbps: float = 1000.0
    activation_bits: int = 32
    target_dir: str = dataclasses.field(default_factory=lambda: tiny_model("tiny-target"))
    drafter_dir: str = dataclasses.field(default_factory=lambda: tiny_model("tiny-drafter"))
    drafter_kind: str = "draft_model"
    mtp_dir: str = dataclasses.field(default_factory=lambda: tiny_model("tiny-mtp"))
    des_requests: int = 2000
    seed: int = 0
    links: str = "measured"
    out: str = "out/calibrate"

    @property
    def drafter_name(self) -> str:
        """The checkpoint that drafts: the draft model's dir or the MTP head's."""
        return Path(self.mtp_dir if self.drafter_kind == "mtp" else self.drafter_dir).name

    @property
    def placement(self) -> str:
        return PLACEMENT[self.drafter_kind]

    @property
    def cells(self) -> list[tuple[int, float, int]]:
        return [(p, lat, k) for p in self.stages for lat in self.latencies_ms for k in self.ks]


def cell_name(p: int, lat: float, k: int) -> str:
    return f"P{p}-L{lat:g}-K{k}"


# ----------------------------------------------------------------------------- input checks
def _config(path: str, flag: str) -> dict:
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise WansimInputError(
            flag, "must be a local checkpoint directory holding config.json", path
        )
    try:
        return json.loads((p / "config.json").read_text())
    except ValueError:
        raise WansimInputError(flag, "config.json is not valid JSON", path) from None


def check_settings(s: Settings) -> dict:
    """Validate everything before any process starts; returns the target's config.
    Errors: one line naming the flag, the value and what is allowed."""
    target = _config(s.target_dir, "--target")
    layers = int(target.get("num_hidden_layers", 0))
    if not s.stages or any(not 2 <= p <= layers for p in s.stages):
        raise WansimInputError(
            "--stages",
            f"must be integers in 2..{layers} (the target has {layers} layers)",
            ",".join(map(str, s.stages)),
        )
    if not s.latencies_ms or any(not (lat >= 0 and math.isfinite(lat)) for lat in s.latencies_ms):
        raise WansimInputError(
            "--latency-ms",
            "must be finite numbers >= 0 (one-way ms per hop)",
            ",".join(f"{x:g}" for x in s.latencies_ms),
        )
    if s.verifier not in REAL_VERIFIERS:
        raise WansimInputError(
            "--verifier", f"must be one of {' | '.join(REAL_VERIFIERS)}", s.verifier
        )
    if s.prompts < 1:
        raise WansimInputError("--prompts", "must be an integer >= 1", s.prompts)
    if s.tokens < 2:
        raise WansimInputError(
            "--tokens", "must be an integer >= 2 (new tokens per prompt)", s.tokens
        )
    if not 1 <= s.prompt_tokens <= 4096:
        raise WansimInputError("--prompt-tokens", "must be in 1..4096", s.prompt_tokens)
    if not (s.bandwidth_mbps > 0 and math.isfinite(s.bandwidth_mbps)):
        raise WansimInputError("--bandwidth-mbps", "must be a finite number > 0", s.bandwidth_mbps)
    if s.activation_bits not in BITS:
        raise WansimInputError(
            "--bits", f"must be one of {' | '.join(map(str, BITS))}", s.activation_bits
        )
    if s.des_requests < 2:
        raise WansimInputError("--des-requests", "must be an integer >= 2", s.des_requests)
    if s.links not in LINK_MODES:
        raise WansimInputError("--links", f"must be one of {' | '.join(LINK_MODES)}", s.links)
    if s.verifier == "lossless" and not s.temperature > 0:
        raise WansimInputError(
            "--temperature", "must be > 0 for the lossless verifier", s.temperature
        )
    if s.verifier == "greedy" and s.temperature != 0:
        raise WansimInputError("--temperature", "must be 0 for the greedy verifier", s.temperature)
    ks = ",".join(map(str, s.ks))
    if not s.ks or any(not 0 <= k <= MAX_K for k in s.ks):
        raise WansimInputError(
            "--k", f"must be integers in 0..{MAX_K} (drafts per verify pass; 0 = no drafter)", ks
        )
    if s.drafter_kind not in DRAFTER_KINDS:
        raise WansimInputError(
            "--drafter-kind",
            f"must be one of {' | '.join(DRAFTER_KINDS)} (the draft model at stage 0 | the MTP "
            "head at the last stage)",
            s.drafter_kind,
        )
    context = int(target.get("max_position_embeddings", 1 << 30))
    if s.drafter_kind == "mtp":  # the real runs load the head even for K = 0
        _check_mtp(s.mtp_dir, target)
    elif any(k > 0 for k in s.ks):
        drafter = _config(s.drafter_dir, "--drafter")
        context = min(context, int(drafter.get("max_position_embeddings", 1 << 30)))
        if int(drafter.get("vocab_size", -1)) != int(target.get("vocab_size", -2)):
            raise WansimInputError("--drafter", "must share the target's vocabulary", s.drafter_dir)
    if s.prompt_tokens + s.tokens > context:
        raise WansimInputError(
            "--tokens",
            f"must be <= {context - s.prompt_tokens}: the models hold {context} positions and "
            f"the prompts take {s.prompt_tokens}",
            s.tokens,
        )
    room = context - s.prompt_tokens - s.tokens
    if max(s.ks) > room:
        raise WansimInputError(
            "--k",
            f"must be <= {max(room, 0)}: the models hold {context} positions and prompt + "
            f"tokens take {s.prompt_tokens + s.tokens}",
            ks,
        )
    return target


def _check_mtp(path: str, target: dict) -> None:
    """An MTP head directory for the target (shape read from mtp_config.json; no torch)."""
    p = Path(path)
    if not p.is_dir() or not all((p / name).is_file() for name in MTP_FILES):
        raise WansimInputError(
            "--mtp", f"must be an MTP head directory holding {' and '.join(MTP_FILES)}", path
        )
    try:
        cfg = json.loads((p / MTP_FILES[0]).read_text())
    except ValueError:
        raise WansimInputError("--mtp", f"{MTP_FILES[0]} is not valid JSON", path) from None
    for key in ("hidden_size", "vocab_size"):
        if int(cfg.get(key, -1)) != int(target.get(key, -2)):
            raise WansimInputError("--mtp", f"must match the target's {key}", path)


# ----------------------------------------------------------------------------- one cell
def predict(scenario_path: Path) -> dict:
    """DES and analytical metrics of a cell's scenario file (as ``wansim run`` loads it)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.results.result import jsonable
    from wansim.sim import simulate

    sc = load_scenario(scenario_path)
    t0 = time.perf_counter()
    des = simulate(sc).metrics
    t1 = time.perf_counter()
    ana = analyze(sc).metrics
    return {
        "des": jsonable(des),
        "analytical": jsonable(ana),
        "des_s": t1 - t0,
    }


def relative_error(pred, real) -> float | None:
    if pred is None or real is None or not real:
        return None
    return (float(pred) - float(real)) / abs(float(real))


def evaluate_cell(
    cell_dir: Path,
    passes,
    profile_path: str | None,
    settings: Settings,
    target_cfg: dict,
    p: int,
    lat: float,
    k: int,
    phase1_summary: dict | None = None,
    load_avg: tuple[float, float] | None = None,
    host_cpu: dict | None = None,
) -> dict:
    """Real metrics, scenario and predictions of one cell (the real run already done);
    ``load_avg``: the machine's 1-minute load average before and after the real run;
    ``host_cpu``: its CPU over the decode (:mod:`wansim.real.host_load`)."""
    from wansim.calibrate.cells import build_cell
    from wansim.calibrate.measure import emulator_accuracy, phase1_differences, real_metrics

    cell_dir.mkdir(parents=True, exist_ok=True)
    passes.to_csv(cell_dir / "passes.csv", index=False)
    real = real_metrics(passes, p, settings.tokens)
    v = passes[passes["kind"] == "verify"]
    real["draft_ms_mean"] = float(v["draft_ms"].mean())
    real["stage_service_ms_mean"] = [float(v[f"service{i}_ms"].mean()) for i in range(p)]
    real["emulator_error_ms"] = emulator_accuracy(passes, p)
    real["hop_ms_mean"] = [float(v[f"hop{h}_ms"].mean()) for h in range(p)]
    # the engines assume every request sees the same lap distribution; a machine whose load
    # changes during the cell breaks that (tokens_per_s is a mean of per-request rates)
    per_request = v.groupby("prompt_index")["lap_ms"].mean().to_numpy(float)
    real["request_lap_ms_mean"] = {
        "min": float(per_request.min()),
        "max": float(per_request.max()),
        "cv": float(per_request.std(ddof=1) / per_request.mean()) if len(per_request) > 1 else 0.0,
    }
    if load_avg is not None:
        real["load_avg_1min"] = list(load_avg)
    if host_cpu is not None:
        real["host_cpu"] = host_cpu
    if phase1_summary is not None:
        real["phase1_summary"] = phase1_differences(phase1_summary, real)
    cell_args = {
        "stages": p,
        "latency_ms": lat,
        "bandwidth_mbps": settings.bandwidth_mbps,
        "k": k,
        "verifier": settings.verifier,
        "activation_bits": settings.activation_bits,
        "hidden_size": int(target_cfg["hidden_size"]),
        "vocab_size": int(target_cfg["vocab_size"]),
        "prompt_tokens": settings.prompt_tokens,
        "output_tokens": settings.tokens,
        "des_requests": settings.des_requests,
        "seed": settings.seed,
        "links": settings.links,
        "name": f"calibration-{cell_name(p, lat, k)}",
        "drafter_kind": settings.drafter_kind,
    }
    build_cell(cell_dir, passes, profile_path, **cell_args)
    pred = predict(cell_dir / "scenario.yaml")
    real["pooled_tokens_per_s"] = pooled_rate(real)
    cell = {
        "stages": p,
        "latency_ms": lat,
        "k": k,
        "drafter": {"kind": settings.drafter_kind, "placement": settings.placement},
        "real": real,
    }
    for engine in ("des", "analytical"):
        m = pred[engine]
        m["pooled_tokens_per_s"] = pooled_rate(m)
        m["error"] = {key: relative_error(m.get(key), real.get(key)) for key in COMPARED}
        m["scenario"] = str(cell_dir / "scenario.yaml")
        cell[engine] = m
    if settings.links == "measured":
        # the contrast: what the closed forms predict from the configured latencies alone
        # (mean service times and drafting as measured, the link emulator's error ignored)
        build_cell(
            cell_dir / "configured_links",
            passes,
            profile_path,
            **{**cell_args, "links": "configured", "name": f"{cell_args['name']}-configured"},
        )
        from wansim.analytical import analyze
        from wansim.config.scenario import load_scenario

        conf = analyze(load_scenario(cell_dir / "configured_links" / "scenario.yaml")).metrics
        cell["analytical"]["configured_links"] = {
            key: {"value": conf[key], "error": relative_error(conf[key], real.get(key))}
            for key in ("tokens_per_s", "lap_ms_mean")
        }
    (cell_dir / "cell.json").write_text(strict_json.dumps(cell, indent=1) + "\n")
    return cell


# ----------------------------------------------------------------------------- the matrix
def summarize(cells: list[dict], settings: Settings, seconds: float, complete: bool) -> dict:
    """Median and worst relative errors per engine and metric, the link emulator's accuracy
    pooled over the cells, and what the run was."""
    out: dict = {
        "cells": len(cells),
        "complete": complete,
        "seconds": round(seconds, 1),
        "out_of_sample": False,
        "mode": "in-sample consistency check (each cell predicted from its own measurements; "
        "out of sample: wansim calibrate predict)",
    }
    for engine in ("des", "analytical"):
        per = {}
        for key in COMPARED:
            errs = [
                (c[engine]["error"][key], c) for c in cells if c[engine]["error"][key] is not None
            ]
            if not errs:
                continue
            worst_err, worst_cell = max(errs, key=lambda e: abs(e[0]))
            per[key] = {
                "median_abs": float(np.median([abs(e) for e, _ in errs])),
                "worst": float(worst_err),
                "worst_cell": cell_name(
                    worst_cell["stages"], worst_cell["latency_ms"], worst_cell["k"]
                ),
            }
        tps = [abs(c[engine]["error"]["tokens_per_s"]) for c in cells]
        per["tokens_per_s_within_5pct"] = f"{sum(e <= TARGET_ERROR for e in tps)}/{len(tps)}"
        inside = [
            lo <= c[engine]["tokens_per_s"] <= hi
            for c in cells
            for lo, hi in [c["real"]["tokens_per_s_ci95"]]
            if lo == lo  # NaN with a single prompt
        ]
        per["tokens_per_s_inside_real_ci95"] = f"{sum(inside)}/{len(inside)}"
        conf = [
            c[engine]["configured_links"]["tokens_per_s"]["error"]
            for c in cells
            if "configured_links" in c[engine]
        ]
        if conf:
            per["configured_links_tokens_per_s"] = {
                "median_abs": float(np.median(np.abs(conf))),
                "worst": float(max(conf, key=abs)),
            }
        out[engine] = per
    p50 = [c["real"]["emulator_error_ms"]["p50"] for c in cells]
    p99 = [c["real"]["emulator_error_ms"]["p99"] for c in cells]
    out["link_emulator_error_ms"] = {
        "p50_median_over_cells": float(np.median(p50)) if p50 else None,
        "p99_median_over_cells": float(np.median(p99)) if p99 else None,
        "p99_worst_cell": float(np.max(p99)) if p99 else None,
        "meaning": "achieved - scheduled one-way delay of each pass's main frame, all hops",
    }
    out["settings"] = dataclasses.asdict(settings)
    return out


def run_calibration(
    settings: Settings,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the matrix; return ``{"cells": [...], "summary": {...}}``. On Ctrl-C the finished
    cells are kept (and written), the summary says ``complete: false``, and
    :class:`KeyboardInterrupt` is re-raised with the partial result attached as ``.result``."""
    target_cfg = check_settings(settings)
    say = progress or (lambda _msg: None)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cells: list[dict] = []
    total = len(settings.cells)

    def write(complete: bool) -> dict:
        result = {
            "cells": cells,
            "summary": summarize(cells, settings, time.perf_counter() - t0, complete),
        }
        (out / "calibration.json").write_text(strict_json.dumps(result, indent=1) + "\n")
        return result

    from wansim.real.prompts import builtin_prompts

    prompts = builtin_prompts(
        settings.workload, settings.prompts, settings.prompt_tokens, settings.seed
    )
    from wansim.real.errors import PipelineError

    try:
        for p in settings.stages:
            for lat in settings.latencies_ms:
                _run_pipeline(settings, target_cfg, prompts, p, lat, cells, total, t0, say, write)
    except (KeyboardInterrupt, PipelineError, CellError) as err:
        result = write(False)
        what = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        say(f"{what}: kept {len(cells)} of {total} cells in {out / 'calibration.json'}")
        err.result = result  # type: ignore[attr-defined]
        raise
    return write(True)


def recalibrate(
    source: str | Path,
    *,
    out: str | None = None,
    links: str | None = None,
    des_requests: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Predict a finished calibration's cells again from what it recorded (``passes.csv`` and
    ``profile.yaml`` per cell; no real run, no torch): after a change to an engine, or with
    other ``links``/``des_requests``. Writes to ``out`` (default: ``source`` itself)."""
    src = Path(source)
    path = src / "calibration.json"
    if not path.is_file():
        raise WansimInputError(
            "--reuse", "must be a calibrate output dir (calibration.json)", str(source)
        )
    old = json.loads(path.read_text())
    raw = dict(old["summary"]["settings"])
    for key in ("stages", "latencies_ms", "ks"):
        raw[key] = tuple(raw[key])
    raw["out"] = str(out or src)
    if links is not None:
        raw["links"] = links
    if des_requests is not None:
        raw["des_requests"] = des_requests
    settings = Settings(**raw)
    if settings.drafter_kind not in DRAFTER_KINDS:
        raise WansimInputError(
            "--reuse",
            f"records drafter_kind {settings.drafter_kind!r}; known: {' | '.join(DRAFTER_KINDS)}",
            str(source),
        )
    if settings.links not in LINK_MODES:
        raise WansimInputError(
            "--links", f"must be one of {' | '.join(LINK_MODES)}", settings.links
        )
    if settings.des_requests < 2:
        raise WansimInputError("--des-requests", "must be an integer >= 2", settings.des_requests)
    target_cfg = _config(settings.target_dir, "--target")
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    cells = []
    import tempfile

    import pandas as pd

    with tempfile.TemporaryDirectory(prefix="wansim-cal-") as tmp:
        for i, c in enumerate(old["cells"], 1):
            p, lat, k = c["stages"], c["latency_ms"], c["k"]
            name = cell_name(p, lat, k)
            cdir = src / "cells" / name
            passes = pd.read_csv(cdir / "passes.csv")
            summary_path = src / "real" / f"P{p}-L{lat:g}" / f"k{k}" / "summary.json"
            phase1 = json.loads(summary_path.read_text()) if summary_path.is_file() else None
            profile = None
            if k > 0:  # a copy: the cell dir may be the one being rewritten
                profile = Path(tmp) / f"{name}.yaml"
                profile.write_text((cdir / "profile.yaml").read_text())
            try:
                cell = evaluate_cell(
                    Path(raw["out"]) / "cells" / name,
                    passes,
                    str(profile) if profile else None,
                    settings,
                    target_cfg,
                    p,
                    lat,
                    k,
                    phase1_summary=phase1,
                    load_avg=c["real"].get("load_avg_1min"),
                    host_cpu=c["real"].get("host_cpu"),
                )
            except WansimInputError as err:
                raise CellError(f"cell {name}: its recorded scenario is invalid: {err}") from err
            cells.append(cell)
            say(_progress_line(i, len(old["cells"]), cell, 0.0, time.perf_counter() - t0, t0))
    result = {
        "cells": cells,
        "summary": summarize(cells, settings, time.perf_counter() - t0, old["summary"]["complete"]),
    }
    result["summary"]["reused_from"] = str(src)
    Path(raw["out"]).mkdir(parents=True, exist_ok=True)
    (Path(raw["out"]) / "calibration.json").write_text(strict_json.dumps(result, indent=1) + "\n")
    return result


class CellError(RuntimeError):
    """A cell's measurements did not make a valid scenario (a bug, not bad input)."""


def _run_pipeline(settings, target_cfg, prompts, p, lat, cells, total, t0, say, write) -> None:
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec, PipelineSpec
    from wansim.real.link import LinkSpec
    from wansim.real.recording import read_raw
    from wansim.real.runner import Pipeline

    out = Path(settings.out)
    ks = settings.ks
    mtp = settings.drafter_kind == "mtp"
    drafts = any(k > 0 for k in ks)
    spec = PipelineSpec(
        target_dir=settings.target_dir,
        drafter_dir=settings.drafter_dir if drafts and not mtp else None,
        drafter_kind=settings.drafter_kind,
        mtp_dir=settings.mtp_dir if mtp else None,
        stages=p,
        links=(LinkSpec(latency_ms=lat, bandwidth_mbps=settings.bandwidth_mbps),),
        activation_bits=settings.activation_bits,
    )
    run_dir = out / "real" / f"P{p}-L{lat:g}"
    t_start = time.perf_counter()
    first = "" if cells else " (the first start imports torch)"
    say(f"starting a {p}-stage pipeline, {lat:g} ms per hop{first} ...")
    pipe = Pipeline(spec, run_dir)
    try:
        pipe.start()
        say(f"  started in {time.perf_counter() - t_start:.1f} s")
        for k in ks:
            name = cell_name(p, lat, k)
            t_cell = time.perf_counter()
            decode = DecodeSpec(
                k=k,
                verifier=settings.verifier,
                temperature=settings.temperature,
                max_new_tokens=settings.tokens,
                seed=settings.seed,
            )
            load0 = os.getloadavg()[0]
            res, host = measured(pipe.pids, partial(pipe.generate, prompts, decode, name=f"k{k}"))
            t_real = time.perf_counter() - t_cell
            load = (round(load0, 2), round(os.getloadavg()[0], 2))
            raw = read_raw(run_dir / "raw", p)
            passes = decompose(res.steps, raw, p)
            try:
                cell = evaluate_cell(
                    out / "cells" / name,
                    passes,
                    res.paths.get("profile"),
                    settings,
                    target_cfg,
                    p,
                    lat,
                    k,
                    phase1_summary=res.summary,
                    load_avg=load,
                    host_cpu=host.as_dict() if host else None,
                )
            except WansimInputError as err:
                raise CellError(
                    f"cell {name}: the scenario built from its measurements is invalid: {err}"
                ) from err
            cells.append(cell)
            write(False)
            say(_progress_line(len(cells), total, cell, t_real, time.perf_counter() - t_cell, t0))
            checkpoint("calibrate-cell", len(cells))
    except KeyboardInterrupt:
        pipe.abort()
        raise
    finally:
        pipe.close()


def _progress_line(i, total, cell, t_real, t_cell, t0) -> str:
    r, d, a = cell["real"], cell["des"], cell["analytical"]
    return (
        f"[{i}/{total}] {cell_name(cell['stages'], cell['latency_ms'], cell['k'])}: real "
        f"{r['tokens_per_s']:.1f} tok/s, DES {d['tokens_per_s']:.1f} "
        f"({100 * d['error']['tokens_per_s']:+.1f}%), analytical {a['tokens_per_s']:.1f} "
        f"({100 * a['error']['tokens_per_s']:+.1f}%); real run {t_real:.1f} s, cell {t_cell:.1f} s, "
        f"total {time.perf_counter() - t0:.0f} s"
    )


# ----------------------------------------------------------------------------- output
def format_table(result: dict) -> str:
    """Real vs predicted per cell, the errors, and the overall medians/worsts."""
    cells = result["cells"]
    s = result["summary"]
    st = s["settings"]
    lines = [
        "wansim calibrate --in-sample: a CONSISTENCY CHECK (each cell predicted from its own "
        "measurements; out of sample: wansim calibrate predict)",
        f"{len(cells)} cells{'' if s['complete'] else ' (interrupted)'}, "
        f"{Path(st['target_dir']).name} + {_drafter_words(st)}, {st['verifier']}, "
        f"{st['activation_bits']}-bit activations, {st['prompts']} prompts x {st['tokens']} "
        f"tokens, {st['bandwidth_mbps']:g} Mbit/s links ({st['links']} delays), "
        + (
            f"re-predicted from {s['reused_from']} in {s['seconds']:.0f} s"
            if s.get("reused_from")
            else f"{s['seconds']:.0f} s"
        ),
        "",
        f"{'cell':<12} {'tokens/s':>8} {'DES':>14} {'analytical':>14} | "
        f"{'lap p50':>7} {'DES':>13} {'anal.':>13} | {'lap p99':>7} {'DES':>13} {'anal.':>13} | "
        f"{'tau':>5} {'DES':>5} | {'emu err p50/p99':>15}",
    ]

    def pe(m: dict, key: str, width: int, digits: int = 1) -> str:
        err = m["error"][key]
        txt = f"{m[key]:.{digits}f} ({100 * err:+.1f}%)" if err is not None else "-"
        return f"{txt:>{width}}"

    for c in cells:
        r, d, a = c["real"], c["des"], c["analytical"]
        emu = r["emulator_error_ms"]
        lines.append(
            f"{cell_name(c['stages'], c['latency_ms'], c['k']):<12} {r['tokens_per_s']:>8.1f} "
            f"{pe(d, 'tokens_per_s', 14)} {pe(a, 'tokens_per_s', 14)} | "
            f"{r['lap_ms_p50']:>7.1f} {pe(d, 'lap_ms_p50', 13)} {pe(a, 'lap_ms_p50', 13)} | "
            f"{r['lap_ms_p99']:>7.1f} {pe(d, 'lap_ms_p99', 13)} {pe(a, 'lap_ms_p99', 13)} | "
            f"{r['tau']:>5.2f} {d['tau']:>5.2f} | {emu['p50']:>6.2f}/{emu['p99']:<6.2f} ms"
        )
    lines += [
        "",
        "relative error, median |err| / worst (cell):",
        f"{'':<11} {'tokens/s':>27} {'pooled tokens/s':>27} {'lap p50':>27} {'lap p99':>27} "
        f"{'tau':>27}  within 5%  in real CI",
    ]
    for engine in ("des", "analytical"):
        e = s[engine]
        row = f"{engine:<11}"
        for key in COMPARED:
            if key in e:
                txt = (
                    f"{100 * e[key]['median_abs']:.1f}% / {100 * e[key]['worst']:+.1f}% "
                    f"({e[key]['worst_cell']})"
                )
            else:
                txt = "-"
            row += f" {txt:>27}"
        row += f"  {e['tokens_per_s_within_5pct']:>9}  {e['tokens_per_s_inside_real_ci95']:>10}"
        lines.append(row)
    lines.append(
        "(tokens/s: mean over requests of each one's rate; pooled: all decode tokens / all "
        "decode time = tau / mean lap; real CI: 95% over the real run's prompts)"
    )
    conf = s["analytical"].get("configured_links_tokens_per_s")
    if conf:
        lines.append(
            "analytical from the configured latencies alone (the emulator's error ignored): "
            f"tokens_per_s median |err| {100 * conf['median_abs']:.1f}%, worst "
            f"{100 * conf['worst']:+.1f}%"
        )
    emu = s["link_emulator_error_ms"]
    if emu["p50_median_over_cells"] is not None:
        fed = (
            "fed to the engines as measured hop delays"
            if st["links"] == "measured"
            else "not fed to the engines (--links configured)"
        )
        lines.append(
            f"link emulator error (achieved - scheduled): p50 {emu['p50_median_over_cells']:.2f} "
            f"ms, p99 {emu['p99_median_over_cells']:.2f} ms (median over cells; worst cell p99 "
            f"{emu['p99_worst_cell']:.2f} ms); {fed}"
        )
    lines.append(
        f"scenarios: {Path(st['out']) / 'cells'}/<cell>/scenario.yaml (wansim run ... --engine both)"
    )
    return "\n".join(lines)


def _drafter_words(st: dict) -> str:
    """The drafter of a recorded run's settings (runs from before --drafter-kind: the model)."""
    kind = st.get("drafter_kind", "draft_model")
    if kind == "mtp":
        return f"{Path(st['mtp_dir']).name} (MTP head at the last stage)"
    return f"{Path(st['drafter_dir']).name} (draft model at stage 0)"


def print_progress(msg: str) -> None:
    with contextlib.suppress(OSError):
        print(msg, file=sys.stderr, flush=True)

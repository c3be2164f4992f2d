"""Readable tables of results (one engine, or engines side by side with their differences)."""

from __future__ import annotations

import math
from pathlib import Path

from wansim.results import strict_json
from wansim.results.metric_names import ALL_METRICS, ORDER
from wansim.results.result import Result, jsonable


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(v is None or isinstance(v, (int, float)) for v in value):
            low = "-inf" if value[0] is None else _fmt(value[0])  # a null side: unbounded
            return f"[{low}, {'inf' if value[1] is None else _fmt(value[1])}]"
        vals = [float(v) for v in value]
        if not vals:
            return "-"
        return f"{sum(vals) / len(vals):.3g} [{min(vals):.3g}..{max(vals):.3g}]"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value)


def _mean(value) -> float | None:
    if isinstance(value, (list, tuple)):
        return sum(value) / len(value) if value else None
    return None if value is None else float(value)


def relative_difference(a, b) -> float | None:
    """(a - b) / |b| for numbers (lists compared by their mean); None for flags and text."""
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return None
    x, y = _mean(a), _mean(b)
    if x is None or y is None:
        return None
    if y == 0:
        return 0.0 if x == 0 else math.inf
    return (x - y) / abs(y)


def format_table(results: dict[str, Result]) -> str:
    """A table with one column per engine; with two engines a relative-difference column."""
    engines = list(results)
    first = results[engines[0]]
    names = [n for n in ORDER if any(n in r.metrics for r in results.values())]
    names += sorted({n for r in results.values() for n in r.metrics} - set(names))
    header = ["metric", "unit", *engines]
    both = len(engines) == 2
    if both:
        header.append(f"{engines[0]} vs {engines[1]}")
    rows = []
    for name in names:
        unit = ALL_METRICS.get(name, ("", ""))[0]
        row = [name, unit] + [_fmt(results[e].metrics.get(name)) for e in engines]
        if both:
            a, b = (results[e].metrics.get(name) for e in engines)
            diff = None if name.endswith("_ci95") else relative_difference(a, b)
            row.append("-" if diff is None else f"{diff:+.1%}")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{first.scenario.name}"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells))
    for engine, res in results.items():
        if res.approximation is not None:
            lines += trust_lines(engine, res.approximation)
    return "\n".join(lines)


def trust_lines(engine: str, approximation: dict) -> list[str]:
    """An analytical answer's trust under the table: its regime, whether it is validated
    (with the band measured there) or why not, and its range where it has one."""
    import textwrap

    a = approximation
    if a.get("validated"):
        band = a.get("error_band", {}).get("tokens_per_s")
        head = f"{engine}: {a.get('regime')}, validated"
        text = head + (
            f" (tokens_per_s within {band:.0%} of the DES where measured)" if band else ""
        )
    else:
        text = f"{engine}: {a.get('regime')}, NOT validated: {a.get('why', '')}"
    out = ["", *textwrap.wrap(text, 100, subsequent_indent="  ", break_on_hyphens=False)]
    for metric, (low, high) in a.get("range", {}).items():
        out.append(f"  range {metric}: {_fmt(low)} .. {_fmt(high)}")
    return out


def results_json(results: dict[str, Result]) -> dict:
    """The CLI's --json shape: one engine -> {scenario, engine, metrics}; two -> per engine."""
    if len(results) == 1:
        return next(iter(results.values())).to_json()
    first = next(iter(results.values()))
    out: dict = {"scenario": first.scenario.name, "engine": "both"}
    undefined = {}
    for engine, res in results.items():
        out[engine] = jsonable(res.metrics)
        if res.approximation is not None:
            out["approximation"] = jsonable(res.approximation)
        if reasons := res.undefined():
            undefined[engine] = reasons
    if undefined:
        out["undefined"] = undefined
    return out


def write_outputs(results: dict[str, Result], out_dir: str | Path) -> list[Path]:
    """metrics.json, table.txt, requests.csv (DES) and the PNG plots under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    p = out / "metrics.json"
    p.write_text(strict_json.dumps(results_json(results), indent=2) + "\n")
    written.append(p)
    p = out / "table.txt"
    p.write_text(format_table(results) + "\n")
    written.append(p)
    written += write_run_details(results, out)
    return written


def write_run_details(results: dict[str, Result], out: Path) -> list[Path]:
    """The DES's per-request table (requests.csv) and the run's plots (wansim.results.plots)."""
    from wansim.results.plots import request_table, write_run_plots

    written = []
    if "des" in results and "record" in results["des"].details:
        p = out / "requests.csv"
        request_table(results["des"]).to_csv(p, index=False, float_format="%.6g")
        written.append(p)
    return written + write_run_plots(results, out)


# ----------------------------------------------------------------------------- paper figures
def figures_dir() -> Path | None:
    """``paper_figures/`` of the source checkout holding the working directory (the working
    directory or a folder above it)."""
    here = Path.cwd()
    for candidate in (here, *here.parents):
        if (candidate / "paper_figures").is_dir():
            return candidate / "paper_figures"
    return None


def figure_scripts() -> dict[str, Path]:
    """name -> script for every ``paper_figures/fig_*.py`` (name without ``fig_`` and ``.py``)."""
    from wansim.errors import WansimInputError

    folder = figures_dir()
    if folder is None:
        raise WansimInputError("figures", "no paper_figures/ here (run from a source checkout)")
    return {p.stem.removeprefix("fig_"): p for p in sorted(folder.glob("fig_*.py"))}


def figure_caption(script: Path) -> str:
    """The script's docstring: the question and the scenario."""
    import ast

    return ast.get_docstring(ast.parse(script.read_text())) or ""


def run_figures(
    names: list[str] | None = None, *, out: str | Path | None = None, fast: bool = False
) -> list[tuple[str, bool, float, str]]:
    """Run figure scripts, one process each; returns (name, ok, seconds, output tail).

    Writes ``CAPTIONS.md`` (every figure's question and scenario) next to the figures."""
    import os
    import subprocess
    import sys
    import time

    from wansim.errors import WansimInputError

    scripts = figure_scripts()
    chosen = names or list(scripts)
    for name in chosen:
        if name.removeprefix("fig_") not in scripts:
            raise WansimInputError("figures", f"no such figure (have: {', '.join(scripts)})", name)
    folder = figures_dir()
    out_dir = Path(out) if out else folder / "out"
    env = dict(os.environ, WANSIM_FIGURES_OUT=str(out_dir.resolve()), MPLBACKEND="Agg")
    if fast:
        env["WANSIM_FIGURES_FAST"] = "1"
    results = []
    for name in chosen:
        script = scripts[name.removeprefix("fig_")]
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=folder.parent,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
        results.append(
            (script.stem, proc.returncode == 0, time.perf_counter() - start, "\n".join(tail))
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    captions = ["# Figure captions", ""]
    for name, script in scripts.items():
        captions += [f"## {name}", "", f"Script: `paper_figures/{script.name}`", ""]
        captions += [figure_caption(script), ""]
    (out_dir / "CAPTIONS.md").write_text("\n".join(captions))
    return results

"""Readable tables of results (one engine, or engines side by side with their differences)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from wansim.metrics import METRICS, ORDER
from wansim.result import Result, jsonable


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            return f"[{_fmt(value[0])}, {_fmt(value[1])}]"
        vals = [float(v) for v in value]
        if not vals:
            return "-"
        return f"mean {sum(vals) / len(vals):.3g} (min {min(vals):.3g}, max {max(vals):.3g})"
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
    """(a - b) / |b| for scalars (lists compared by their mean)."""
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
        unit = METRICS.get(name, ("", ""))[0]
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
    return "\n".join(lines)


def results_json(results: dict[str, Result]) -> dict:
    """The CLI's --json shape: one engine -> {scenario, engine, metrics}; two -> per engine."""
    if len(results) == 1:
        return next(iter(results.values())).to_json()
    first = next(iter(results.values()))
    out: dict = {"scenario": first.scenario.name, "engine": "both"}
    for engine, res in results.items():
        out[engine] = jsonable(res.metrics)
    return out


def write_outputs(results: dict[str, Result], out_dir: str | Path) -> list[Path]:
    """metrics.json and table.txt under ``out_dir`` (engines' extra outputs go there too)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    p = out / "metrics.json"
    p.write_text(json.dumps(results_json(results), indent=2) + "\n")
    written.append(p)
    p = out / "table.txt"
    p.write_text(format_table(results) + "\n")
    written.append(p)
    return written

"""``wansim sweep SWEEP.yaml --out DIR [--backend local|dask] [--workers N] [--resume] ...``"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wansim.sweep.executors import BACKENDS

PREVIEW_METRICS = ("tokens_per_s", "tau", "lap_ms_mean", "bytes_per_token")


def cmd_sweep(args: argparse.Namespace) -> int:
    from wansim.results.output_paths import writable_dir
    from wansim.sweep.runner import SweepRunError, run_sweep
    from wansim.sweep.spec import load_sweep

    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("out") / "sweeps" / Path(args.sweep).stem
    writable_dir(out, "--out")
    try:
        outcome = run_sweep(
            sweep,
            out,
            backend=args.backend,
            workers=args.workers,
            scheduler=args.scheduler,
            resume=args.resume,
            overwrite=args.overwrite,
            batch_size=args.batch_size,
            progress=not args.quiet,
        )
    except KeyboardInterrupt:
        print(
            f"interrupted: finished runs are kept in {out}/parts; rerun with --resume to finish",
            file=sys.stderr,
        )
        return 130
    except SweepRunError as err:
        print(f"error: {err}", file=sys.stderr)
        print(f"finished runs are kept in {out}/parts (--resume continues)", file=sys.stderr)
        return 1
    print(outcome.summary())
    if not args.quiet:
        print(preview(outcome.table, outcome.plan.fields))
    return 0


def preview(table, fields: list[str], rows: int = 12) -> str:
    """The first rows: swept fields, seed and the headline metrics (mean over seeds)."""
    metrics = [m for m in PREVIEW_METRICS if m in table.columns]
    if not fields:
        return table[["seed", *metrics]].head(rows).to_string(index=False)
    agg = table.groupby("point", sort=True)
    view = agg[fields].first().join(agg[metrics].mean())
    text = view.head(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")
    if len(view) > rows:
        text += f"\n... {len(view) - rows} more points"
    if table["replicate"].max() > 0:
        text = "(metrics: mean over seeds)\n" + text
    return text


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of scenarios (resumable; local pool or Dask)",
        description="Run every point of a sweep file; results go to DIR/results.parquet.",
    )
    p.add_argument("sweep", help="sweep YAML (base, engine, grid, zip, set, seeds)")
    p.add_argument("--out", metavar="DIR", help="results folder (default out/sweeps/<name>)")
    p.add_argument("--backend", choices=BACKENDS, default="local")
    p.add_argument("--workers", type=int, help="worker processes (default: the CPUs)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler of a running cluster")
    p.add_argument("--resume", action="store_true", help="continue the sweep in DIR")
    p.add_argument("--overwrite", action="store_true", help="discard results already in DIR")
    p.add_argument("--batch-size", type=int, help="runs per task (default: about 8 per worker)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or preview")
    p.set_defaults(func=cmd_sweep)

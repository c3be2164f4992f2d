"""``wansim figures``: regenerate paper_figures/ (PNG + PDF)."""

from __future__ import annotations

import argparse
import sys


def cmd_figures(args: argparse.Namespace) -> int:
    from wansim.results.report import figure_caption, figure_scripts, run_figures

    if args.list:
        for name, script in figure_scripts().items():
            print(f"{name}: {figure_caption(script).splitlines()[0]}")
        return 0
    failed = 0
    for name, ok, seconds, tail in run_figures(args.names, out=args.out, fast=args.fast):
        print(f"{name}: {'ok' if ok else 'FAILED'} ({seconds:.1f} s)")
        if not ok:
            failed += 1
            print("  " + tail.replace("\n", "\n  "), file=sys.stderr)
    return 1 if failed else 0


def register(sub) -> None:
    p = sub.add_parser("figures", help="regenerate paper_figures/ (PNG + PDF)")
    p.add_argument("names", nargs="*", help="figures to make (default: all; see --list)")
    p.add_argument("--out", metavar="DIR", help="output folder (default paper_figures/out)")
    p.add_argument("--fast", action="store_true", help="coarse grids, short DES runs")
    p.add_argument("--list", action="store_true", help="list the figures and their questions")
    p.set_defaults(func=cmd_figures)

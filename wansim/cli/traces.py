"""``wansim traces show|fit|import``: acceptance profiles and traces."""

from __future__ import annotations

import argparse

from wansim.config.user_yaml import read_text
from wansim.data import is_file
from wansim.errors import WansimInputError


def cmd_traces_show(args: argparse.Namespace) -> int:
    import numpy as np

    from wansim.acceptance.closed_form import implied_tau
    from wansim.acceptance.profile import load_profile

    prof = load_profile(args.profile)
    h = prof.header
    print(
        f"{args.profile}: {h.drafter} on {h.target}, K={h.k}, T={h.temperature:g}, {h.verifier}, source: {h.source}"
    )
    names = list(prof.workloads)
    kmax = max(len(w.per_position) for w in prof.workloads.values())
    print("tau(K) (implied at shorter blocks)")
    print("K    " + "".join(f"{n:>10}" for n in names))
    for k in range(1, kmax + 1):
        cells = []
        for n in names:
            p = np.asarray(prof.workloads[n].per_position)
            cells.append(f"{implied_tau(p)[k - 1]:>10.3f}" if k <= len(p) else f"{'-':>10}")
        print(f"{k:<5}" + "".join(cells))
    print("dispersion " + "".join(f"{prof.workloads[n].dispersion:>10.2f}" for n in names))
    return 0


def cmd_traces_fit(args: argparse.Namespace) -> int:
    from wansim.acceptance.profile import write_profile
    from wansim.acceptance.trace import fit_profile, read_trace
    from wansim.config.speculation import VERIFIERS

    frame, meta = read_trace(args.trace)
    # the rule the trace was measured under (the real path's traces say so in their metadata)
    verifier = meta.get("verifier", "lossless")
    if verifier not in VERIFIERS:
        raise WansimInputError(
            f"{args.trace}: verifier", f"must be {' | '.join(VERIFIERS)}", verifier
        )
    try:
        temperature = float(meta.get("temperature", 1.0))
    except ValueError:
        raise WansimInputError(
            f"{args.trace}: temperature", "must be a number", meta["temperature"]
        ) from None
    profile = fit_profile(
        frame,
        drafter=meta.get("drafter", "unknown"),
        target=meta.get("target", "unknown"),
        temperature=temperature,
        verifier=verifier,
        provenance=f"fitted from the trace {args.trace}",
        source="measured",
    )
    write_profile(
        profile, args.out, f"Fitted by `wansim traces fit` from {args.trace} ({len(frame)} steps)."
    )
    _print_profile_summary(profile, args.out)
    return 0


def cmd_traces_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from wansim.acceptance import importers
    from wansim.acceptance.profile import write_profile

    if args.source == "vllm":
        path = Path(args.file)
        if not is_file(path):
            raise WansimInputError("FILE", "file not found", args.file)
        profile = importers.profile_from_vllm(
            read_text(path, "FILE"), workload=args.workload, model=args.model, where=args.file
        )
    else:
        if args.k is None:
            raise WansimInputError(
                "--k", "required for sglang (the run's --speculative-num-steps)", None
            )
        profile = importers.profile_from_sglang(args.file, args.k, workload=args.workload)
    write_profile(
        profile, args.out, f"Imported by `wansim traces import {args.source}` from {args.file}."
    )
    _print_profile_summary(profile, args.out)
    return 0


def _print_profile_summary(profile, out) -> None:
    for name, wl in profile.workloads.items():
        print(
            f"{out}: {name}: K={len(wl.per_position)} tau={wl.tau:.3f} dispersion={wl.dispersion:.2f}"
        )

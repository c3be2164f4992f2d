"""The acceptance of the held-out cells' own prompts, decoded in process: the prompt sample
taken out of the out-of-sample comparison.

A cell of a few prompts accepts differently from the workload its bundle profiled (the tau
band of :mod:`wansim.calibrate.workload_sample`: +-11-31% for 4 prompts x 48 tokens), so a
tokens/s error mixes the deployment model's error with the prompt sample's. Here the cells'
prompts are decoded in process (no pipeline, no links, nothing of the deployment: the same
trace functions and the same pooled fit as the bundle's profiles) and the cells are predicted
again with that acceptance and every cost still from the bundle. The difference between the
two predictions is the prompt sample; what is left is the timing model's error. Greedy
decoding makes the in-process tokens those of the real run, so this acceptance is the cells'
own: the result is labelled ``workload_acceptance`` and never reported as the bundle-only
prediction.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from wansim.calibrate.bundle import FILES, Bundle
from wansim.calibrate.workload_sample import drafter_kind


def workload_profiles(
    samples, bundle: Bundle, target_dir: str, drafter_dir: str, mtp_dir, out: Path
) -> dict:
    """Trace the prompts of every speculative cell in process at its K (``samples``: (cell,
    the prompts its runs decoded); grouped per drafter kind, prompt count and token count: one
    count is one sample, as the rounds draw them), fit a profile per group and K and write it
    (with the bundle's activation-quality table beside it) under ``out``, one per K; returns
    (kind, prompts, tokens, K) -> profile path. Needs torch."""
    from wansim.calibrate.profile_acceptance import (
        acceptance_trace,
        mtp_acceptance_trace,
        per_k_profile_text,
        tree_acceptance_trace,
    )

    groups: dict[tuple, set] = {}
    prompts: dict[int, list] = {}
    for c, sample in samples:
        if c.k > 0:
            groups.setdefault((drafter_kind(c), len(sample), c.tokens), set()).add(c.k)
            prompts[len(sample)] = sample
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(bundle.path / FILES["activation_quality"], out / FILES["activation_quality"])
    paths, frames = {}, []
    for (kind, n, tokens), ks in sorted(groups.items()):
        ks = sorted(ks)
        if kind == "chain":
            trace = acceptance_trace(target_dir, drafter_dir, prompts[n], ks, tokens)
        elif kind == "tree":
            trace = tree_acceptance_trace(target_dir, drafter_dir, prompts[n], ks, tokens)
        else:
            trace = mtp_acceptance_trace(target_dir, mtp_dir, prompts[n], ks, tokens)
        what = f"the held-out cells' {n} prompts x {tokens} tokens, {kind} traces in process"
        for k in ks:  # each K its own fit, as the bundle's profiled K (Bundle.profile_at)
            name = f"acceptance_{kind}_{n}x{tokens}_k{k}.yaml"
            (out / name).write_text(
                per_k_profile_text(
                    trace, kind, k, str(bundle.model["drafter"]), str(bundle.model["target"]), what
                )
            )
            paths[(kind, n, tokens, k)] = out / name
        frames.append(trace.assign(drafter=kind, prompts=n, tokens=tokens))
    pd.concat(frames, ignore_index=True).to_csv(out / "traces.csv", index=False)
    return paths


def recorded_profiles(out: Path) -> dict:
    """The profiles a finished run wrote under ``out`` (for ``--reuse``: no torch)."""
    paths = {}
    for f in sorted(out.glob("acceptance_*_*x*_k*.yaml")):
        kind, size, k = f.stem.split("_")[1:]
        n, tokens = size.split("x")
        paths[(kind, int(n), int(tokens), int(k[1:]))] = f
    return paths

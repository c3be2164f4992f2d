"""A calibration cell's scenario, built from what its real run measured (no torch here).

Everything the simulator sees comes from the run (``measure.decompose``'s per-pass table) or
from the run's own settings; nothing is tuned to make the engines agree:

- ``stages``, ``model.hidden_size`` (the target's), one request at a time (``concurrency: 1``,
  closed), ``workload.prompt_tokens`` and ``output_tokens`` as run;
- ``payload``: the activation bits the real wire carried (32 = fp32 by default), and per
  forward message ``header_bytes`` = what travels with the activations on every forward hop:
  the activation frame's 56-byte header, the draft-ids frame sent ahead of it (56 + 4K bytes)
  and, for lossless sampling, the drafter's K distributions (56 + 4 K V bytes); the return
  message is the 64-byte verdict frame, and with the MTP head also the next pass's drafts that
  ride it back (the same ids and distributions frames). (A prefill carries no drafts: the
  scenario's prefill message is 4K bytes larger than the real one; prefill is not in tokens/s.)
- ``drafter``: the draft model on ``first_stage`` or the MTP head (``kind: mtp``) on
  ``last_stage``, both autoregressive (``parallel: false``), one drafter pass = the measured
  mean drafting time / K (the head's from the last stage's ``draft_ms``, which
  ``measure.decompose`` takes out of that stage's service time, so it is counted once);
- ``model.stage_compute``: one ``table`` per stage with the measured mean service time (frame
  in -> frame out: decode, layers, encode, send; stage 0 also its bookkeeping between steps)
  at n = K + 1 (verify) and n = prompt tokens (prefill);
- ``network.hops``: per hop the configured latency and bandwidth, and ``empirical`` jitter
  resampled from the measured achieved delays (``links: measured``, the default), so the link
  emulator's own error (achieved - scheduled) is in the prediction. The stages' variation
  around their mean service time rides on the hop into that stage (the return hop for stage 0,
  with the drafting variation): with one request in flight nothing queues, so a delay before
  a stage and a longer stage shift the lap alike, and the lap keeps its measured mean and
  spread (see :func:`hop_jitter_samples` for the one adjustment, which keeps the mean). ``links: configured`` uses the configured latency alone (no jitter): what one would
  predict without measuring the links;
- ``drafter.acceptance.profile``: the profile fitted from the run's trace (``profile.yaml``).

Each cell folder holds ``scenario.yaml`` (relative paths to ``profile.yaml`` and the per-hop
``hop{h}_jitter_ms.txt`` sample files), so ``wansim run DIR/scenario.yaml --engine both``
reproduces the cell's prediction (same seed, same requests).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from wansim.calibrate.measure import draft_stage_of, verify_rows
from wansim.links.wire_bytes import TOKEN_ID_BYTES, serialise_ms
from wansim.real.config import DRAFTER_KINDS  # no torch there (settings only)
from wansim.real.frames import HEADER_BYTES as FRAME_HEADER_BYTES  # no torch there either

PROB_BYTES = 4  # fp32 per vocabulary entry
VERDICT_BYTES = FRAME_HEADER_BYTES + 2 * 4  # header + [accepted, next token] int32
LINK_MODES = ("measured", "configured")


PLACEMENT = {"draft_model": "first_stage", "mtp": "last_stage"}


def draft_frames_bytes(k: int, verifier: str, vocab: int) -> int:
    """The drafts' frames of one pass: the ids frame (56 + 4K; sent even when K = 0) and, for
    lossless sampling, the drafter's K distributions (56 + 4 K V)."""
    size = FRAME_HEADER_BYTES + TOKEN_ID_BYTES * k
    if verifier == "lossless" and k > 0:
        size += FRAME_HEADER_BYTES + PROB_BYTES * k * vocab
    return size


def forward_header_bytes(k: int, verifier: str, vocab: int) -> int:
    """Bytes that travel with a verify pass's activations on every forward hop: the activation
    frame's header and the drafts' frames stage 0 sends ahead of it (whichever drafter made
    them: the MTP head's drafts came back with the verdict and go forward the same way)."""
    return FRAME_HEADER_BYTES + draft_frames_bytes(k, verifier, vocab)


def return_message_bytes(k: int, verifier: str, vocab: int, drafter_kind: str) -> int:
    """Bytes of a verify pass on the return hop: the verdict frame, and with the MTP head the
    next pass's drafts (ids, + probabilities when lossless), which ride it back (the head does
    not draft when K = 0)."""
    if drafter_kind == "mtp" and k > 0:
        return VERDICT_BYTES + draft_frames_bytes(k, verifier, vocab)
    return VERDICT_BYTES


def stage_tables(passes: pd.DataFrame, stages: int) -> list[list[list[float]]]:
    """Per stage, table points [[n, mean service ms], ...] (verify n = K + 1, prefill n)."""
    tables = []
    for i in range(stages):
        col = f"service{i}_ms"
        pts = passes.groupby("n_tokens")[col].mean().dropna()
        tables.append([[float(n), float(ms)] for n, ms in pts.sort_index().items()])
    return tables


def hop_jitter_samples(
    passes: pd.DataFrame,
    stages: int,
    latency_ms: float,
    bandwidth_mbps: float,
    forward_bytes: float,
    return_bytes: float,
) -> tuple[list[np.ndarray], list[float], float]:
    """Per hop h, samples J over the verify passes with

        L + ser + J = achieved delay of hop h + the receiving stage's deviation from its mean
                      service time (+ drafting's deviation from its mean, for the drafter's
                      stage: stage 0, or the last stage for the MTP head),

    so the hop plus the stage it feeds keep their measured mean and spread. Where a stage's fast
    passes would make L + J < 0 (its variation exceeds the hop's delay: a busy stage 0 behind a
    short link), the smallest constant that keeps L + J >= 0 moves from the stage's mean service
    time (down to its fastest pass) and then, at the drafter's stage, from the mean drafting
    time (down to its fastest) into J: the lap's mean is unchanged. Returns (samples per hop, ms
    moved out of each stage's verify-pass service, ms moved out of the drafting time)."""
    v = verify_rows(passes)
    draft_stage = draft_stage_of(passes)
    samples, from_stage, from_draft = [], [0.0] * stages, 0.0
    for h in range(stages):
        dst = (h + 1) % stages
        size = return_bytes if h == stages - 1 else forward_bytes
        ser = float(serialise_ms(size, bandwidth_mbps))
        svc = v[f"service{dst}_ms"]
        dev = svc - svc.mean()
        if dst == draft_stage:
            dev = dev + v["draft_ms"] - v["draft_ms"].mean()
        j = (v[f"hop{h}_ms"] - latency_ms - ser + dev).to_numpy(float)
        need = max(0.0, -float(np.min(latency_ms + j)))
        if need > 0:
            from_stage[dst] = min(need, float(svc.mean() - svc.min()))
            if dst == draft_stage:
                from_draft = need - from_stage[dst]
            j = j + need
        samples.append(j)
    return samples, from_stage, from_draft


def build_cell(
    cell_dir: Path,
    passes: pd.DataFrame,
    profile_path: str | None,
    *,
    stages: int,
    latency_ms: float,
    bandwidth_mbps: float,
    k: int,
    verifier: str,
    activation_bits: int,
    hidden_size: int,
    vocab_size: int,
    prompt_tokens: int,
    output_tokens: int,
    des_requests: int,
    seed: int,
    links: str = "measured",
    name: str = "calibration-cell",
    drafter_kind: str = "draft_model",
) -> dict:
    """Write the cell's scenario (and its sample files, the profile copy) and return the raw
    scenario mapping (module docstring: what comes from where)."""
    from wansim.links.wire_bytes import activation_bytes_per_token

    cell_dir.mkdir(parents=True, exist_ok=True)
    v = verify_rows(passes)
    if drafter_kind not in DRAFTER_KINDS:
        raise ValueError(f"drafter_kind must be one of {DRAFTER_KINDS}, got {drafter_kind!r}")
    header = forward_header_bytes(k, verifier, vocab_size)
    fwd = header + (k + 1) * float(activation_bytes_per_token(hidden_size, activation_bits))
    ret = return_message_bytes(k, verifier, vocab_size, drafter_kind)
    tables = stage_tables(passes, stages)
    hops = [{} for _ in range(stages)]
    draft_moved = 0.0
    if links == "measured":
        samples, from_stage, from_draft = hop_jitter_samples(
            passes, stages, latency_ms, bandwidth_mbps, fwd, ret
        )
        for i, moved in enumerate(from_stage):  # only the verify point: the samples' passes
            tables[i] = [[n, ms - moved if n == k + 1 else ms] for n, ms in tables[i]]
        draft_moved = from_draft
        for h, j in enumerate(samples):
            fname = f"hop{h}_jitter_ms.txt"
            text = "\n".join(repr(float(x)) for x in j)
            (cell_dir / fname).write_text(
                f"# hop {h}: achieved delay - {latency_ms:g} ms latency - serialisation, plus the "
                f"receiving stage's service deviation from its mean ({len(j)} verify passes)\n"
                + text
                + "\n"
            )
            hops[h] = {"jitter": {"kind": "empirical", "samples_file": fname}}
    draft_total = float(v["draft_ms"].mean()) - draft_moved if k > 0 else 0.0
    raw: dict = {
        "name": name,
        "seed": int(seed),
        "stages": int(stages),
        "model": {
            "hidden_size": int(hidden_size),
            "compute": {"kind": "table", "points": [list(pt) for pt in tables[0]]},
            "stage_compute": [{"kind": "table", "points": t} for t in tables],
        },
        "network": {
            "latency_ms": float(latency_ms),
            "bandwidth_mbps": float(bandwidth_mbps),
            "jitter": {"kind": "none"},
            "loss_rate": 0.0,
            "hops": hops,
        },
        "payload": {
            "activation_bits": int(activation_bits),
            "header_bytes": int(header),
            "return_bytes": int(ret),
        },
        "workload": {
            "requests": int(des_requests),
            "concurrency": 1,
            "prompt_tokens": int(prompt_tokens),
            "output_tokens": int(output_tokens),
            "arrival": "closed",
        },
        "schedule": {"kind": "sync"},
    }
    if k > 0:
        prof = Path(profile_path)
        (cell_dir / "profile.yaml").write_text(prof.read_text())
        raw["drafter"] = {
            "kind": drafter_kind,
            "placement": PLACEMENT[drafter_kind],
            "parallel": False,
            "draft_ms": draft_total / k,
            "acceptance": {"profile": "profile.yaml"},
        }
        raw["speculation"] = {"policy": "chain", "k": int(k), "verifier": verifier}
    else:
        raw["drafter"] = {
            "kind": drafter_kind,
            "placement": PLACEMENT[drafter_kind],
            "draft_ms": 0.0,
        }
        raw["speculation"] = {"policy": "none", "verifier": verifier}
    comment = (
        f"# Calibration cell: {stages} stages, {latency_ms:g} ms per hop, K={k}, {verifier}, "
        f"{drafter_kind} drafter ({PLACEMENT[drafter_kind]}).\n"
        "# Built by `wansim calibrate` from the real run's measurements (see\n"
        "# wansim/calibrate/cells.py): per-stage mean service times, measured hop delays as\n"
        f"# empirical jitter ({links} links), drafting time, fitted acceptance profile.\n"
        "# Re-run: wansim run scenario.yaml --engine both\n"
    )
    text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=None)
    (cell_dir / "scenario.yaml").write_text(comment + text)
    return raw

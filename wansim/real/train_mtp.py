"""Train the MTP-like draft head (``wansim.real.mtp``) on the frozen tiny target.

Same text and held-out split as ``train_tiny`` (its corpus functions). Each step takes a batch
of random 128-byte windows, runs the frozen target once (no gradients) for its final-norm hidden
states H and next-byte distributions p, and unrolls the head ``depth`` times from every
position i: step d reads (h_{d-1}, emb(x_{i+d})) with h_0 = H_i and teacher-forced true bytes,
and is trained towards the target's own distribution p(. | x_<=i+d) (soft cross-entropy, i.e.
self-distillation: acceptance is agreement with the target, not with the text). The loss is the
mean over depths. Seeded and step-based: the same seed, steps and thread count give the same
weights (``--max-seconds`` is a safety cap, recorded when it fires).

    python -m wansim.real.train_mtp --out models/tiny-mtp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class MTPTrainSpec:
    """Training schedule of the head (its shape is ``MTPConfig``)."""

    steps: int = 1200
    lr: float = 3e-3
    batch_size: int = 16
    seq_len: int = 128
    depth: int = 4
    warmup_steps: int = 50
    inner_size: int = 128


def _unrolled_loss(head, target, batch, depth: int):
    """Mean over depths of the soft cross-entropy against the target's distributions."""
    import torch

    with torch.no_grad():
        hid = target.model(input_ids=batch).last_hidden_state  # after the final norm
        logp_t = torch.log_softmax(target.lm_head(hid).float(), -1)
        emb = target.model.embed_tokens(batch)
    n = batch.shape[1] - depth  # start positions i with x_{i+depth} inside the window
    h = hid[:, :n]
    losses = []
    for d in range(1, depth + 1):
        h = head(h, emb[:, d : d + n])
        logq = torch.log_softmax(target.lm_head(target.model.norm(h)).float(), -1)
        p = logp_t[:, d : d + n].exp()  # target's distribution of x_{i+d+1}
        losses.append(-(p * logq).sum(-1).mean())
    return torch.stack(losses)


def train_head(
    target,
    train_data,
    held_data,
    spec: MTPTrainSpec,
    seed: int = 0,
    max_seconds: float = 1e9,
    log=lambda msg: None,
):
    """Train one head on ``target`` (frozen); return (head, info dict)."""
    import torch

    from wansim.real.mtp import MTPConfig, MTPHead

    for prm in target.parameters():
        prm.requires_grad_(False)
    target.eval()
    torch.manual_seed(seed)
    cfg = MTPConfig(
        hidden_size=int(target.config.hidden_size),
        inner_size=spec.inner_size,
        vocab_size=int(target.config.vocab_size),
        rms_norm_eps=float(target.config.rms_norm_eps),
    )
    head = MTPHead(cfg)
    n_params = sum(p.numel() for p in head.parameters())
    opt = torch.optim.AdamW(head.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1)
    n = len(train_data) - spec.seq_len - 1

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    head.train()
    t0 = time.perf_counter()
    steps_done, capped = 0, False
    for step in range(spec.steps):
        starts = torch.randint(0, n, (spec.batch_size,), generator=gen)
        batch = train_data[starts[:, None] + torch.arange(spec.seq_len)[None, :]]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = _unrolled_loss(head, target, batch, spec.depth).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        steps_done = step + 1
        elapsed = time.perf_counter() - t0
        if step % 100 == 0 or step == spec.steps - 1:
            log(f"mtp step {step} loss {loss.item():.3f} elapsed {elapsed:.0f}s")
        if elapsed > max_seconds:
            capped = True
            log(f"mtp: --max-seconds {max_seconds} reached at step {steps_done}")
            break
    train_seconds = time.perf_counter() - t0
    head.eval()
    held = held_out_losses(head, target, held_data, spec)
    log(f"mtp: {steps_done} steps in {train_seconds:.0f}s, held-out per depth {held}")
    info = {
        "spec": asdict(spec),
        "head": asdict(cfg),
        "params": n_params,
        "seed": seed,
        "steps_done": steps_done,
        "capped_by_max_seconds": capped,
        "train_seconds": round(train_seconds, 1),
        "held_out_soft_ce_per_depth_nats": held,
    }
    return head, info


def held_out_losses(head, target, held_data, spec: MTPTrainSpec, windows: int = 128) -> list:
    """Soft cross-entropy to the target per depth (nats) over evenly spaced held-out windows."""
    import torch

    n = len(held_data) - spec.seq_len - 1
    starts = torch.linspace(0, n, windows).long()
    total = torch.zeros(spec.depth)
    chunks = starts.split(32)
    with torch.no_grad():
        for chunk in chunks:
            batch = held_data[chunk[:, None] + torch.arange(spec.seq_len)[None, :]]
            total += _unrolled_loss(head, target, batch, spec.depth)
    return [round(float(x), 4) for x in total / len(chunks)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models/tiny-mtp")
    ap.add_argument("--target", default="models/tiny-target")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=MTPTrainSpec.steps)
    ap.add_argument("--max-seconds", type=float, default=300.0, help="safety cap")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from wansim.real.model import load_lm
    from wansim.real.mtp import save_head
    from wansim.real.train_tiny import corpus_tensors

    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    _, held_files, train_data, held_data = corpus_tensors()
    target = load_lm(args.target)
    spec = MTPTrainSpec(steps=args.steps)
    head, info = train_head(target, train_data, held_data, spec, args.seed, args.max_seconds, log)
    corpus = {
        "python": sys.version.split()[0],
        "train_bytes": len(train_data),
        "held_out_bytes": len(held_data),
        "held_out_files": [f.name for f in held_files],
        "torch": torch.__version__,
        "threads": args.threads,
    }
    out = save_head(head, args.out, {"target": Path(args.target).name})
    (out / "training.json").write_text(
        json.dumps({**info, "target": Path(args.target).name, "corpus": corpus}, indent=1) + "\n"
    )
    log(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

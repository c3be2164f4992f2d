"""Train the tiny byte-level target/drafter pair shipped in ``models/``.

Both models are ``transformers`` ``LlamaForCausalLM`` over a 256-symbol byte vocabulary (token id
== byte value), trained from scratch on text every Python install has: the standard library's
top-level ``*.py`` files (code) and ``pydoc_data/topics.py`` (prose). Files are held out by a hash
of their name (``crc32(name) % 20 == 0``), so the held-out loss measures text never trained on.

Seeded and step-based: the same seed, steps and thread count give the same weights. Wall time is
recorded, not used as a stopping rule (``--max-seconds`` is only a safety cap, and the README says
when it fired).

    python -m wansim.real.train_tiny --out models/tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

HOLDOUT_MODULUS = 20  # crc32(file name) % 20 == 0 -> held out (~5% of files)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape and training schedule of one tiny Llama model."""

    name: str
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    steps: int
    lr: float
    batch_size: int = 16
    seq_len: int = 128
    warmup_steps: int = 100


TARGET_SPEC = TinyModelSpec(
    name="tiny-target",
    layers=6,
    hidden_size=128,
    intermediate_size=352,
    heads=4,
    steps=2400,
    lr=3e-3,
)
DRAFTER_SPEC = TinyModelSpec(
    name="tiny-drafter",
    layers=1,
    hidden_size=128,
    intermediate_size=352,
    heads=4,
    steps=1200,
    lr=3e-3,
)


def corpus_files() -> tuple[list[Path], list[Path]]:
    """Return (train, held_out) source files: stdlib top-level ``*.py`` plus pydoc topics."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    topics = stdlib / "pydoc_data" / "topics.py"
    if topics.exists():
        files.append(topics)
    train, held = [], []
    for f in files:
        (held if zlib.crc32(f.name.encode()) % HOLDOUT_MODULUS == 0 else train).append(f)
    return train, held


def load_bytes(files: list[Path]) -> bytes:
    """Concatenate files, each preceded by a NUL separator."""
    return b"".join(b"\x00" + f.read_bytes() for f in files)


def llama_config(spec: TinyModelSpec):
    """``LlamaConfig`` for a byte-level model of this spec."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


def train_one(spec: TinyModelSpec, train_data, held_data, seed: int, max_seconds: float, log):
    """Train one model; return (model, info dict)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(spec))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1)
    n = len(train_data) - spec.seq_len - 1

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    t0 = time.perf_counter()
    steps_done = 0
    capped = False
    for step in range(spec.steps):
        starts = torch.randint(0, n, (spec.batch_size,), generator=gen)
        idx = starts[:, None] + torch.arange(spec.seq_len)[None, :]
        batch = train_data[idx]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps_done = step + 1
        elapsed = time.perf_counter() - t0
        if step % 100 == 0 or step == spec.steps - 1:
            log(f"{spec.name} step {step} loss {loss.item():.3f} elapsed {elapsed:.0f}s")
        if elapsed > max_seconds:
            capped = True
            log(f"{spec.name}: --max-seconds {max_seconds} reached at step {steps_done}")
            break
    train_seconds = time.perf_counter() - t0
    held_loss = held_out_loss(model, held_data, spec.seq_len)
    log(f"{spec.name}: {steps_done} steps in {train_seconds:.0f}s, held-out {held_loss:.3f} nats/B")
    info = {
        "spec": asdict(spec),
        "params": n_params,
        "seed": seed,
        "steps_done": steps_done,
        "capped_by_max_seconds": capped,
        "train_seconds": round(train_seconds, 1),
        "held_out_loss_nats_per_byte": round(held_loss, 4),
    }
    return model, info


def held_out_loss(model, held_data, seq_len: int, windows: int = 256) -> float:
    """Mean next-byte cross-entropy (nats) over evenly spaced held-out windows."""
    import torch

    model.eval()
    n = len(held_data) - seq_len - 1
    starts = torch.linspace(0, n, windows).long()
    losses = []
    with torch.no_grad():
        for chunk in starts.split(32):
            idx = chunk[:, None] + torch.arange(seq_len)[None, :]
            batch = held_data[idx]
            losses.append(model(input_ids=batch, labels=batch).loss.item())
    return sum(losses) / len(losses)


def corpus_tensors():
    """(train files, held-out files, train bytes, held-out bytes) as long tensors."""
    import torch

    train_files, held_files = corpus_files()
    train_data = torch.frombuffer(bytearray(load_bytes(train_files)), dtype=torch.uint8).long()
    held_data = torch.frombuffer(bytearray(load_bytes(held_files)), dtype=torch.uint8).long()
    return train_files, held_files, train_data, held_data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models/tiny", help="prefix: writes OUT-target/, OUT-drafter/")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, default=TARGET_SPEC.steps)
    ap.add_argument("--drafter-steps", type=int, default=DRAFTER_SPEC.steps)
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="safety cap per model")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    train_files, held_files, train_data, held_data = corpus_tensors()
    log(
        f"train {len(train_data)} bytes ({len(train_files)} files), held out {len(held_data)} bytes"
    )
    corpus = {
        "python": sys.version.split()[0],
        "train_bytes": len(train_data),
        "held_out_bytes": len(held_data),
        "held_out_files": [f.name for f in held_files],
        "torch": torch.__version__,
        "threads": args.threads,
    }
    specs = [
        (TARGET_SPEC, args.target_steps, "target"),
        (DRAFTER_SPEC, args.drafter_steps, "drafter"),
    ]
    for i, (base, steps, role) in enumerate(specs):
        spec = TinyModelSpec(**{**asdict(base), "steps": steps})
        model, info = train_one(
            spec, train_data, held_data, args.seed + 1000 * i, args.max_seconds, log
        )
        out = Path(f"{args.out}-{role}")
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        (out / "wansim_tokenizer.json").write_text(json.dumps({"kind": "bytes"}) + "\n")
        (out / "training.json").write_text(json.dumps({**info, "corpus": corpus}, indent=1) + "\n")
        log(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

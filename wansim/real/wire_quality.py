"""What compressed activations on the wire do to the target (measured in process).

:class:`WiredTarget` is the staged target of a real pipeline in one process: P shards, and
between consecutive shards every forward hop's activations go through the wire codec
(``wansim.real.codec``: fp32, fp16, or symmetric 8/4/3-bit codes with one fp16 scale per group
of ``group_size`` values of the hidden dimension, i.e. per token and per group) exactly as the
stage processes encode and decode them. The return hop carries token ids (never compressed).

:func:`activation_quality` measures, per bit width, against the fp32 target:

- ``kl_mean`` / ``kl_p90``: KL(p_fp32 || p_bits) of the next-token distribution (T = 1, nats),
  teacher-forced on each prompt followed by its fp32 greedy continuation;
- ``token_agreement``: fraction of greedy tokens equal to the fp32 greedy output, position by
  position, and ``identical_prefix`` (tokens before the first difference);
- ``acceptance_rate`` (greedy, K drafts) and ``acceptance_lossless`` (T = 1) of the drafter
  against the *compressed* target, and their ratio to fp32 (the acceptance penalty);
- ``target_exact``: whether the compressed target decoded exactly the fp32 greedy tokens on
  every measured prompt (``token_agreement == 1``). Below that, lossless verification is exact
  for the compressed target only, not for the model that was trained.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wansim.real import codec
from wansim.real.config import split_layers
from wansim.real.frames import Kind
from wansim.real.model import StageShard


class WiredTarget:
    """P stage shards with the wire codec on every forward hop (``forward(x, pos)`` like one
    :class:`StageShard` of the whole target)."""

    def __init__(self, load, target_dir: str, stages: int, bits: int, group_size: int = 128):
        codec.check_bits(bits)
        model = load(target_dir)
        n = len(model.model.layers)
        self.shards = [StageShard(load(target_dir), lo, hi) for lo, hi in split_layers(n, stages)]
        self.bits, self.group_size = bits, group_size

    def wire(self, h: torch.Tensor) -> torch.Tensor:
        if self.bits == 32:
            return h
        frame = codec.encode(Kind.HIDDEN, h.cpu().numpy(), self.bits, self.group_size)
        return torch.from_numpy(codec.decode(frame).copy())

    @torch.no_grad()
    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        for i, shard in enumerate(self.shards):
            x = shard.forward(x, pos)
            if i < len(self.shards) - 1:
                x = self.wire(x)
        return x

    def reset(self) -> None:
        for s in self.shards:
            s.reset()


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> np.ndarray:
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1).numpy()


@torch.no_grad()
def activation_quality(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence,
    bits: Sequence[int] = (32, 16, 8, 4, 3),
    stages: int = 2,
    k: int = 4,
    max_new_tokens: int = 32,
    group_size: int = 128,
) -> list[dict]:
    """Rows per bit width (module docstring); the first row must be the 32-bit reference."""
    from wansim.real.model import load_lm
    from wansim.real.speculative import Drafter, plain_decode, speculative_decode

    torch.set_num_threads(1)
    if not bits or bits[0] != 32:
        bits = (32, *[b for b in bits if b != 32])
    fp32 = load_lm(target_dir)
    refs = [plain_decode(fp32, list(p.tokens), max_new_tokens) for p in prompts]
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    rows, base = [], None
    for b in bits:
        wired = WiredTarget(load_lm, target_dir, stages, b, group_size)
        kl, same, prefix, acc_g, acc_l = [], [], [], [], []
        for j, (p, ref) in enumerate(zip(prompts, refs, strict=True)):
            ids = [*p.tokens, *ref]
            wired.reset()
            got = wired.forward(torch.tensor(ids), 0)[len(p.tokens) - 1 : -1]
            want = StageShard(fp32, 0, len(fp32.model.layers)).forward(torch.tensor(ids), 0)
            kl.extend(_kl(want[len(p.tokens) - 1 : -1], got))
            wired.reset()
            out, a = speculative_decode(
                None, drafter, list(p.tokens), max_new_tokens, k, shard=wired
            )
            same.extend(x == y for x, y in zip(out, ref, strict=True))
            prefix.append(
                next((i for i, (x, y) in enumerate(zip(out, ref, strict=True)) if x != y), len(ref))
            )
            acc_g.extend(a)
            wired.reset()
            _, a = speculative_decode(
                None, drafter, list(p.tokens), max_new_tokens, k, "lossless", 1.0, 0, j, wired
            )
            acc_l.extend(a)
        row = {
            "activation_bits": b,
            "stages": stages,
            "kl_mean": float(np.mean(kl)),
            "kl_p90": float(np.percentile(kl, 90)),
            "token_agreement": float(np.mean(same)),
            "identical_prefix_mean": float(np.mean(prefix)),
            "acceptance_rate": float(np.sum(acc_g) / (k * len(acc_g))),
            "acceptance_lossless": float(np.sum(acc_l) / (k * len(acc_l))),
            "target_exact": bool(np.all(same)),
        }
        if base is None:
            base = row
        row["acceptance_ratio"] = row["acceptance_rate"] / base["acceptance_rate"]
        row["acceptance_lossless_ratio"] = row["acceptance_lossless"] / base["acceptance_lossless"]
        rows.append(row)
    return rows

"""An MTP-like draft head at the last stage (DeepSeek-V3 style multi-token prediction).

Model. The head reads the target's final-layer hidden state **after the final norm** (the vector
the LM head reads; ``StageShard.hidden`` on the last stage) at the last committed position t,
and the target's own embedding of the token x_{t+1} committed after it, and predicts x_{t+2}::

    g   = proj([rmsnorm_h(h_t); rmsnorm_e(emb(x_{t+1}))])          # 2H -> H
    h'  = g + down(silu(up(rmsnorm_m(g))))                          # one residual MLP block
    q   = softmax(lm_head(final_norm(h')) / T)                      # the target's, shared, frozen

Chained K times: step i feeds its own output h' and the token it drafted, so one verify pass
yields K drafts with their distributions q_1..q_K (argmax at T = 0, sampled from q_i at T > 0),
which the unchanged verifiers of :mod:`wansim.real.speculative` accept or reject (the drafts are
drawn from q_i given the prefix, which is all lossless rejection sampling assumes). Only the head
is trained (``wansim.real.train_mtp``); the embedding, final norm and LM head are the target's.
The head has no attention: everything it knows about the context is in h_t.

Checkpoint directory: ``mtp_config.json`` (shape, and what it reads) and ``mtp.safetensors``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from wansim.real.config import MTP_FILES, check_mtp_dir
from wansim.real.errors import RealConfigError
from wansim.real.model import StageShard
from wansim.real.speculative import (
    check_decoding,
    draft_token,
    prompt_generators,
    sample_first,
    verify,
)

CONFIG_NAME, WEIGHTS_NAME = MTP_FILES
READS = "final-norm hidden state of the last committed position"


@dataclass(frozen=True)
class MTPConfig:
    """Shape of one head; ``reads`` documents which hidden state it was trained on."""

    hidden_size: int
    inner_size: int = 128
    vocab_size: int = 256
    rms_norm_eps: float = 1e-5
    reads: str = READS
    kind: str = "wansim-mtp-head"


class MTPHead(nn.Module):
    """The trainable part: two input norms, a 2H -> H projection, one residual MLP block."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.cfg = cfg
        self.norm_h = nn.RMSNorm(h, eps=eps)
        self.norm_e = nn.RMSNorm(h, eps=eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.norm_m = nn.RMSNorm(h, eps=eps)
        self.up = nn.Linear(h, cfg.inner_size, bias=False)
        self.down = nn.Linear(cfg.inner_size, h, bias=False)

    def forward(self, hidden: torch.Tensor, token_emb: torch.Tensor) -> torch.Tensor:
        """``hidden``, ``token_emb`` [..., H] -> the next hidden state [..., H]."""
        g = self.proj(torch.cat([self.norm_h(hidden), self.norm_e(token_emb)], dim=-1))
        return g + self.down(nn.functional.silu(self.up(self.norm_m(g))))


class MTPDrafter:
    """A trained head wired to a target's (frozen) embedding, final norm and LM head."""

    def __init__(self, head: MTPHead, target):
        self.head = head.eval()
        self.embed = target.model.embed_tokens
        self.final_norm = target.model.norm
        self.lm_head = target.lm_head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(hidden)).float()

    @torch.no_grad()
    def draft(
        self,
        hidden: torch.Tensor,
        token: int,
        k: int,
        temperature: float,
        gen: torch.Generator,
    ) -> tuple[list[int], torch.Tensor | None]:
        """K drafts after ``token`` from ``hidden`` (the target's final-norm state at the position
        before ``token``) and (T > 0) their distributions q [K, vocab] in float32."""
        drafts: list[int] = []
        qs = []
        h = hidden.reshape(-1)
        tok = int(token)
        for _ in range(k):
            h = self.head(h, self.embed(torch.tensor(tok, device=h.device)))
            logits = self.logits(h).cpu()  # sampling happens on the CPU generator
            tok, qi = draft_token(logits, temperature, gen)
            if qi is not None:
                qs.append(qi)
            drafts.append(tok)
        return drafts, (torch.stack(qs) if qs else None)


def save_head(head: MTPHead, out: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write ``mtp_config.json`` and ``mtp.safetensors`` (float32)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().float() for k, v in head.state_dict().items()}
    save_file(state, str(out / WEIGHTS_NAME))
    (out / CONFIG_NAME).write_text(json.dumps({**asdict(head.cfg), **(extra or {})}, indent=1))
    return out


def load_head(path: str | os.PathLike, hidden_size: int | None = None) -> MTPHead:
    """Load a head; ``hidden_size`` (the target's) must match the head's."""
    from safetensors.torch import load_file

    p = check_mtp_dir(path)
    raw = json.loads((p / CONFIG_NAME).read_text())
    fields = MTPConfig.__dataclass_fields__
    cfg = MTPConfig(**{k: v for k, v in raw.items() if k in fields})
    if hidden_size is not None and cfg.hidden_size != hidden_size:
        raise RealConfigError(
            "mtp_dir", f"head hidden size must equal the target's {hidden_size}", cfg.hidden_size
        )
    head = MTPHead(cfg)
    head.load_state_dict(load_file(str(p / WEIGHTS_NAME)))
    return head.eval()


def load_mtp(path: str | os.PathLike, target) -> MTPDrafter:
    """The head in ``path`` wired to ``target`` (a loaded Llama-family causal LM)."""
    head = load_head(path, int(target.config.hidden_size))
    return MTPDrafter(head, target)


@torch.no_grad()
def mtp_speculative_decode(
    target,
    drafter: MTPDrafter,
    prompt: list[int],
    max_new_tokens: int,
    k: int,
    verifier: str = "greedy",
    temperature: float = 0.0,
    seed: int = 0,
    prompt_index: int = 0,
) -> tuple[list[int], list[int]]:
    """In-process reference of the pipeline with the head at the last stage: (new tokens,
    accepted per step). Same order as the pipeline: the prefill commits the first token, the
    head drafts from the prompt's last hidden state; after every verify pass it drafts from the
    hidden state of the last accepted position and the bonus/corrected token. Random streams as
    :func:`wansim.real.speculative.prompt_generators` (drafts: the first, verification: the
    second), so the staged run draws the same tokens."""
    check_decoding(verifier, temperature, k)
    shard = StageShard(target, 0, len(target.model.layers))
    dgen, vgen = prompt_generators(seed, prompt_index)
    logits = shard.forward(torch.tensor(prompt), 0)
    committed = list(prompt)
    committed.append(sample_first(logits[-1], verifier, temperature, vgen))
    drafts, q = drafter.draft(shard.hidden[-1], committed[-1], k, temperature, dgen)
    accepted_trace: list[int] = []
    while len(committed) - len(prompt) < max_new_tokens:
        logits = shard.forward(torch.tensor([committed[-1], *drafts]), len(committed) - 1)
        v = verify(logits, drafts, q, verifier, temperature, vgen)
        committed.extend(drafts[: v.accepted])
        committed.append(v.next_token)
        accepted_trace.append(v.accepted)
        drafts, q = drafter.draft(shard.hidden[v.accepted], v.next_token, k, temperature, dgen)
    return committed[len(prompt) :][:max_new_tokens], accepted_trace

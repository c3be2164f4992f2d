"""Loading causal LMs from a local directory and cutting them into pipeline stages.

One code path for every model: a Llama-family checkpoint (``LlamaForCausalLM`` and relatives
with ``model.embed_tokens / layers / norm / rotary_emb`` and ``lm_head``) loaded with
``from_pretrained`` from a local directory, ``HF_HUB_OFFLINE=1``, never the hub. A stage keeps
layers ``[lo, hi)`` (plus the embedding on the first stage, the final norm and LM head on the
last) and its own ``DynamicCache``; before each pass it crops the cache to the pass's start
position, which is how rejected draft positions are rolled back. The stage runs
``LlamaModel.forward`` itself on the kept layers, so masks and rotary positions are the model's
own. Float32 on CPU by default.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from wansim.real.errors import RealConfigError

# Modules from_pretrained imports lazily (~2 s): import them now, so that processes forked from
# the runner's forkserver (which imports this module once) load a checkpoint in ~50 ms.
for _name in (
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.modeling_auto",
    "transformers.core_model_loading",
    "transformers.conversion_mapping",
    "transformers.integrations.hub_kernels",
):
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)
with contextlib.suppress(Exception):
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
    _hf_logging.set_verbosity_error()


def check_model_dir(path: str | os.PathLike, field: str) -> Path:
    """A local checkpoint directory with a ``config.json``; else :class:`RealConfigError`."""
    p = Path(path)
    if not p.is_dir():
        raise RealConfigError(field, "must be an existing local checkpoint directory", str(path))
    if not (p / "config.json").is_file():
        raise RealConfigError(
            field, "has no config.json (not a transformers checkpoint)", str(path)
        )
    return p


def load_lm(
    path: str | os.PathLike,
    *,
    field: str = "target_dir",
    noise: float = 0.0,
    noise_seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """Load a causal LM from a local directory (eval mode); optionally add weight noise."""
    p = check_model_dir(path, field)
    if not noise >= 0:
        raise RealConfigError("drafter_noise", "must be >= 0", noise)
    model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype)
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
        raise RealConfigError(
            field, "must be a Llama-family causal LM (model.layers, lm_head)", type(model).__name__
        )
    model.eval()
    if noise > 0:
        add_weight_noise(model, noise, noise_seed)
    return model


@torch.no_grad()
def add_weight_noise(model, sigma: float, seed: int) -> None:
    """W += sigma * std(W) * N(0, 1) for every matrix (norm gains and biases untouched).

    The drafter-quality knob: on the tiny pair, greedy acceptance falls continuously as sigma
    grows (see docs/real.md). Tied embeddings get the noise once.
    """
    gen = torch.Generator().manual_seed(seed)
    for _, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if param.ndim >= 2:
            noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
            param.add_(noise * (sigma * param.std()))


def num_layers(model) -> int:
    return len(model.model.layers)


class StageShard:
    """Layers ``[lo, hi)`` of a loaded model with their own KV cache.

    ``forward(x, pos)``: ``x`` is int64 token ids ``[n]`` on the first stage, else float hidden
    states ``[n, hidden]``; returns hidden states ``[n, hidden]``, or logits ``[n, vocab]`` on
    the last stage. The cache is cropped to ``pos`` first (``pos`` = absolute position of the
    pass's first token); a ``pos`` beyond the cache is an error (a pass went missing). The last
    stage keeps the pass's hidden states after the final norm in ``hidden`` (for an MTP head).
    """

    def __init__(self, model, lo: int, hi: int):
        inner = model.model
        total = len(inner.layers)
        if not 0 <= lo < hi <= total:
            raise RealConfigError("layer range", f"must satisfy 0 <= lo < hi <= {total}", [lo, hi])
        self.first = lo == 0
        self.last = hi == total
        self.lo, self.hi = lo, hi
        layers = torch.nn.ModuleList(list(inner.layers)[lo:hi])
        for j, layer in enumerate(layers):
            layer.self_attn.layer_idx = j
        cfg = copy.deepcopy(inner.config)
        cfg.num_hidden_layers = hi - lo
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = list(cfg.layer_types)[lo:hi]
        inner.layers = layers
        inner.config = cfg
        if not self.last:
            inner.norm = torch.nn.Identity()
        self.inner = inner
        self.lm_head = model.lm_head if self.last else None
        self.embed = inner.embed_tokens if self.first else None
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(model.config.vocab_size)
        self.config = cfg
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache(config=cfg)
        self.hidden: torch.Tensor | None = (
            None  # last stage: final-norm hidden states of the last pass
        )

    @property
    def cache_len(self) -> int:
        return int(self.cache.get_seq_length())

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)

    def crop_to(self, pos: int) -> None:
        """Drop cached positions >= ``pos`` (rollback of rejected drafts)."""
        cur = self.cache_len
        if pos > cur:
            raise ValueError(f"pass starts at position {pos} but the KV cache holds {cur}")
        if pos == 0:
            self.reset()
        elif pos < cur:
            self.cache.crop(-(cur - pos))

    @torch.no_grad()
    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        self.crop_to(pos)
        n = x.shape[0]
        position_ids = torch.arange(pos, pos + n).unsqueeze(0)
        if self.first:
            out = self.inner(
                input_ids=x.long().unsqueeze(0),
                position_ids=position_ids,
                cache=self.cache,
                use_cache=True,
            )
        else:
            out = self.inner(
                inputs_embeds=x.to(self.dtype).unsqueeze(0),
                position_ids=position_ids,
                cache=self.cache,
                use_cache=True,
            )
        h = out.last_hidden_state[0]
        if self.last:
            self.hidden = h  # after the final norm: what the LM head (and an MTP head) reads
            return self.lm_head(h).float()
        return h


# ----------------------------------------------------------------------------- tokenizers
@dataclass(frozen=True)
class ByteTokenizer:
    """Token id == byte value (the tiny pair's vocabulary)."""

    def encode(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        return list(data)

    def decode(self, ids) -> str:
        return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")


def load_tokenizer(path: str | os.PathLike):
    """``wansim_tokenizer.json`` ``{"kind": "bytes"}`` -> bytes; otherwise the local HF tokenizer."""
    p = check_model_dir(path, "target_dir")
    marker = p / "wansim_tokenizer.json"
    if marker.is_file() and json.loads(marker.read_text()).get("kind") == "bytes":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(p, local_files_only=True)

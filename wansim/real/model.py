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
    device: str = "cpu",
):
    """Load a causal LM from a local directory (eval mode); optionally add weight noise (drawn
    on the CPU, so a model is the same on every device); then move it to ``device``."""
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
    if device != "cpu":
        model.to(device)
    return model


def check_device(device: str) -> str:
    """``cpu``, or ``cuda``/``cuda:N`` when torch sees that GPU; else :class:`RealConfigError`.
    Several stages may name the same GPU (each process holds its own shard on it)."""
    if device == "cpu":
        return device
    if not torch.cuda.is_available():
        raise RealConfigError(
            "device",
            f"needs a CUDA GPU, but torch {torch.__version__} sees none on this machine "
            "(use --device cpu)",
            device,
        )
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise RealConfigError(
            "device", f"names GPU {index}; this machine has {torch.cuda.device_count()}", device
        )
    return device


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
        self.request = 0  # whose cache ``cache`` is; the others wait in ``caches``
        self.caches: dict[int, DynamicCache] = {}
        self.hidden: torch.Tensor | None = (
            None  # last stage: final-norm hidden states of the last pass
        )

    @property
    def cache_len(self) -> int:
        return int(self.cache.get_seq_length())

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)

    def reset_all(self) -> None:
        """Forget every request's cache."""
        self.caches.clear()
        self.request = 0
        self.reset()

    def select(self, request: int) -> None:
        """Make ``request``'s KV cache the current one (several requests in flight: one cache
        each, a new request starts empty)."""
        if request == self.request:
            return
        if self.request >= 0:  # -1: after a batched pass every cache is in ``caches``
            self.caches[self.request] = self.cache
        cache = self.caches.pop(request, None)
        self.cache = cache if cache is not None else DynamicCache(config=self.config)
        self.request = request

    def crop_to(self, pos: int) -> None:
        """Drop cached positions >= ``pos`` (rollback of rejected drafts)."""
        cur = self.cache_len
        if pos > cur:
            raise ValueError(f"pass starts at position {pos} but the KV cache holds {cur}")
        if pos == 0:
            self.reset()
        elif pos < cur:
            self.cache.crop(-(cur - pos))

    def keep_path(self, base: int, nodes: list[int]) -> None:
        """Tree rollback: the cache holds ``base`` prefix positions followed by a verified tree's
        nodes (in node order); keep the prefix and the ``nodes`` (the accepted path, root first)
        in that order, dropping every other node. Their rotary positions were ``base + depth``,
        which is where they now sit."""
        cur = self.cache_len
        idx = [base + int(n) for n in nodes]
        if idx and (min(idx) < base or max(idx) >= cur):
            raise ValueError(f"tree nodes {list(nodes)} beyond the cache ({cur} from {base})")
        device = self.device
        sel = torch.tensor(list(range(base)) + idx, dtype=torch.long, device=device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, sel)
            layer.values = layer.values.index_select(-2, sel)

    @property
    def device(self) -> torch.device:
        return next(self.inner.parameters()).device

    @torch.no_grad()
    def forward_tree(
        self, x: torch.Tensor, pos: int, parents: list[int], first: int = 0
    ) -> torch.Tensor:
        """One pass over tree nodes ``first..n-1`` (``parents[i] < i``, node 0 the root at
        absolute position ``pos``; ``parents[0] == -1``) with a tree attention mask: node i sees
        the prefix ``[0, pos)`` and its own ancestors (and itself), at position ``pos +
        depth(i)``. The cache must hold the prefix and nodes ``0..first-1``; it is cropped to
        that first. Returns the stage's output for the new nodes (as :meth:`forward`)."""
        from wansim.real.tree_mask import tree_attention_mask, tree_depths

        n = len(parents)
        self.crop_to(pos + first)
        dev = self.device
        depth = tree_depths(parents)
        position_ids = (pos + torch.tensor(depth[first:], dtype=torch.long)).unsqueeze(0).to(dev)
        mask = tree_attention_mask(parents, pos, first, self.dtype).to(dev)
        assert x.shape[0] == n - first, (x.shape, n, first)
        return self._run(x, position_ids, mask)

    @torch.no_grad()
    def forward_batch(self, x: torch.Tensor, segments: list[tuple[int, int, int]]) -> torch.Tensor:
        """One forward over the blocks of several requests (continuous batching).

        ``segments``: ``(request, pos, n)`` per block, in row order of ``x`` (the blocks packed
        one after another: ragged lengths, no padding). Each request's cache is cropped to its
        ``pos`` (rollback), the caches are laid side by side in one temporary cache, and a
        block-diagonal mask lets a block's row t see its own request's cache and its own rows
        ``0..t`` only, at positions ``pos + t``: each block is computed as if it were alone
        (tested against separate passes). Afterwards each request's cache is its old cache plus
        its block's new keys and values. Returns the packed output rows (as :meth:`forward`)."""
        if sum(n for _, _, n in segments) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} rows for blocks of {[s[2] for s in segments]} tokens")
        if len({r for r, _, _ in segments}) != len(segments):
            raise ValueError("a batched pass carries each request at most once")
        dev = self.device
        caches, lens = [], []
        for request, pos, _ in segments:
            self.select(request)
            self.crop_to(pos)
            caches.append(self.cache)
            lens.append(pos)
        total_cached, total_new = sum(lens), x.shape[0]
        layers = int(self.config.num_hidden_layers)
        joint = DynamicCache(config=self.config)
        if total_cached:
            for li in range(layers):
                ks = [c.layers[li].keys for c, n in zip(caches, lens, strict=True) if n]
                vs = [c.layers[li].values for c, n in zip(caches, lens, strict=True) if n]
                joint.update(torch.cat(ks, dim=-2), torch.cat(vs, dim=-2), li)
        allowed = torch.zeros(total_new, total_cached + total_new, dtype=torch.bool)
        positions = []
        cache_off = row = 0
        for (_, pos, n), cached in zip(segments, lens, strict=True):
            rows = slice(row, row + n)
            allowed[rows, cache_off : cache_off + cached] = True
            allowed[rows, total_cached + row : total_cached + row + n] = torch.tril(
                torch.ones(n, n, dtype=torch.bool)
            )
            positions.extend(range(pos, pos + n))
            cache_off += cached
            row += n
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask[~allowed] = torch.finfo(self.dtype).min
        position_ids = torch.tensor(positions, dtype=torch.long, device=dev).unsqueeze(0)
        self.cache = joint
        out = self._run(x, position_ids, mask[None, None].to(dev))
        # split the joint cache back: request r = its cached span + its new rows
        cache_off = row = 0
        for (request, _, n), cached in zip(segments, lens, strict=True):
            new = DynamicCache(config=self.config)
            idx = list(range(cache_off, cache_off + cached))
            idx += range(total_cached + row, total_cached + row + n)
            sel = torch.tensor(idx, dtype=torch.long, device=dev)
            for li in range(layers):
                layer = joint.layers[li]
                new.update(layer.keys.index_select(-2, sel), layer.values.index_select(-2, sel), li)
            self.caches[request] = new
            cache_off += cached
            row += n
        self.request = -1  # every request's cache is in ``caches`` now
        self.cache = DynamicCache(config=self.config)
        return out

    @torch.no_grad()
    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        self.crop_to(pos)
        n = x.shape[0]
        position_ids = torch.arange(pos, pos + n, device=self.device).unsqueeze(0)
        return self._run(x, position_ids, None)

    def _run(self, x: torch.Tensor, position_ids: torch.Tensor, mask) -> torch.Tensor:
        dev = self.device
        if self.first:
            out = self.inner(
                input_ids=x.long().to(dev).unsqueeze(0),
                position_ids=position_ids,
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
            )
        else:
            out = self.inner(
                inputs_embeds=x.to(device=dev, dtype=self.dtype).unsqueeze(0),
                position_ids=position_ids,
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
            )
        h = out.last_hidden_state[0]
        if self.last:
            self.hidden = h  # after the final norm: what the LM head (and an MTP head) reads
            return self.lm_head(h).float().cpu()  # the verifier samples on the CPU
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

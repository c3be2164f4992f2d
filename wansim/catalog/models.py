"""Model catalog: architectures as their published ``config.json`` files give them.

Every preset carries the config values (``config`` source: the Hugging Face repository whose
``config.json`` they come from) and the published parameter totals (``published`` source: the
model card). Everything else -- parameters per layer, active parameters, KV-cache bytes per
token -- is *derived* here from the config by the formulas below, and tests check the derived
totals against the published ones (within 1%).

Parameters per layer (weights only; norms and biases ignored, < 0.1%):

- GQA attention: h*(H*d) + 2*h*(G*d) + (H*d)*h   (q, k, v, o; H heads, G kv heads, d head_dim)
- MLA attention: h*q_r + q_r*H*(n+r) + h*(c+r) + c*H*(n+v) + H*v*h   (q_r: q_lora_rank, c:
  kv_lora_rank, n/r: nope/rope head dims, v: v_head_dim) + the sparse-attention indexer
  q_r*I*i + h*i + h*I (I indexer heads of dim i) where the model has one
- DeepSeek-V4 attention (single latent KV of d = head_dim): h*q_r + q_r*H*d + h*d + H*d*o_r +
  g*o_r*h (grouped low-rank output, g groups of rank o_r); compressed layers add a KV
  compressor 2*h*d per ratio window (x2 overlapping at ratio 4) and CSA layers an indexer
  q_r*I*i + h*I + 4*h*i (approximate: the compressor/indexer shapes are reconstructed from the
  reference inference code's description, < 0.5% of the total)
- dense MLP (SwiGLU): 3*h*f;  MoE: (E + S)*3*h*m + h*E (router), S shared experts of width m
- embeddings: V*h, and V*h more for an untied output head

KV-cache bytes per token per layer (``kv_bytes``: bytes per element, 2 for bf16):

- GQA: 2*G*d*bytes (K and V);  MLA: (c + r)*bytes (the compressed latent and the rope key)
- DeepSeek-V4: a CSA layer (ratio 4) keeps one (d + i)-wide entry per 4 tokens -> (d + i)/4
  *bytes; an HCA layer (ratio 128) d/128*bytes; every layer also keeps a 128-token sliding
  window (a fixed d*128*bytes per sequence). Checked against the published 1M-token KV size.
- sliding-window layers (gpt-oss): a fixed window*2*G*d*bytes per sequence, nothing per token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wansim.errors import WansimInputError

BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5625, "mxfp4": 0.53125}
"""Stored bytes per weight: nvfp4 = 4 bits + one fp8 scale per 16 values (4.5 bits); mxfp4 =
4 bits + one 8-bit scale per 32 values (4.25 bits); fp8 block scales (1 per 128x128) ignored."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    layers: int
    hidden_size: int
    vocab_size: int
    attention: str  # gqa | mla | dsv4
    heads: int
    kv_heads: int = 0
    head_dim: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    compress_ratios: tuple[int, ...] = ()  # dsv4: per layer 0 (window only), 4 (CSA), 128 (HCA)
    sliding_layers: tuple[int, ...] = ()  # layers attending only to the last ``sliding_window``
    sliding_window: int = 0
    dense_layers: int = 0  # the first layers use a dense MLP of ``intermediate_size``
    intermediate_size: int = 0
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate_size: int = 0
    tied_embeddings: bool = False
    mtp_layers_in_total: int = 0  # next-token-prediction layers the published total counts
    native_dtype: tuple[str, str] = ("bf16", "bf16")  # (experts, everything else)
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8", "nvfp4")
    drafters: tuple[str, ...] = ()
    published_params_b: float = 0.0
    published_active_params_b: float = 0.0
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------ structure
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def layer_is_moe(self, i: int) -> bool:
        return self.is_moe and i >= self.dense_layers

    @property
    def expert_params(self) -> float:
        """One routed expert's parameters (SwiGLU: 3*h*m)."""
        return 3.0 * self.hidden_size * self.moe_intermediate_size

    def attention_params(self, i: int) -> float:
        h, H = self.hidden_size, self.heads
        if self.attention == "gqa":
            d, G = self.head_dim, self.kv_heads
            return h * H * d + 2 * h * G * d + H * d * h
        if self.attention == "mla":
            qr, c = self.q_lora_rank, self.kv_lora_rank
            n, r, v = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
            q = h * qr + qr * H * (n + r) if qr else h * H * (n + r)
            p = q + h * (c + r) + c * H * (n + v) + H * v * h
            if self.index_heads:
                p += qr * self.index_heads * self.index_head_dim + h * self.index_head_dim
                p += h * self.index_heads
            return float(p)
        if self.attention == "dsv4":
            qr, d = self.q_lora_rank, self.head_dim
            p = h * qr + qr * H * d + h * d + H * d * self.o_lora_rank
            p += self.o_groups * self.o_lora_rank * h
            ratio = self.compress_ratios[i] if self.compress_ratios else 0
            if ratio:
                p += 2 * h * d * (2 if ratio == 4 else 1)
            if ratio == 4:
                ii, ih = self.index_head_dim, self.index_heads
                p += qr * ih * ii + h * ih + 4 * h * ii
            return float(p)
        raise ValueError(f"unknown attention kind {self.attention}")

    def ffn_dense_params(self, i: int) -> float:
        """Parameters read for every token in layer i: dense MLP, or shared experts + router."""
        if not self.layer_is_moe(i):
            return 3.0 * self.hidden_size * self.intermediate_size
        return self.shared_experts * self.expert_params + self.hidden_size * self.experts

    def routed_params(self, i: int) -> float:
        return self.experts * self.expert_params if self.layer_is_moe(i) else 0.0

    def layer_params(self, i: int) -> float:
        return self.attention_params(i) + self.ffn_dense_params(i) + self.routed_params(i)

    @property
    def embedding_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def head_params(self) -> float:
        return 0.0 if self.tied_embeddings else self.embedding_params

    def total_params(self) -> float:
        """Derived total: every layer + embeddings + head (+ MTP layers the total counts)."""
        body = sum(self.layer_params(i) for i in range(self.layers))
        mtp = self.mtp_layers_in_total * (
            self.layer_params(self.layers - 1) + 2 * self.hidden_size**2
        )
        return body + mtp + self.embedding_params + self.head_params

    def active_params(self) -> float:
        """Derived parameters used per token: dense parts + k routed experts + head."""
        body = sum(
            self.attention_params(i)
            + self.ffn_dense_params(i)
            + (self.experts_per_token * self.expert_params if self.layer_is_moe(i) else 0.0)
            for i in range(self.layers)
        )
        return body + self.head_params + (self.embedding_params if self.tied_embeddings else 0)

    # ------------------------------------------------------------------ KV cache
    def kv_bytes_per_token_layer(self, i: int, kv_bytes: float = 2.0) -> float:
        """KV-cache bytes each token adds in layer i (module docstring)."""
        if i in self.sliding_layers:
            return 0.0
        if self.attention == "gqa":
            return 2.0 * self.kv_heads * self.head_dim * kv_bytes
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_bytes
        ratio = self.compress_ratios[i] if self.compress_ratios else 0
        if ratio == 4:
            return (self.head_dim + self.index_head_dim) / 4.0 * kv_bytes
        if ratio:
            return self.head_dim / ratio * kv_bytes
        return 0.0

    def kv_fixed_bytes_layer(self, i: int, kv_bytes: float = 2.0) -> float:
        """KV bytes per sequence independent of its length (sliding windows)."""
        if self.attention == "dsv4":
            return 128.0 * self.head_dim * kv_bytes
        if i in self.sliding_layers:
            return self.sliding_window * 2.0 * self.kv_heads * self.head_dim * kv_bytes
        return 0.0

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        return sum(self.kv_bytes_per_token_layer(i, kv_bytes) for i in range(self.layers))

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params_b": round(self.total_params() / 1e9, 2),
            "active_params_b": round(self.active_params() / 1e9, 2),
            "layers": self.layers,
            "hidden_size": self.hidden_size,
            "kv_bytes_per_token": round(self.kv_bytes_per_token(), 1),
            "published_params_b": self.published_params_b,
            "experts": self.experts,
            "experts_per_token": self.experts_per_token,
            "attention": self.attention,
            "weight_dtypes": list(self.weight_dtypes),
            "drafters": list(self.drafters),
            "source": {**self.sources, "derived": DERIVED_SOURCE},
        }


def _alternating(first: int, layers: int, a: int, b: int) -> tuple[int, ...]:
    return tuple(a if (i - first) % 2 == 0 else b for i in range(first, layers))


_HF = "https://huggingface.co/"
DERIVED_SOURCE = (
    "derived from the config by the formulas of wansim.catalog.models: parameters per layer,"
    " params_b, active_params_b, kv_bytes_per_token (checked against the published totals)"
)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(
            name="deepseek-v4-pro",
            family="DeepSeek-V4 (CSA/HCA hybrid attention, MoE)",
            layers=61,
            hidden_size=7168,
            vocab_size=129280,
            attention="dsv4",
            heads=128,
            kv_heads=1,
            head_dim=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            o_groups=16,
            o_lora_rank=1024,
            index_heads=64,
            index_head_dim=128,
            compress_ratios=(128, 128, *_alternating(2, 61, 4, 128)),
            experts=384,
            experts_per_token=6,
            shared_experts=1,
            moe_intermediate_size=3072,
            mtp_layers_in_total=1,
            native_dtype=("mxfp4", "fp8"),
            weight_dtypes=("mxfp4+fp8", "fp8", "nvfp4"),
            drafters=("dspark-v4pro", "mtp-v4pro"),
            published_params_b=1600.0,
            published_active_params_b=49.0,
            sources={
                "config": _HF + "deepseek-ai/DeepSeek-V4-Pro config.json (as quoted in"
                " lzwjava.github.io/deepseek-v4-pro-architecture-and-code-overview-en and"
                " glennklockwood.com/garden/DeepSeek-V4-Pro): 61 layers, hidden 7168, 128"
                " heads x 512, q_lora 1536, o_lora 1024 in 16 groups, 384 routed + 1 shared"
                " experts of 3072, 6 per token, vocab 129280, FP4 experts + FP8 rest",
                "compress_ratios": "reconstructed: layers 0-1 HCA, 2-60 alternating CSA/HCA"
                " (30 CSA + 31 HCA; glennklockwood.com/garden/DeepSeek-V4-Pro)",
                "published": "model card: 1.6T total (two significant figures), 49B activated;"
                " our derived total counts the one MTP layer the checkpoint ships",
                "kv_check": "derived 9,848 B/token at bf16 vs 9.62 GiB per 1M tokens = 9,851"
                " B/token (vLLM's DeepSeek-V4 KV breakdown as summarised on r/LocalLLaMA,"
                " 'The exact KV cache usage of DeepSeek V4')",
                "drafters": "Literature review, Pluralis, compiled August-October 2026, Parts"
                " V and VIII (DSpark shipped in the checkpoint; native MTP)",
            },
        ),
        ModelSpec(
            name="deepseek-v4-flash",
            family="DeepSeek-V4 (CSA/HCA hybrid attention, MoE)",
            layers=43,
            hidden_size=4096,
            vocab_size=129280,
            attention="dsv4",
            heads=64,
            kv_heads=1,
            head_dim=512,
            q_lora_rank=1024,
            qk_rope_head_dim=64,
            o_groups=8,
            o_lora_rank=1024,
            index_heads=64,
            index_head_dim=128,
            compress_ratios=(0, 0, *_alternating(2, 43, 4, 128)),
            experts=256,
            experts_per_token=6,
            shared_experts=1,
            moe_intermediate_size=2048,
            native_dtype=("mxfp4", "fp8"),
            weight_dtypes=("mxfp4+fp8", "fp8", "nvfp4"),
            drafters=("mtp-v4pro",),
            published_params_b=284.33,
            published_active_params_b=13.0,
            sources={
                "config": _HF + "deepseek-ai/DeepSeek-V4-Flash config.json (the official"
                " geometry as pinned by public loaders): 43 layers, hidden 4096, 64 heads x"
                " 512, q_lora 1024, o_lora 1024 in 8 groups, indexer 64 x 128, 256 routed + 1"
                " shared experts of 2048, 6 per token, vocab 129280, expert_dtype fp4",
                "compress_ratios": "reconstructed: layers 0-1 window only, 2-42 alternating"
                " CSA/HCA (21 + 20); reproduces the published 6.72 GiB per 1M tokens at bf16",
                "published": "284.33B: llama.cpp's parameter count of the converted checkpoint"
                " (ggml-org/llama.cpp PR #24162 benchmark table); model card: 284B, 13B"
                " activated",
            },
        ),
        ModelSpec(
            name="glm-5.2",
            family="GLM-5 (MLA + DSA indexer, MoE)",
            layers=78,
            hidden_size=6144,
            vocab_size=154880,
            attention="mla",
            heads=64,
            q_lora_rank=2048,
            kv_lora_rank=512,
            qk_nope_head_dim=192,
            qk_rope_head_dim=64,
            v_head_dim=256,
            index_heads=32,
            index_head_dim=128,
            dense_layers=3,
            intermediate_size=12288,
            experts=256,
            experts_per_token=8,
            shared_experts=1,
            moe_intermediate_size=2048,
            drafters=("dflash-glm52",),
            published_params_b=744.0,
            published_active_params_b=40.0,
            sources={
                "config": _HF + "zai-org/GLM-5.2 config.json (glm_moe_dsa; as reproduced in"
                " public GLM-5.2 conversion fixtures): 78 layers, hidden 6144, 64 heads, q_lora"
                " 2048, kv_lora 512, nope 192 / rope 64 / v 256, indexer 32 x 128, first 3"
                " layers dense (12288), 256 routed + 1 shared experts of 2048, 8 per token,"
                " vocab 154880",
                "published": "744B total, 40B activated (GLM-5 series model card)",
                "drafters": "Literature review, Pluralis, compiled August-October 2026, Part V"
                " (DFlash and DSpark exist for GLM-5.2)",
            },
        ),
        ModelSpec(
            name="minimax-m2.5",
            family="MiniMax-M2 (GQA, MoE)",
            layers=62,
            hidden_size=3072,
            vocab_size=200064,
            attention="gqa",
            heads=48,
            kv_heads=8,
            head_dim=128,
            experts=256,
            experts_per_token=8,
            moe_intermediate_size=1536,
            native_dtype=("fp8", "fp8"),
            weight_dtypes=("fp8", "bf16", "nvfp4"),
            published_params_b=230.0,
            published_active_params_b=10.0,
            sources={
                "config": _HF + "MiniMaxAI/MiniMax-M2.5 config.json (minimax_m2 architecture,"
                " shared with MiniMax-M2): 62 layers, hidden 3072, 48 heads, 8 KV heads x 128,"
                " 256 experts of 1536, 8 per token, vocab 200064, FP8 weights; 3 MTP modules"
                " not counted",
                "published": "230B total, 10B activated (MiniMax-M2 model card)",
            },
        ),
        ModelSpec(
            name="gpt-oss-120b",
            family="gpt-oss (GQA with alternating sliding windows, MoE)",
            layers=36,
            hidden_size=2880,
            vocab_size=201088,
            attention="gqa",
            heads=64,
            kv_heads=8,
            head_dim=64,
            sliding_layers=tuple(range(0, 36, 2)),
            sliding_window=128,
            experts=128,
            experts_per_token=4,
            moe_intermediate_size=2880,
            native_dtype=("mxfp4", "bf16"),
            weight_dtypes=("mxfp4+bf16", "bf16", "fp8"),
            drafters=("eagle3",),
            published_params_b=116.83,
            published_active_params_b=5.13,
            sources={
                "config": _HF + "openai/gpt-oss-120b config.json: 36 layers alternating"
                " sliding (128) and full attention, hidden 2880, 64 heads, 8 KV heads x 64,"
                " 128 experts of 2880, 4 per token, vocab 201088, MXFP4 experts",
                "published": "116.83B total, 5.13B active (gpt-oss model card, Table 1)",
            },
        ),
        ModelSpec(
            name="gpt-oss-20b",
            family="gpt-oss (GQA with alternating sliding windows, MoE)",
            layers=24,
            hidden_size=2880,
            vocab_size=201088,
            attention="gqa",
            heads=64,
            kv_heads=8,
            head_dim=64,
            sliding_layers=tuple(range(0, 24, 2)),
            sliding_window=128,
            experts=32,
            experts_per_token=4,
            moe_intermediate_size=2880,
            native_dtype=("mxfp4", "bf16"),
            weight_dtypes=("mxfp4+bf16", "bf16", "fp8"),
            published_params_b=20.91,
            published_active_params_b=3.61,
            sources={
                "config": _HF + "openai/gpt-oss-20b config.json: 24 layers alternating"
                " sliding (128) and full attention, hidden 2880, 64 heads, 8 KV heads x 64,"
                " 32 experts of 2880, 4 per token, vocab 201088, MXFP4 experts",
                "published": "20.91B total, 3.61B active (gpt-oss model card, Table 1); used"
                " to check MoE compute against a published single-request decode rate",
            },
        ),
        ModelSpec(
            name="qwen3-235b-a22b",
            family="Qwen3 MoE (GQA)",
            layers=94,
            hidden_size=4096,
            vocab_size=151936,
            attention="gqa",
            heads=64,
            kv_heads=4,
            head_dim=128,
            experts=128,
            experts_per_token=8,
            moe_intermediate_size=1536,
            drafters=("eagle3",),
            published_params_b=235.0,
            published_active_params_b=22.0,
            sources={
                "config": _HF + "Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64"
                " heads, 4 KV heads x 128, 128 experts of 1536, 8 per token, vocab 151936",
                "published": "235B total, 22B activated (model card)",
            },
        ),
        ModelSpec(
            name="llama-3.1-70b",
            family="Llama 3.1 (dense, GQA)",
            layers=80,
            hidden_size=8192,
            vocab_size=128256,
            attention="gqa",
            heads=64,
            kv_heads=8,
            head_dim=128,
            dense_layers=80,
            intermediate_size=28672,
            drafters=("eagle3", "draft-model"),
            published_params_b=70.55,
            published_active_params_b=70.55,
            sources={
                "config": _HF + "meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192,"
                " 64 heads, 8 KV heads x 128, MLP 28672, vocab 128256",
                "published": "70.55B (safetensors total on the model page; 70B in the card)",
            },
        ),
        ModelSpec(
            name="llama-3.1-405b",
            family="Llama 3.1 (dense, GQA)",
            layers=126,
            hidden_size=16384,
            vocab_size=128256,
            attention="gqa",
            heads=128,
            kv_heads=8,
            head_dim=128,
            dense_layers=126,
            intermediate_size=53248,
            drafters=("eagle3", "draft-model"),
            published_params_b=405.0,
            published_active_params_b=405.0,
            sources={
                "config": _HF + "meta-llama/Llama-3.1-405B config.json: 126 layers, hidden"
                " 16384, 128 heads, 8 KV heads x 128, MLP 53248, vocab 128256",
                "published": "405B (model card)",
            },
        ),
        ModelSpec(
            name="llama-3.1-8b",
            family="Llama 3.1 (dense, GQA)",
            layers=32,
            hidden_size=4096,
            vocab_size=128256,
            attention="gqa",
            heads=32,
            kv_heads=8,
            head_dim=128,
            dense_layers=32,
            intermediate_size=14336,
            drafters=("eagle3", "draft-model"),
            published_params_b=8.03,
            published_active_params_b=8.03,
            sources={
                "config": _HF + "meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096,"
                " 32 heads, 8 KV heads x 128, MLP 14336, vocab 128256",
                "published": "8.03B (safetensors total on the model page; 8B in the card)",
            },
        ),
        ModelSpec(
            name="llama-2-7b",
            family="Llama 2 (dense, MHA)",
            layers=32,
            hidden_size=4096,
            vocab_size=32000,
            attention="gqa",
            heads=32,
            kv_heads=32,
            head_dim=128,
            dense_layers=32,
            intermediate_size=11008,
            drafters=("draft-model",),
            published_params_b=6.74,
            published_active_params_b=6.74,
            sources={
                "config": _HF + "meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096,"
                " 32 heads x 128 (MHA), MLP 11008, vocab 32000",
                "published": "6.74B (model page); used to check compute against TensorRT-LLM's"
                " published decode throughput",
            },
        ),
    ]
}


def model_preset(name: str, path: str = "model.preset") -> ModelSpec:
    if name not in MODELS:
        raise WansimInputError(path, f"unknown model (known: {', '.join(MODELS)})", name)
    return MODELS[name]


def with_overrides(model: ModelSpec, overrides: Mapping[str, Any], path: str) -> ModelSpec:
    """A preset with some config fields replaced (``model: {preset: X, layers: 40}``)."""
    names = {f.name for f in dataclasses.fields(ModelSpec)} - {"name", "sources"}
    changes = {}
    for key, value in overrides.items():
        if key not in names:
            raise WansimInputError(f"{path}.{key}", "unknown model field", value)
        default = getattr(model, key)
        if isinstance(default, int) and not isinstance(default, bool):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise WansimInputError(f"{path}.{key}", "must be an integer >= 0", value)
        elif isinstance(default, float) and (not isinstance(value, (int, float)) or value < 0):
            raise WansimInputError(f"{path}.{key}", "must be a number >= 0", value)
        changes[key] = tuple(value) if isinstance(default, tuple) else value
    if not changes:
        return model
    sources = dict(model.sources)
    sources["overrides"] = "user: " + ", ".join(f"{k}={v}" for k, v in changes.items())
    return dataclasses.replace(model, sources=sources, **changes)

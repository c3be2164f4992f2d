"""A pipeline stage = a contiguous slice of a catalog model's layers on one catalog GPU.

Compute: the stage's ``compute.py`` model (``moe`` for MoE models, ``roofline`` for dense
ones) with every figure derived from the catalogs -- the slice's dense parameters (attention,
dense MLPs, shared experts, routers; the output head on the last stage), its routed experts
(one "expert" of the stage = the same expert index in each of its MoE layers, so touched
experts under uniform top-k routing follow compute.py's formula layer by layer), weight bytes
per dtype, the KV cache read for ``batch`` sequences at the mean decode context
(prompt + output/2: the KV read is linear in context, so in the memory-bound regime the mean
pass time over a decode equals the time at the mean context), the GPU's bandwidth and dense
peak for the weight dtype, and the launch overhead of its layers.

Memory: weights + KV for ``batch`` sequences at the *full* context (prompt + output) +
activations + the drafter (last stage) + a fixed runtime reserve, in GB (1e9 bytes).
Activations: ``tokens`` in flight per pass x (16 hidden-size buffers at bf16), plus fp32
logits over the vocabulary on the last stage; the runtime reserve (CUDA context, allocator
slack) is assumed 1.5 GB.
"""

from __future__ import annotations

import dataclasses

from wansim.catalog.hardware import HardwareSpec
from wansim.catalog.models import BYTES_PER_PARAM, ModelSpec
from wansim.config.model import MoeCompute, RooflineCompute

RUNTIME_RESERVE_GB = 1.5
ACTIVATION_BUFFERS = 16
DSPARK_V4PRO_PARAMS_B = 77.50  # Literature review, Pluralis, Aug-Oct 2026, Part VIII


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per parameter for routed experts and for everything else, and per KV element."""

    expert_bytes: float
    other_bytes: float
    kv_bytes: float
    compute_dtype: str  # fp4 | fp8 | bf16: which tensor-core peak applies

    @classmethod
    def for_model(cls, model: ModelSpec, weight_dtype: str, kv_dtype: str) -> Precision:
        if weight_dtype == "native":
            expert, other = model.native_dtype
        else:
            expert = other = weight_dtype
        eb, ob = BYTES_PER_PARAM[expert], BYTES_PER_PARAM[other]
        compute = "fp4" if max(eb, ob) < 1 else ("fp8" if max(eb, ob) <= 1 else "bf16")
        return cls(eb, ob, BYTES_PER_PARAM[kv_dtype], compute)


@dataclasses.dataclass(frozen=True)
class StageSlice:
    first: int  # first layer (inclusive)
    last: int  # last layer (inclusive)
    is_first: bool
    is_last: bool

    @property
    def layers(self) -> int:
        return self.last - self.first + 1


@dataclasses.dataclass(frozen=True)
class Load:
    """What the stage serves: ``batch`` sequences of ``context_tokens`` (prompt + output)
    verifying ``tokens_per_seq`` tokens per pass."""

    batch: int
    prompt_tokens: int
    output_tokens: int
    tokens_per_seq: int
    drafter: str | None  # drafter preset on the last stage

    @property
    def max_context(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def mean_context(self) -> float:
        return self.prompt_tokens + self.output_tokens / 2


def _params(model: ModelSpec, s: StageSlice) -> tuple[float, float, int]:
    """(dense params read per pass, routed params per expert index, MoE layers) for a slice."""
    dense = sum(model.attention_params(i) + model.ffn_dense_params(i) for i in _range(s))
    if s.is_last:
        dense += model.head_params
    moe_layers = sum(1 for i in _range(s) if model.layer_is_moe(i))
    return dense, moe_layers * model.expert_params, moe_layers


def _range(s: StageSlice) -> range:
    return range(s.first, s.last + 1)


def compute_model(
    model: ModelSpec,
    hw: HardwareSpec,
    s: StageSlice,
    prec: Precision,
    load: Load,
    *,
    cuda_graphs: bool = True,
    cpu_loaded: bool = False,
) -> MoeCompute | RooflineCompute:
    dense, per_expert, moe_layers = _params(model, s)
    kv_token = sum(model.kv_bytes_per_token_layer(i, prec.kv_bytes) for i in _range(s))
    kv_fixed = sum(model.kv_fixed_bytes_layer(i, prec.kv_bytes) for i in _range(s))
    # KV bytes read per pass for the batch at the mean context, as bytes per "context token"
    context = round(load.batch * load.mean_context)
    kv_per_token = kv_token + (kv_fixed / load.mean_context if load.mean_context else 0.0)
    common = {
        "kv_bytes_per_token": kv_per_token,
        "context_tokens": context,
        "mem_bandwidth_gbs": hw.mem_bandwidth_gbs,
        "peak_tflops": hw.peak_tflops(prec.compute_dtype),
        "overhead_ms": hw.overhead_ms(s.layers, cuda_graphs, cpu_loaded),
    }
    if moe_layers:
        return MoeCompute(
            dense_params_b=dense / 1e9,
            experts=model.experts,
            experts_per_token=model.experts_per_token,
            expert_params_b=per_expert / 1e9,
            bytes_per_param=prec.other_bytes,
            expert_bytes_per_param=prec.expert_bytes,
            **common,
        )
    return RooflineCompute(params_b=dense / 1e9, bytes_per_param=prec.other_bytes, **common)


def drafter_params(model: ModelSpec, drafter: str | None) -> float:
    """Parameters of the drafter held on the last stage: DSpark for V4-Pro from the review's
    ledger (Part VIII); MTP = one extra layer + its 2h x h projection (derived); other learned
    heads assumed one decoder layer; n-gram and separate draft models (first stage) none."""
    if drafter in (None, "ngram", "draft-model"):
        return 0.0
    if drafter == "dspark-v4pro":
        return DSPARK_V4PRO_PARAMS_B * 1e9
    return model.layer_params(model.layers - 1) + 2 * model.hidden_size**2


def memory_gb(model: ModelSpec, s: StageSlice, prec: Precision, load: Load) -> dict[str, float]:
    """Memory the stage needs, by part (module docstring), in GB."""
    dense, per_expert, _ = _params(model, s)
    if s.is_first:
        dense += model.embedding_params
    weights = dense * prec.other_bytes + per_expert * model.experts * prec.expert_bytes
    kv_token = sum(model.kv_bytes_per_token_layer(i, prec.kv_bytes) for i in _range(s))
    kv_fixed = sum(model.kv_fixed_bytes_layer(i, prec.kv_bytes) for i in _range(s))
    kv = load.batch * (kv_token * load.max_context + kv_fixed)
    tokens = load.batch * load.tokens_per_seq
    act = tokens * ACTIVATION_BUFFERS * model.hidden_size * 2.0
    drafter = 0.0
    if s.is_last:
        act += tokens * model.vocab_size * 4.0
        drafter = drafter_params(model, load.drafter) * prec.expert_bytes
    parts = {
        "weights": weights / 1e9,
        "kv": kv / 1e9,
        "activations": act / 1e9,
        "drafter": drafter / 1e9,
        "reserve": RUNTIME_RESERVE_GB,
    }
    parts["total"] = sum(parts.values())
    return parts


def kv_gb_per_sequence(model: ModelSpec, s: StageSlice, prec: Precision, context: int) -> float:
    kv_token = sum(model.kv_bytes_per_token_layer(i, prec.kv_bytes) for i in _range(s))
    kv_fixed = sum(model.kv_fixed_bytes_layer(i, prec.kv_bytes) for i in _range(s))
    return (kv_token * context + kv_fixed) / 1e9

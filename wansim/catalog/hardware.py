"""Hardware catalog: one accelerator per node, as its vendor datasheet gives it.

Fields: memory (GB, 1e9 bytes), memory bandwidth (GB/s), dense tensor TFLOPS per dtype (no
structured sparsity), interconnect, a per-layer kernel-launch overhead and its host-CPU
sensitivity, and an hourly price. Every figure has a source (``sources``): the datasheet for
the chip, a dated public price list (URL and date) for the price, published measurements for
the launch overheads; what is derived says so, with its formula.

Launch overhead (``launch_ms_per_layer``, sources in ``OVERHEAD_SOURCE``): with CUDA graphs a
decode pass replays one graph, ~10 kernels per layer at ~0.9 us each (CUDA.jl measured 70 us
for an 80-kernel graph, 0.875 us a kernel) -> 0.01 ms/layer (derived: 10 x ~1 us). Eager
launches cost ``eager_factor`` = 5x more: between the 3.7x CUDA.jl measured (260 us eager vs
70 us graph, same 80 kernels) and the ~20 us a PyTorch kernel's launch round trip takes in
NVIDIA's Nsight Systems measurement (~20x a graph replay). A loaded host CPU slows eager
launches by ``loaded_cpu_factor`` = 3x, inside the 1.36-5.40x slowdown Chung et al. measured
for CPU-starved multi-GPU LLM inference; graphs are insensitive to the host. The 5x and 3x are
choices inside published ranges, labelled so; override them per node
(``hardware: {preset: h100-sxm, launch_ms_per_layer: 0.02}``).

Prices: on-demand USD per GPU-hour from the dated public price list cited per entry (the
cheapest and dearest providers differ 2-4x, so each source gives its range); ``usd_per_hour``
is settable per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wansim.errors import WansimInputError

OVERHEAD_SOURCE = (
    "0.01 ms/layer with CUDA graphs (derived: ~10 kernels x ~1 us replay; CUDA.jl docs,"
    " https://cuda.juliagpu.org/dev/usage/graphs/ (stored 2026): 80 kernels 260 us eager vs 70"
    " us as a graph); eager 5x (chosen between the 3.7x measured there and the ~20 us per"
    " PyTorch kernel launch of NVIDIA's Nsight Systems guide, as quoted at"
    " https://groundy.com/articles/every-cuda-kernel-pays-a-launch-tax-the-host-to-device-"
    "walkthrough/); loaded host CPU 3x (chosen inside the 1.36-5.40x of Chung, Jia, Jezghani,"
    " Kim, 'Characterizing CPU-Induced Slowdowns in Multi-GPU LLM Inference', Georgia Tech,"
    " March 2026, summarised at https://wireunwired.com/cpus-are-quietly-throttling-your-llm-"
    "performance)"
)


@dataclasses.dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_gb: float
    mem_bandwidth_gbs: float
    tflops: Mapping[str, float]  # dense, per dtype: bf16, fp8, fp4
    interconnect: str
    usd_per_hour: float
    launch_ms_per_layer: float = 0.01
    eager_factor: float = 5.0
    loaded_cpu_factor: float = 3.0
    consumer: bool = False
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for a weight dtype; a dtype the chip lacks runs at the next wider one."""
        for d in {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16")}.get(dtype, ("bf16",)):
            if d in self.tflops:
                return self.tflops[d]
        return self.tflops["bf16"]

    def overhead_ms(self, layers: int, cuda_graphs: bool = True, cpu_loaded: bool = False):
        per = self.launch_ms_per_layer
        if not cuda_graphs:
            per *= self.eager_factor * (self.loaded_cpu_factor if cpu_loaded else 1.0)
        return per * layers

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_gb": self.memory_gb,
            "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
            "tflops": dict(self.tflops),
            "interconnect": self.interconnect,
            "usd_per_hour": self.usd_per_hour,
            "consumer": self.consumer,
            "source": dict(self.sources),
        }


def _price(usd: float, url: str, date: str, what: str) -> str:
    """A price entry's source: the figure, where it is published and when."""
    return f"{usd:g} USD/GPU-hour on demand: {what} ({url}, {date}); set usd_per_hour"


HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        HardwareSpec(
            "h100-sxm",
            80,
            3350,
            {"bf16": 989, "fp8": 1979},
            "NVLink 4 900 GB/s",
            2.95,
            sources={
                "spec": "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 3.35 TB/s,"
                " 989 TFLOPS bf16 / 1,979 fp8 dense)",
                "price": _price(
                    2.95,
                    "https://aimultiple.com/gpu-index",
                    "2026-05-20",
                    "the on-demand median over the 37 providers listing H100; ranges: $1.99-5.00 (https://www.mercatus-ai.com/blog/cloud-gpu-pricing, May 2026), $2.49-3.99 (https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price, early 2026), $1.49-2.10 (https://aiapiplaybook.com/blog/gpu-cloud-pricing-2026-a100-vs-h100-vs-serverless-inference-compared, 2026-01-15)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "h200",
            141,
            4800,
            {"bf16": 989, "fp8": 1979},
            "NVLink 4 900 GB/s",
            4.00,
            sources={
                "spec": "NVIDIA H200 datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, same Hopper"
                " tensor cores as H100)",
                "price": _price(
                    4.00,
                    "https://www.mercatus-ai.com/blog/cloud-gpu-pricing",
                    "May 2026",
                    "derived: midpoint of the specialty-cloud range $3.50-4.50 (all tiers $2.50-7.00); $2.25 at packet.ai (https://packet.ai/blog/gpu-pricing-models-compared, June 2026)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "b200",
            180,
            8000,
            {"bf16": 2250, "fp8": 4500, "fp4": 9000},
            "NVLink 5 1.8 TB/s",
            5.60,
            sources={
                "spec": "NVIDIA DGX/HGX B200 datasheet (per GPU: 180 GB HBM3e, 8 TB/s; dense"
                " 2.25 PF bf16, 4.5 PF fp8, 9 PF fp4 = half the sparse figures)",
                "price": _price(
                    5.60,
                    "https://packet.ai/blog/gpu-pricing-models-compared",
                    "June 2026",
                    "B200 bare metal at $5.6/h; the same page tracks $3.75 as the lowest on-demand rate of 26 providers and $8.00-14.24 at AWS",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "a100-80gb",
            80,
            2039,
            {"bf16": 312},
            "NVLink 3 600 GB/s",
            1.30,
            sources={
                "spec": "NVIDIA A100 datasheet (SXM 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16"
                " dense; no fp8)",
                "price": _price(
                    1.30,
                    "https://www.mercatus-ai.com/blog/cloud-gpu-pricing",
                    "May 2026",
                    "derived: midpoint of the specialty-cloud range $1.10-1.50 (all tiers $0.80-3.00); $1.49-2.49 at https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price (early 2026)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "l40s",
            48,
            864,
            {"bf16": 362, "fp8": 733},
            "PCIe Gen4 x16 64 GB/s",
            0.79,
            sources={
                "spec": "NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, 362 TFLOPS bf16 / 733"
                " fp8 dense = half the sparsity figures)",
                "price": _price(
                    0.79,
                    "https://deploybase.ai/articles/nvidia-l40s-price",
                    "March 2026",
                    "RunPod on-demand; $0.86 RunPod, $1.29-3.50 elsewhere at https://modal.com/blog/nvidia-l40s-price-article (2025-08-12)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "mi300x",
            192,
            5300,
            {"bf16": 1307, "fp8": 2615},
            "Infinity Fabric 896 GB/s",
            1.99,
            sources={
                "spec": "AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1,307 TFLOPS"
                " bf16 / 2,615 fp8 dense)",
                "price": _price(
                    1.99,
                    "https://www.cliffcenter.com/research/amd-inference-economics",
                    "2026-05-18",
                    "the median MI300X rate ($1.50 TensorWave to $6.00 Azure/Oracle)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "rtx-4090",
            24,
            1008,
            {"bf16": 165, "fp8": 330},
            "PCIe Gen4 x16 64 GB/s",
            0.55,
            consumer=True,
            sources={
                "spec": "NVIDIA Ada GPU architecture whitepaper, RTX 4090: 24 GB GDDR6X,"
                " 1,008 GB/s, 165 TFLOPS bf16 (fp32 accumulate) / 330 fp8 dense",
                "price": _price(
                    0.55,
                    "https://www.spheron.network/blog/nvidia-h100-vs-rtx-4090-ai-training-inference-2026/",
                    "2026-05-25",
                    "Spheron on-demand from $0.55/h; $0.34 at RunPod (https://deploybase.ai/articles/nvidia-l40s-price, March 2026)",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "rtx-5090",
            32,
            1792,
            {"bf16": 209.5, "fp8": 419, "fp4": 838},
            "PCIe Gen5 x16 128 GB/s",
            0.69,
            consumer=True,
            sources={
                "spec": "NVIDIA Blackwell (GB202) whitepaper, RTX 5090: 32 GB GDDR7, 1,792"
                " GB/s; dense tensor 209.5 TFLOPS bf16, 419 fp8, 838 fp4 (half the sparse"
                " figures)",
                "price": _price(
                    0.69,
                    "https://deploybase.ai/articles/rtx-5090-cloud",
                    "stored 2026, undated",
                    "RunPod rental",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
        HardwareSpec(
            "rtx-pro-6000",
            96,
            1792,
            {"bf16": 500, "fp8": 1000, "fp4": 2000},
            "PCIe Gen5 x16 128 GB/s",
            0.66,
            sources={
                "spec": "NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7, 1,792 GB/s,"
                " 4 PFLOPS fp4 with sparsity; dense per dtype derived = 4000/2 (sparsity)"
                " for fp4, halved per doubling of width",
                "price": _price(
                    0.66,
                    "https://packet.ai/blog/gpu-pricing-models-compared",
                    "June 2026",
                    "RTX 6000 Pro on demand from $0.66/h",
                ),
                "overhead": OVERHEAD_SOURCE,
            },
        ),
    ]
}

_OVERRIDABLE = (
    "memory_gb",
    "mem_bandwidth_gbs",
    "usd_per_hour",
    "launch_ms_per_layer",
    "eager_factor",
    "loaded_cpu_factor",
)


def hardware_preset(spec: Any, path: str) -> HardwareSpec:
    """``hardware: h100-sxm`` or ``hardware: {preset: h100-sxm, usd_per_hour: 2.0, ...}``."""
    overrides: Mapping[str, Any] = {}
    name = spec
    if isinstance(spec, Mapping):
        name = spec.get("preset")
        overrides = {k: v for k, v in spec.items() if k != "preset"}
        path = f"{path}.preset" if name is not None else path
    if not isinstance(name, str) or name not in HARDWARE:
        raise WansimInputError(path, f"unknown hardware (known: {', '.join(HARDWARE)})", name)
    hw = HARDWARE[name]
    base = path.removesuffix(".preset")
    for key, value in overrides.items():
        if key not in _OVERRIDABLE:
            raise WansimInputError(
                f"{base}.{key}", f"unknown hardware field (allowed: {', '.join(_OVERRIDABLE)})"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise WansimInputError(f"{base}.{key}", "must be a number >= 0", value)
    if overrides:
        srcs = dict(hw.sources)
        srcs["overrides"] = "user: " + ", ".join(f"{k}={v}" for k, v in overrides.items())
        hw = dataclasses.replace(hw, sources=srcs, **{k: float(v) for k, v in overrides.items()})
    return hw

"""Hardware catalog: one accelerator per node, as its vendor datasheet gives it.

Fields: memory (GB, 1e9 bytes), memory bandwidth (GB/s), dense tensor TFLOPS per dtype (no
structured sparsity), interconnect, a per-layer kernel-launch overhead and its host-CPU
sensitivity, and an hourly price.

Launch overhead (``launch_ms_per_layer``): with CUDA graphs a decode pass replays one graph, so
the per-layer cost is small (assumed 0.01 ms/layer, the order of the ~10 kernels of a layer at
~1 us replay each). Eager launches cost ``eager_factor`` times more (assumed 5x: ~5 us per
launch from the host), and a loaded host CPU slows eager launches by ``loaded_cpu_factor``
(assumed 3x: kernel-launch-bound stages run several times slower behind a busy CPU); graphs
are insensitive to the host. These three figures are assumptions, labelled so; override them
per node (``hardware: {preset: h100-sxm, launch_ms_per_layer: 0.02}``).

Prices are indicative on-demand cloud rates in USD per GPU-hour, dated, and labelled
assumed where no stored price list backs them; ``usd_per_hour`` is settable per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wansim.errors import WansimInputError

ASSUMED_OVERHEAD = "assumed (module docstring): 0.01 ms/layer with graphs, 5x eager, 3x loaded"


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


_PRICE_DATE = "2026-12"


def _price(text: str) -> str:
    return f"assumed indicative on-demand USD/GPU-hour ({text}), {_PRICE_DATE}; set usd_per_hour"


HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        HardwareSpec(
            "h100-sxm",
            80,
            3350,
            {"bf16": 989, "fp8": 1979},
            "NVLink 4 900 GB/s",
            2.50,
            sources={
                "spec": "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 3.35 TB/s,"
                " 989 TFLOPS bf16 / 1,979 fp8 dense)",
                "price": _price("H100 SXM clouds ranged ~2-3.5"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "h200",
            141,
            4800,
            {"bf16": 989, "fp8": 1979},
            "NVLink 4 900 GB/s",
            3.50,
            sources={
                "spec": "NVIDIA H200 datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, same Hopper"
                " tensor cores as H100)",
                "price": _price("H200 ~3-4.5"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "b200",
            180,
            8000,
            {"bf16": 2250, "fp8": 4500, "fp4": 9000},
            "NVLink 5 1.8 TB/s",
            5.50,
            sources={
                "spec": "NVIDIA DGX/HGX B200 datasheet (per GPU: 180 GB HBM3e, 8 TB/s; dense"
                " 2.25 PF bf16, 4.5 PF fp8, 9 PF fp4 = half the sparse figures)",
                "price": _price("B200 ~4.5-6.5"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "a100-80gb",
            80,
            2039,
            {"bf16": 312},
            "NVLink 3 600 GB/s",
            1.60,
            sources={
                "spec": "NVIDIA A100 datasheet (SXM 80 GB HBM2e, 2,039 GB/s, 312 TFLOPS bf16"
                " dense; no fp8)",
                "price": _price("A100 80GB ~1.2-2"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "l40s",
            48,
            864,
            {"bf16": 362, "fp8": 733},
            "PCIe Gen4 x16 64 GB/s",
            1.00,
            sources={
                "spec": "NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, 362 TFLOPS bf16 / 733"
                " fp8 dense = half the sparsity figures)",
                "price": _price("L40S ~0.8-1.3"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "mi300x",
            192,
            5300,
            {"bf16": 1307, "fp8": 2615},
            "Infinity Fabric 896 GB/s",
            2.50,
            sources={
                "spec": "AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s, 1,307 TFLOPS"
                " bf16 / 2,615 fp8 dense)",
                "price": _price("MI300X ~2-3"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "rtx-4090",
            24,
            1008,
            {"bf16": 165, "fp8": 330},
            "PCIe Gen4 x16 64 GB/s",
            0.40,
            consumer=True,
            sources={
                "spec": "NVIDIA Ada GPU architecture whitepaper, RTX 4090: 24 GB GDDR6X,"
                " 1,008 GB/s, 165 TFLOPS bf16 (fp32 accumulate) / 330 fp8 dense",
                "price": _price("consumer-card marketplaces ~0.3-0.6"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "rtx-5090",
            32,
            1792,
            {"bf16": 209.5, "fp8": 419, "fp4": 838},
            "PCIe Gen5 x16 128 GB/s",
            0.70,
            consumer=True,
            sources={
                "spec": "NVIDIA Blackwell (GB202) whitepaper, RTX 5090: 32 GB GDDR7, 1,792"
                " GB/s; dense tensor 209.5 TFLOPS bf16, 419 fp8, 838 fp4 (half the sparse"
                " figures)",
                "price": _price("consumer-card marketplaces ~0.5-0.9"),
                "overhead": ASSUMED_OVERHEAD,
            },
        ),
        HardwareSpec(
            "rtx-pro-6000",
            96,
            1792,
            {"bf16": 500, "fp8": 1000, "fp4": 2000},
            "PCIe Gen5 x16 128 GB/s",
            1.80,
            sources={
                "spec": "NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7, 1,792 GB/s,"
                " 4 PFLOPS fp4 with sparsity; dense per dtype derived = 4000/2 (sparsity)"
                " for fp4, halved per doubling of width",
                "price": _price("~1.5-2.2"),
                "overhead": ASSUMED_OVERHEAD,
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

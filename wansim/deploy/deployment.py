"""A deployment file -> a validated :class:`Deployment` (nodes, model preset, latencies).

The file is a scenario whose ``nodes`` replace ``stages`` and whose ``model`` names a catalog
preset (DESIGN contract)::

    model: {preset: deepseek-v4-pro, weight_dtype: native, kv_dtype: bf16, ...overrides}
    nodes: [{name, hardware, region | lat/lon, uplink_mbps, layers: [first, last],
             cuda_graphs, cpu_loaded}]
    ping_file: pings.csv          # optional measured RTTs between node names
    cost: {egress_usd_per_gb: 0.02}
    plan: {k, activation_bits, trees, top, objective, des_requests, lossy_ok}
    drafter / speculation / payload / schedule / workload / network: as in any scenario

Every section that is not the deployment's own is validated as a scenario (one-line errors);
the deployment's fields are checked here, each error naming its path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wansim.catalog.hardware import hardware_preset
from wansim.catalog.models import MODELS, model_preset, with_overrides
from wansim.config.overrides import apply_overrides
from wansim.config.raw import read_yaml_mapping
from wansim.config.scenario import load_scenario
from wansim.data import exists
from wansim.deploy import geography
from wansim.deploy.partition import Node
from wansim.deploy.stages import Precision
from wansim.errors import WansimInputError

DEPLOY_KEYS = ("nodes", "ping_file", "cost", "plan")
WEIGHT_DTYPES = ("native", "bf16", "fp8", "nvfp4")
KV_DTYPES = ("bf16", "fp8")
OBJECTIVES = ("tokens_per_s", "throughput_tokens_per_s", "usd_per_m_tokens")
# AWS inter-region transfer for most region pairs, invoiced by the source region
# (https://redresscompliance.com/aws-inter-region-transfer-costs-multiregion.html, stored 2026:
# $0.02/GB, e.g. us-east-1 -> eu-west-1); settable (cost.egress_usd_per_gb)
DEFAULT_EGRESS_USD_PER_GB = 0.02


@dataclasses.dataclass(frozen=True)
class Deployment:
    name: str
    model: Any  # ModelSpec
    precision: Precision
    nodes: tuple[Node, ...]
    rtt_ms: np.ndarray
    rtt_sources: tuple[str, ...]
    base_raw: dict  # the scenario sections (validated) without deployment keys
    base_dir: Path
    ks: tuple[int, ...]
    bits: tuple[int, ...]
    trees: tuple[int, ...]  # sequoia tree budgets searched beside chains
    lossy_ok: bool  # rank activation widths that are not target-exact (below 16 bits) with the rest
    top: int
    objective: str
    egress_usd_per_gb: float
    des_requests: int


def _num(value, path, lo=0.0, integer=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok or value < lo:
        kind = "an integer" if integer else "a number"
        raise WansimInputError(path, f"must be {kind} >= {lo:g}", value)
    return int(value) if integer else float(value)


def load_deployment(path: str, overrides=()) -> Deployment:
    raw = apply_overrides(read_yaml_mapping(path, "deployment"), overrides)
    return deployment_from_raw(raw, Path(path).resolve().parent, Path(path).stem)


def deployment_from_raw(raw: dict, base_dir: Path, default_name: str = "deployment") -> Deployment:
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise WansimInputError("nodes", "a deployment needs a list of nodes", nodes_raw)
    if "stages" in raw:
        raise WansimInputError("stages", "a deployment's nodes replace stages", raw["stages"])
    model_raw = raw.get("model")
    if not isinstance(model_raw, Mapping) or "preset" not in model_raw:
        raise WansimInputError(
            "model.preset", f"a deployment names a model preset (known: {', '.join(MODELS)})"
        )
    model_raw = dict(model_raw)
    model = model_preset(model_raw.pop("preset"))
    weight_dtype = model_raw.pop("weight_dtype", "native")
    kv_dtype = model_raw.pop("kv_dtype", "bf16")
    if weight_dtype not in WEIGHT_DTYPES:
        raise WansimInputError(
            "model.weight_dtype", f"must be one of {WEIGHT_DTYPES}", weight_dtype
        )
    if kv_dtype not in KV_DTYPES:
        raise WansimInputError("model.kv_dtype", f"must be one of {KV_DTYPES}", kv_dtype)
    model = with_overrides(model, model_raw, "model")
    precision = Precision.for_model(model, weight_dtype, kv_dtype)

    nodes = tuple(_node(n, i) for i, n in enumerate(nodes_raw))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise WansimInputError("nodes", "node names must be unique", names)
    pings = None
    if raw.get("ping_file") is not None:
        found = base_dir / raw["ping_file"]
        pings = geography.read_ping_csv(found if exists(found) else raw["ping_file"], names)
    rtt, how = geography.rtt_matrix_ms(
        [{"name": n.name, "region": n.region, "coords": n.coords} for n in nodes], pings
    )

    plan = raw.get("plan") or {}
    if not isinstance(plan, Mapping):
        raise WansimInputError("plan", "must be a mapping", plan)
    unknown = set(plan) - {
        "k",
        "activation_bits",
        "trees",
        "top",
        "objective",
        "des_requests",
        "lossy_ok",
    }
    if unknown:
        raise WansimInputError(f"plan.{sorted(unknown)[0]}", "unknown field")
    ks = tuple(_num(k, "plan.k", 1, True) for k in plan.get("k", [1, 2, 3, 4, 5, 6, 7]))
    bits = tuple(
        _num(b, "plan.activation_bits", 3, True) for b in plan.get("activation_bits", [16, 8])
    )
    trees = tuple(_num(t, "plan.trees", 1, True) for t in plan.get("trees", []))
    objective = plan.get("objective", "tokens_per_s")
    if objective not in OBJECTIVES:
        raise WansimInputError("plan.objective", f"must be one of {OBJECTIVES}", objective)
    cost = raw.get("cost") or {}
    if not isinstance(cost, Mapping) or set(cost) - {"egress_usd_per_gb"}:
        raise WansimInputError("cost", "allowed: {egress_usd_per_gb}", cost)
    egress = _num(
        cost.get("egress_usd_per_gb", DEFAULT_EGRESS_USD_PER_GB), "cost.egress_usd_per_gb"
    )

    base = {k: v for k, v in raw.items() if k not in (*DEPLOY_KEYS, "model")}
    base["stages"] = len(nodes)
    base["model"] = {"hidden_size": model.hidden_size}
    if not ks or not bits:
        raise WansimInputError("plan", "k and activation_bits need at least one value", plan)
    check = dict(base)
    spec = check.get("speculation") or {}
    if isinstance(spec, Mapping):
        check["speculation"] = {**spec, "k": max(ks)}
    load_scenario(data=check, base_dir=base_dir)  # validates every scenario section (one line)
    return Deployment(
        name=str(raw.get("name", default_name)),
        model=model,
        precision=precision,
        nodes=nodes,
        rtt_ms=rtt,
        rtt_sources=tuple(how),
        base_raw=base,
        base_dir=base_dir,
        ks=ks,
        bits=bits,
        trees=trees,
        lossy_ok=bool(plan.get("lossy_ok", False)),
        top=_num(plan.get("top", 3), "plan.top", 1, True),
        objective=objective,
        egress_usd_per_gb=egress,
        des_requests=_num(plan.get("des_requests", 24), "plan.des_requests", 1, True),
    )


def _node(n: Any, i: int) -> Node:
    p = f"nodes[{i}]"
    if not isinstance(n, Mapping):
        raise WansimInputError(p, "must be a mapping {name, hardware, region | lat/lon, ...}", n)
    allowed = {
        "name",
        "hardware",
        "region",
        "lat",
        "lon",
        "uplink_mbps",
        "layers",
        "cuda_graphs",
        "cpu_loaded",
    }
    for k in n:
        if k not in allowed:
            raise WansimInputError(
                f"{p}.{k}", f"unknown field (allowed: {', '.join(sorted(allowed))})"
            )
    name = n.get("name", f"node{i}")
    hw = hardware_preset(n.get("hardware"), f"{p}.hardware")
    region = None
    if n.get("region") is not None:
        region = geography.region_slug(str(n["region"]))
        if region is None and ("lat" not in n or "lon" not in n):
            known = ", ".join(sorted(geography.regions()))
            raise WansimInputError(
                f"{p}.region",
                f"not in the latency dataset; give lat/lon (regions: {known})",
                n["region"],
            )
    if region is not None:
        coords = geography.regions()[region]
    elif "lat" in n and "lon" in n:
        coords = (_num(n["lat"], f"{p}.lat", -90), _num(n["lon"], f"{p}.lon", -180))
    else:
        raise WansimInputError(p, "needs a region or lat/lon", None)
    layers = n.get("layers")
    if layers is not None:
        if not (isinstance(layers, list) and len(layers) == 2):
            raise WansimInputError(f"{p}.layers", "must be [first, last]", layers)
        layers = (_num(layers[0], f"{p}.layers", 0, True), _num(layers[1], f"{p}.layers", 0, True))
    return Node(
        name=str(name),
        hardware=hw,
        region=region,
        coords=coords,
        uplink_mbps=_num(n.get("uplink_mbps", 1000), f"{p}.uplink_mbps", 1e-9),
        layers=layers,
        cuda_graphs=bool(n.get("cuda_graphs", True)),
        cpu_loaded=bool(n.get("cpu_loaded", False)),
    )


# ----------------------------------------------------------------------------- planning

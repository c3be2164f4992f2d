"""``wansim plan``: a deployment as users describe it -> the best few runnable scenarios.

A deployment file is a scenario whose ``nodes`` replace ``stages`` and whose ``model`` names a
catalog preset (DESIGN contract)::

    model: {preset: deepseek-v4-pro, weight_dtype: native, kv_dtype: bf16}
    nodes: [{name, hardware, region | lat/lon, uplink_mbps, layers: [first, last]}]
    ping_file: pings.csv          # optional measured RTTs between node names
    cost: {egress_usd_per_gb: 0.02}
    plan: {k: [3, 5, 7], activation_bits: [16, 8], top: 3, objective: tokens_per_s}
    drafter / speculation / payload / schedule / workload: as in any scenario

Search: the ring (exact cycle + the best rotation, :mod:`placement`), the layer partition on it
(:mod:`partition`), the admitted batch (the workload's concurrency, capped at the largest batch
that fits), then chains of K or Sequoia trees of ``plan.trees`` node budgets x activation bits
x batching (continuous or none when more than one request is admitted), ranked by the
analytical engine; the best ``top`` are confirmed by the DES (its metrics are the ones
reported, best first). Widths below 16 bits are ranked only with ``plan.lossy_ok`` (their
quality cost is not measured); otherwise a flag says what they would gain. Hop i is carried
at node i's ``uplink_mbps``. Flags: a best K, tree budget or bit width at the edge of the
searched range; K beyond the positions the acceptance measured (extrapolated); a capped batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wansim.catalog.hardware import hardware_preset
from wansim.catalog.models import MODELS, model_preset, with_overrides
from wansim.compute import stage_ms
from wansim.deploy import geography, placement
from wansim.deploy.partition import Node, Stage, largest_batch, partition
from wansim.deploy.stages import Load, Precision, compute_model
from wansim.errors import WansimInputError
from wansim.scenario import apply_overrides, load_scenario, read_yaml_mapping, scenario_to_dict

DEPLOY_KEYS = ("nodes", "ping_file", "cost", "plan")
WEIGHT_DTYPES = ("native", "bf16", "fp8", "nvfp4")
KV_DTYPES = ("bf16", "fp8")
OBJECTIVES = ("tokens_per_s", "throughput_tokens_per_s", "usd_per_m_tokens")
DEFAULT_EGRESS_USD_PER_GB = 0.02  # assumed typical intra-Europe cloud egress; settable


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
    lossy_ok: bool  # rank activation widths below 16 bits (quality cost unmeasured) with the rest
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
        pings = geography.read_ping_csv(found if found.exists() else raw["ping_file"], names)
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
def _load(dep: Deployment, batch: int, k: int) -> Load:
    sc = load_scenario(data=dep.base_raw, base_dir=dep.base_dir)
    wl = sc.workload
    return Load(batch, wl.prompt_tokens, wl.output_tokens, k + 1, sc.drafter.preset)


def lap_ms(dep: Deployment, order: tuple[int, ...], stages: list[Stage]) -> float:
    return placement.cycle_ms(order, dep.rtt_ms / 2) + sum(s.pass_ms for s in stages)


def _scenario_raw(dep, order, stages, load, cand: dict, admitted) -> dict:
    """A runnable scenario for one candidate (k or tree budget, bits, batching) on this ring."""
    raw = apply_overrides(dep.base_raw, {})
    nodes = [dep.nodes[i] for i in order]
    tree = cand["policy"] == "tree"
    per_seq = (cand["budget"] if tree else cand["k"]) + 1
    compute = []
    for st in stages:
        cm = compute_model(
            dep.model,
            st.node.hardware,
            st.slice,
            dep.precision,
            # continuous batching: a pass carries every admitted sequence (and reads their KV);
            # without batching a pass is one request's block
            dataclasses.replace(
                load,
                tokens_per_seq=per_seq,
                batch=admitted if cand["batching"] == "continuous" else 1,
            ),
            cuda_graphs=st.node.cuda_graphs,
            cpu_loaded=st.node.cpu_loaded,
        )
        compute.append(scenario_to_dict(cm))
    raw["model"] = {"hidden_size": dep.model.hidden_size, "stage_compute": compute}
    hops = []
    for i, a in enumerate(order):
        b = order[(i + 1) % len(order)]
        hops.append(
            {"latency_ms": float(dep.rtt_ms[a, b] / 2), "bandwidth_mbps": nodes[i].uplink_mbps}
        )
    raw["network"] = {**(raw.get("network") or {}), "hops": hops}
    spec = dict(raw.get("speculation") or {})
    if tree:
        spec["policy"] = "tree"
        spec["tree"] = {
            **(spec.get("tree") or {}),
            "kind": "sequoia",
            "budget_nodes": cand["budget"],
        }
    else:
        spec["policy"] = spec.get("policy", "chain") if spec.get("policy") != "tree" else "chain"
        spec["k"] = cand["k"]
    raw["speculation"] = spec
    raw["payload"] = {**(raw.get("payload") or {}), "activation_bits": cand["bits"]}
    wl = dict(raw.get("workload") or {})
    wl["concurrency"] = admitted
    wl["requests"] = max(dep.des_requests, admitted)
    raw["workload"] = wl
    raw["schedule"] = {**(raw.get("schedule") or {}), "batching": cand["batching"]}
    what = f"tree{cand['budget']}" if tree else f"k{cand['k']}"
    raw["name"] = f"{dep.name}-{what}-{cand['bits']}bit-{cand['batching']}"
    return raw


def _candidates(dep: Deployment, admitted: int) -> list[dict]:
    batchings = ["continuous", "none"] if admitted > 1 else ["none"]
    out = []
    for bits in dep.bits:
        for batching in batchings:
            out += [
                {"policy": "chain", "k": k, "budget": None, "bits": bits, "batching": batching}
                for k in dep.ks
            ]
            out += [
                {"policy": "tree", "k": None, "budget": b, "bits": bits, "batching": batching}
                for b in dep.trees
            ]
    return out


def plan(dep: Deployment, des: bool = True) -> dict:
    from wansim.analytical import analyze

    one_way = dep.rtt_ms / 2
    base_sc = load_scenario(data=dep.base_raw, base_dir=dep.base_dir)
    requested = base_sc.workload.concurrency
    k_ref = dep.ks[len(dep.ks) // 2]
    given = tuple(range(len(dep.nodes)))
    explicit = all(n.layers is not None for n in dep.nodes)
    memo: dict = {}

    def parts(o, batch):
        nodes = [dep.nodes[i] for i in o]
        return partition(dep.model, nodes, dep.precision, _load(dep, batch, k_ref), memo)

    best_cycle, method = (
        (given, "given (explicit layers)") if explicit else placement.best_cycle(one_way)
    )
    candidates = [given] if explicit else placement.rotations(best_cycle)
    scored = []
    for order in candidates:
        try:
            st1 = parts(order, 1)
        except WansimInputError:
            continue
        cap = largest_batch(dep.model, st1, dep.precision, _load(dep, 1, k_ref))
        admitted = max(1, min(requested, cap))
        st = parts(order, admitted)
        scored.append((lap_ms(dep, order, st), order, st, cap, admitted))
    if not scored:
        parts(given, 1)  # raises the one-line error naming the node short of memory
        raise WansimInputError("nodes", "no rotation of the best ring fits the model")
    scored.sort(key=lambda t: (t[0], t[1]))
    best_lap, order, stages, cap, admitted = scored[0]

    def lap_of(o):
        try:
            return lap_ms(dep, o, parts(o, admitted))
        except WansimInputError:
            return None

    worst = placement.worst_cycle(one_way)
    lap_given, lap_worst = lap_of(given), lap_of(worst)

    # candidates ranked by the analytical engine
    load = _load(dep, admitted, k_ref)
    usd_per_hour = sum(n.hardware.usd_per_hour for n in dep.nodes)
    rows, skipped = [], []
    for cand in _candidates(dep, admitted):
        raw = _scenario_raw(dep, order, stages, load, cand, admitted)
        try:
            sc = load_scenario(data=raw, base_dir=dep.base_dir)
            m = analyze(sc).metrics
        except WansimInputError as err:
            skipped.append(f"{raw['name']}: {err}")
            continue
        cost = _cost(dep, m, usd_per_hour, order)
        rows.append({**cand, "scenario": sc, "raw": raw, "analytical": m, "cost": cost})
    if not rows:
        raise WansimInputError("plan", skipped[0] if skipped else "nothing to search")
    if dep.objective == "usd_per_m_tokens":

        def score(r):
            v = r["cost"]["usd_per_m_tokens"]
            return math.inf if v is None else v
    else:

        def score(r):
            return -r["analytical"][dep.objective]

    lossless = [r for r in rows if r["bits"] >= 16]
    ranked = sorted(rows if dep.lossy_ok or not lossless else lossless, key=score)
    plans = []
    for r in ranked[: dep.top]:
        metrics, engine = r["analytical"], "analytical"
        if des:
            from wansim.sim import simulate

            metrics, engine = simulate(r["scenario"]).metrics, "des"
        cost = _cost(dep, metrics, usd_per_hour, order)
        plans.append(_plan_entry(dep, r, metrics, engine, cost, order, stages, admitted))
    # best first by the confirming engine's numbers (the analytical ranking chose the shortlist)
    if dep.objective == "usd_per_m_tokens":
        plans.sort(
            key=lambda p: math.inf if p["usd_per_m_tokens"] is None else p["usd_per_m_tokens"]
        )
    else:
        plans.sort(key=lambda p: -p[dep.objective])
    flags = _flags(dep, ranked[0], base_sc, requested, cap)
    lossy = sorted((r for r in rows if r["bits"] < 16), key=score)
    if lossy and not dep.lossy_ok and score(lossy[0]) < score(ranked[0]):
        flags.append(
            f"{lossy[0]['bits']}-bit activations would rank first"
            f" ({dep.objective} {abs(score(lossy[0])):.4g} vs {abs(score(ranked[0])):.4g},"
            " analytical) but their quality cost is not measured: set plan.lossy_ok to rank them"
        )
    return {
        "deployment": dep.name,
        "model": dep.model.name,
        "plans": plans,
        "ring": {
            "method": method,
            "order": [dep.nodes[i].name for i in order],
            "coordinator_node": dep.nodes[order[0]].name,
            "drafter_node": dep.nodes[
                order[-1] if base_sc.drafter.placement == "last_stage" else order[0]
            ].name,
            "lap_ms": round(best_lap, 3),
            "lap_ms_given_order": None if lap_given is None else round(lap_given, 3),
            "lap_ms_worst_order": None if lap_worst is None else round(lap_worst, 3),
            "gain_over_given": None if lap_given is None else round(lap_given / best_lap - 1, 4),
            "gain_over_worst": None if lap_worst is None else round(lap_worst / best_lap - 1, 4),
            "latency_sources": list(dep.rtt_sources),
        },
        "largest_batch": cap,
        "admitted_concurrency": admitted,
        "requested_concurrency": requested,
        "usd_per_hour": round(usd_per_hour, 2),
        "searched": len(rows),
        "skipped": skipped,
        "flags": flags,
    }


def _cost(dep, metrics, usd_per_hour, order) -> dict:
    """$/M output tokens (GPU-hours + egress), egress GB per M tokens (hops between regions)."""
    P = len(order)
    cross = sum(
        1
        for i in range(P)
        if dep.nodes[order[i]].region is None
        or dep.nodes[order[i]].region != dep.nodes[order[(i + 1) % P]].region
    )
    egress_gb = metrics["bytes_per_token"] * 1e6 / 1e9 * cross / P
    thr = metrics["throughput_tokens_per_s"]
    gpu = usd_per_hour / (thr * 3600) * 1e6 if thr > 0 else math.inf
    usd = gpu + egress_gb * dep.egress_usd_per_gb
    return {
        "usd_per_m_tokens": round(usd, 4) if math.isfinite(usd) else None,
        "egress_gb_per_m_tokens": round(egress_gb, 4),
    }


def _plan_entry(dep, r, metrics, engine, cost, order, stages, admitted) -> dict:
    per_seq = (r["budget"] if r["policy"] == "tree" else r["k"]) + 1
    n = per_seq * (admitted if r["batching"] == "continuous" else 1)  # tokens per pass
    return {
        "tokens_per_s": round(metrics["tokens_per_s"], 3),
        "tpot_ms_p50": round(metrics["tpot_ms_p50"], 3),
        "tpot_ms_p99": round(metrics["tpot_ms_p99"], 3),
        "throughput_tokens_per_s": round(metrics["throughput_tokens_per_s"], 3),
        "usd_per_m_tokens": cost["usd_per_m_tokens"],
        "egress_gb_per_m_tokens": cost["egress_gb_per_m_tokens"],
        "order": [dep.nodes[i].name for i in order],
        "stages": [
            {
                "node": st.node.name,
                "hardware": st.node.hardware.name,
                "layers": [st.slice.first, st.slice.last],
                "pass_ms": round(float(stage_ms(r["scenario"].model.stage_compute[j], n)), 3),
                "memory_gb": round(st.memory["total"], 2),
                "memory_headroom_gb": round(st.node.hardware.memory_gb - st.memory["total"], 2),
            }
            for j, st in enumerate(stages)
        ],
        "policy": r["policy"],
        "k": r["k"],
        "tree_budget_nodes": r["budget"],
        "activation_bits": r["bits"],
        "batching": r["batching"],
        "concurrency": admitted,
        "engine": engine,
        "analytical_tokens_per_s": round(r["analytical"]["tokens_per_s"], 3),
        "scenario": r["raw"],
    }


def _flags(dep, best, base_sc, requested, cap) -> list[str]:
    out = []
    if best["policy"] == "tree":
        if len(dep.trees) > 1 and best["budget"] in (min(dep.trees), max(dep.trees)):
            out.append(f"best tree budget {best['budget']} is at the edge of {list(dep.trees)}")
    elif len(dep.ks) > 1 and best["k"] in (min(dep.ks), max(dep.ks)):
        out.append(f"best k={best['k']} is at the edge of the searched range {list(dep.ks)}")
    if len(dep.bits) > 1 and best["bits"] in (min(dep.bits), max(dep.bits)) and best["bits"] != 16:
        out.append(f"best activation_bits={best['bits']} is at the edge of {list(dep.bits)}")
    if best["bits"] < 16:
        out.append(
            f"activation_bits={best['bits']} is lossy; its quality cost is not measured here"
        )
    acc = base_sc.drafter.acceptance
    measured = None
    if acc.profile is not None:
        from wansim.acceptance.profile import load_profile

        prof = load_profile(acc.profile)
        wl = acc.workload or prof.default_workload
        measured = len(prof.workloads[wl].per_position)
    elif acc.per_position is not None:
        measured = len(acc.per_position)
    if measured is not None and best["k"] is not None and best["k"] > measured:
        out.append(
            f"k={best['k']} extrapolates acceptance beyond the {measured} measured positions"
        )
    if requested > cap:
        out.append(f"workload.concurrency {requested} capped at {cap}: the largest batch that fits")
    return out


def deployment_scenario_raw(raw: dict, base_dir: Path) -> dict:
    """A deployment file run as it stands (``wansim run/validate DEPLOYMENT.yaml``): the nodes
    in the order given, layers as given or partitioned, the scenario's own K / tree, bits and
    batching, and ``workload.concurrency`` capped at the largest batch that fits (engines admit
    no more requests than the memory holds)."""
    raw = dict(raw)
    if "plan" in raw:
        raw.pop("plan")
    dep = deployment_from_raw(raw, base_dir)
    sc = load_scenario(data=dep.base_raw, base_dir=base_dir)
    spec = sc.speculation
    tree = spec.policy == "tree"
    k = spec.k if spec.policy != "none" else 0
    order = tuple(range(len(dep.nodes)))
    load1 = _load(dep, 1, k)
    stages = partition(dep.model, list(dep.nodes), dep.precision, load1)
    cap = largest_batch(dep.model, stages, dep.precision, load1)
    admitted = max(1, min(sc.workload.concurrency, cap))
    stages = partition(dep.model, list(dep.nodes), dep.precision, _load(dep, admitted, k))
    cand = {
        "policy": "tree" if tree else "chain",
        "k": None if tree else k,
        "budget": spec.tree.budget_nodes if tree else None,
        "bits": sc.payload.activation_bits,
        "batching": sc.schedule.batching,
    }
    out = _scenario_raw(dep, order, stages, _load(dep, admitted, k), cand, admitted)
    out["speculation"] = {**out["speculation"], "policy": spec.policy}
    out["workload"]["requests"] = sc.workload.requests
    out["name"] = str(raw.get("name", dep.name))
    return out

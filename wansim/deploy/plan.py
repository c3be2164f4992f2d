"""``wansim plan``: a deployment as users describe it -> the best few runnable scenarios.

The deployment file's fields are in :mod:`wansim.deploy.deployment`.

Search: the ring (exact cycle + the best rotation, :mod:`placement`), the layer partition on it
(:mod:`partition`), the admitted batch (the workload's concurrency, capped at the largest batch
that fits), then chains of K or Sequoia trees of ``plan.trees`` node budgets x activation bits
x batching (continuous or none when more than one request is admitted), ranked by the
analytical engine; the best ``top`` are confirmed by the DES (its metrics are the ones
reported, best first). Activation widths carry their quality cost
(:mod:`wansim.acceptance.activation_quality`): a width whose cost the acceptance does not give
is never ranked (a flag says so); a width that is not target-exact (below 16 bits) is ranked
only with ``plan.lossy_ok``, otherwise a flag says what it would gain. Hop i is carried
at node i's ``uplink_mbps``. Flags: a best K, tree budget or bit width at the edge of the
searched range; K beyond the positions the acceptance measured (extrapolated); a capped batch.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from wansim.config.overrides import apply_overrides
from wansim.config.scenario import load_scenario, scenario_to_dict
from wansim.deploy import placement
from wansim.deploy.deployment import Deployment, deployment_from_raw, load_deployment
from wansim.deploy.partition import Stage, largest_batch, partition
from wansim.deploy.stages import Load, compute_model
from wansim.errors import WansimInputError
from wansim.speculation import bit_quality
from wansim.stages.compute import stage_ms

__all__ = ["deployment_scenario_raw", "load_deployment", "plan"]


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
        q = bit_quality(sc)
        rows.append(
            {**cand, "scenario": sc, "raw": raw, "analytical": m, "cost": cost, "quality": q}
        )
    if not rows:
        raise WansimInputError("plan", skipped[0] if skipped else "nothing to search")
    # a width whose quality cost the acceptance does not give is never ranked (one flag)
    unseen = sorted({r["bits"] for r in rows if not r["quality"].visible}, reverse=True)
    rows = [r for r in rows if r["quality"].visible]
    if not rows:
        raise WansimInputError(
            "plan.activation_bits",
            f"no width whose quality cost is known: {unseen} bits are not measured for this"
            " acceptance (give drafter.acceptance.activation_quality, or search 16 bits)",
            list(dep.bits),
        )
    if dep.objective == "usd_per_m_tokens":

        def score(r):
            v = r["cost"]["usd_per_m_tokens"]
            return math.inf if v is None else v
    else:

        def score(r):
            return -r["analytical"][dep.objective]

    exact = [r for r in rows if r["quality"].target_exact]
    ranked = sorted(rows if dep.lossy_ok or not exact else exact, key=score)
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
    if unseen:
        flags.append(
            f"{', '.join(map(str, unseen))}-bit activations not ranked: their quality cost is"
            " not measured for this acceptance (drafter.acceptance.activation_quality)"
        )
    lossy = sorted((r for r in rows if not r["quality"].target_exact), key=score)
    if lossy and not dep.lossy_ok and exact and score(lossy[0]) < score(ranked[0]):
        q = lossy[0]["quality"]
        flags.append(
            f"{lossy[0]['bits']}-bit activations would rank first"
            f" ({dep.objective} {abs(score(lossy[0])):.4g} vs {abs(score(ranked[0])):.4g},"
            f" analytical, acceptance x{q.acceptance_factor:g}) but the output is not the"
            " target's exact: set plan.lossy_ok to rank them"
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
        "target_exact": bool(metrics["target_exact"]),
        "activation_acceptance_factor": r["quality"].factor(r["scenario"].speculation.verifier),
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
    q = best["quality"]
    if not q.target_exact:
        kl = "" if q.kl_mean is None else f", KL {q.kl_mean:.2g} nats"
        agree = (
            "" if q.token_agreement is None else f", greedy tokens {q.token_agreement:.0%} equal"
        )
        out.append(
            f"activation_bits={best['bits']}: the output is not the target's exact (acceptance"
            f" x{q.acceptance_factor:g}{kl}{agree}; {q.source})"
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
    # memory-aware admission: the KV tokens the tightest stage holds (cap sequences of prompt +
    # output), unless the scenario gives its own
    context = sc.workload.prompt_tokens + sc.workload.output_tokens
    kv = sc.workload.kv_capacity_tokens
    out["workload"]["kv_capacity_tokens"] = kv if kv is not None else max(cap, 1) * context
    out["name"] = str(raw.get("name", dep.name))
    return out

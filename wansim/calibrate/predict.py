"""``wansim calibrate predict``: predict held-out real cells from their configuration and a
profile bundle alone, run them, and compare.

A cell's scenario (:func:`cell_scenario`) takes from the cell only its configuration (stages,
latency, bandwidth, K, policy, drafter, concurrency, batching, schedule, bits, tokens) and from
the bundle only hardware/software properties, each through the scenario field that models it:
a stage's fixed cost per pass as ``model.stage_overhead_ms`` (the load factor as
``model.host_cpu_factor``), the rest of its service time (role, layers of the runner's even
split, tokens per pass, codec) as its ``table``, the drafting time at K (+ ``width_ms`` for a
tree; the MTP head's at the last stage), a batched pass's cost per request beyond the first
(``model.stage_sequence_ms``, ``drafter.sequence_ms``; bundles with ``batch``), a hop's mean
per-message cost as its
``per_message_ms`` with the rest of the bundle's distribution as zero-mean empirical jitter, the
chain / tree / MTP acceptance profile fitted across K with the bundle's wire-quality table,
and the cost of a pass and of a message after an idle (``model.stage_idle_cost``,
``network.idle_cost``, less what the bundle's own costs hold: :func:`idle_tables`).
Nothing measured on the cell enters its prediction.

Load matching (the machine is shared): every round starts with a short re-profile (2 stages,
3+3 layers, K=4, three of the profile's prompts, about a second), a slice of it runs before
every cell, one more closes the last round; each one's median stage + drafting time and
median per-message cost over the same medians of the bundle's own passes of that
configuration give two factors (:func:`load_factors`); a round's cells use the geometric mean
of the round's re-profiles and the next one after it (:func:`round_factors`), which scale the
bundle's CPU and per-message costs. The bundle-only prediction (factors 1) is reported beside it.

Rounds: every runnable cell runs once per round (``rounds`` >= 2), the cell order reversed in
every other round, so load drifts hit the cells, their repeats and the re-profiles alike. Each
round decodes its own sample of the workload's prompts (:func:`wansim.calibrate.workload_sample.round_prompt_seed`; with
``same_prompts`` every round replays round 0's), so a cell's runs vary as a deployment's
measurements do from one batch of its traffic to the next. The real side of a cell is the mean
over its runs (over all its rounds' prompts); its run-to-run spread is (max - min) / mean per
metric; a prediction error within twice that spread is as good as the real system repeats
itself. (With replayed prompts greedy runs repeat their tokens, the spread holds only the
timing's noise, and the prompt sample's share of an error is in no spread:
:func:`wansim.calibrate.report.chance_beyond_spread`.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from wansim.calibrate.bundle import Bundle, check_model, load_bundle
from wansim.calibrate.cells import forward_header_bytes, return_message_bytes
from wansim.calibrate.length_profile import length_profile
from wansim.calibrate.matrix import Cell, load_matrix
from wansim.calibrate.workload_profile import recorded_profiles, workload_profiles
from wansim.calibrate.workload_sample import (
    cell_prompts,
    drafter_kind,
    prompt_seeds,
    prompts_decoded,
    round_prompt_seed,
)
from wansim.errors import WansimInputError
from wansim.real.errors import PipelineError  # no torch there
from wansim.stages.profiled_cost import even_split, stage_role
from wansim.support.hold import checkpoint

METRICS = ("tokens_per_s", "lap_ms_p50", "lap_ms_p99", "tpot_ms_p99")
REPROFILE = {"k": 4, "prompts": 3, "tokens": 32}


@dataclasses.dataclass(frozen=True)
class Factors:
    """Load now / load when profiled, from a short re-profile (1 = the bundle as measured)."""

    compute: float = 1.0
    draft: float = 1.0
    forward: float = 1.0
    back: float = 1.0  # the return hop

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- input checks
def check_cells(cells: list[Cell], bundle: Bundle, where: str = "--matrix") -> None:
    """Cells the bundle cannot support: one line, before anything runs."""
    layers = int(bundle.model["layers"])
    bits = set(bundle.stage_cost.codec_ms_per_op) & bundle.quality_bits
    for i, c in enumerate(cells):
        at = f"{where}: cells[{i}] ({c.label})"
        if c.stages > layers:
            raise WansimInputError(
                f"{at}.stages",
                f"must be <= {layers}: the profiled model ({bundle.model['target']}) has "
                f"{layers} layers",
                c.stages,
            )
        if c.k > bundle.max_k:
            raise WansimInputError(
                f"{at}.k",
                f"must be <= {bundle.max_k}: the bundle's drafter and acceptance were profiled "
                f"up to K={bundle.max_k}",
                c.k,
            )
        if c.drafter == "mtp" and not bundle.has_mtp:
            raise WansimInputError(
                f"{at}.drafter",
                "must be draft_model: the bundle did not profile an MTP head (run `wansim "
                "calibrate profile` with --mtp)",
                c.drafter,
            )
        if c.bits not in bits:
            raise WansimInputError(
                f"{at}.bits",
                f"must be one of the profiled widths {' | '.join(map(str, sorted(bits)))}",
                c.bits,
            )


# ----------------------------------------------------------------------------- scenarios
def cell_scenario(
    cell: Cell,
    bundle: Bundle,
    cell_dir: Path,
    factors: Factors = Factors(),
    des_requests: int = 1000,
    seed: int = 0,
    acceptance: Path | None = None,
) -> dict:
    """The cell's scenario from its configuration and the bundle (module docstring); writes
    ``scenario.yaml`` and the per-message jitter sample files into ``cell_dir``.
    ``acceptance``: another acceptance profile than the bundle's (the cells' own prompts,
    :mod:`wansim.calibrate.workload_profile`); every cost still comes from the bundle."""
    import yaml

    cell_dir.mkdir(parents=True, exist_ok=True)
    m = bundle.model
    vocab = int(m["vocab_size"])
    n = pass_tokens(cell)
    cost = bundle.stage_cost
    per_stage = even_split(int(m["layers"]), cell.stages)
    tables, overhead = [], []
    idle_roles = idle_tables(cell, bundle)
    for i, layers in enumerate(per_stage):
        role = stage_role(i, cell.stages)
        fixed = cost.fixed_ms[role]
        extra = _mtp_fixed_extra(cell, bundle, role)
        # every pass size the cell runs (a chain K + 1 tokens, a tree of 2K nodes 2K + 1),
        # each from the bundle's formula, and the prefill at the bundle's prompt length
        pts = {
            float(x): (cost.verify_ms(role, layers, x, cell.bits) - fixed) * factors.compute
            for x in range(1, n + 1)
        }
        pts[float(bundle.prompt_tokens)] = (cost.prefill_ms(role, layers) - fixed) * factors.compute
        # the engines never see a pass below 0 ms: the fixed part absorbs a negative remainder
        low = min(0.0, *pts.values())
        # the bundle's passes idled too: their cost after that idle comes off (the engines
        # add the cell's own, model.idle_cost)
        warm = fixed + extra + low / factors.compute - idle_roles[i][1]
        overhead.append(max(0.0, warm))
        pts = {k: v - low for k, v in pts.items()}
        tables.append({"kind": "table", "points": [[k, v] for k, v in sorted(pts.items())]})
    hops = []
    per_message = {}
    for role, scale, fname in (
        ("forward", factors.forward, "forward_jitter_ms.txt"),
        ("return", factors.back, "return_jitter_ms.txt"),
    ):
        samples = bundle.error_samples(role) * scale
        mean = max(0.0, float(np.mean(samples)))
        resid = samples - mean
        # the bundle's messages idled too: their cost after that idle comes off (the engines
        # add the cell's own, network.idle_cost)
        per_message[role] = max(0.0, mean - message_reference_ms(bundle) * scale)
        (cell_dir / fname).write_text(
            f"# {role} hops: the bundle's per-message cost samples (achieved - scheduled ms)"
            f" x {scale:.4f} (load factor), minus their mean {mean:.6f} ms (the hop's"
            " per_message_ms, less the bundle's own idle cost)\n"
            + "\n".join(repr(float(x)) for x in resid)
            + "\n"
        )
    for h in range(cell.stages):
        role = "return" if h == cell.stages - 1 else "forward"
        hops.append(
            {
                "per_message_ms": per_message[role],
                "jitter": {"kind": "empirical", "samples_file": f"{role}_jitter_ms.txt"},
            }
        )
    raw: dict = {
        "name": f"predict-{cell.label}",
        "seed": int(seed),
        "stages": cell.stages,
        "model": {
            "hidden_size": int(m["hidden_size"]),
            "compute": dict(tables[0]),
            "stage_compute": tables,
            "stage_overhead_ms": overhead,
            "host_cpu_factor": factors.compute,
            # every stage process (and the drafter) on the profiled host's cores
            "host_cores": bundle.host_cores,
        },
        "network": {
            "latency_ms": cell.latency_ms,
            "bandwidth_mbps": cell.bandwidth_mbps,
            "jitter": {"kind": "none"},
            "loss_rate": cell.loss_rate,
            "hops": hops,
        },
        "payload": {
            "activation_bits": cell.bits,
            "header_bytes": forward_header_bytes(cell.k, "greedy", vocab),
            "return_bytes": return_message_bytes(cell.k, "greedy", vocab, cell.drafter),
        },
        "workload": {
            "requests": int(des_requests),
            "concurrency": cell.concurrency,
            "prompt_tokens": bundle.prompt_tokens,
            "output_tokens": cell.tokens,
            "arrival": "closed",
        },
        "schedule": {"kind": cell.schedule, "batching": cell.batching},
    }
    if bundle.idle_message:  # a message after its sender idled (the message load factor)
        raw["network"]["idle_cost"] = {
            "points": [[g, e * factors.forward] for g, e in bundle.idle_message[0]]
        }
    if bundle.idle_points:  # a pass after an idle costs more (the load factor scales it)
        raw["model"]["stage_idle_cost"] = [
            {"points": [[g, e * factors.compute] for g, e in points]} for points, _ in idle_roles
        ]
        raw["model"]["idle_follows"] = idle_follows(bundle)
    if cell.schedule == "async":
        raw["schedule"]["max_inflight_blocks"] = cell.max_inflight_blocks
    if cell.batching == "continuous":  # prompts ride the micro-batch's passes, as in the real run
        raw["schedule"]["micro_batches"] = cell.micro_batches
        # each request beyond the first in a batched pass (host_cpu_factor scales it)
        raw["model"]["stage_sequence_ms"] = [
            max(0.0, bundle.sequence_ms(stage_role(i, cell.stages), layers))
            for i, layers in enumerate(per_stage)
        ]
    if cell.k > 0 and cell.drafter == "mtp":
        raw["drafter"] = {
            "kind": "mtp",
            "placement": "last_stage",
            "parallel": False,
            "draft_ms": bundle.mtp_draft_ms(cell.k) * factors.draft / cell.k,
            "acceptance": {
                "profile": str(
                    (
                        acceptance
                        or length_profile(bundle, cell, cell_dir)
                        or bundle.profile_at("mtp", cell.k)
                        or bundle.mtp_acceptance_profile
                    ).resolve()
                )
            },
        }
        raw["speculation"] = {"policy": "chain", "k": cell.k, "verifier": "greedy"}
    elif cell.k > 0:
        raw["drafter"] = {
            "kind": "draft_model",
            "placement": "first_stage",
            "parallel": False,
            "draft_ms": bundle.draft_ms(cell.k) * factors.draft / cell.k,
            "width_ms": max(0.0, bundle.draft_width_ms * factors.draft),
            "sequence_ms": max(0.0, bundle.draft_sequence_ms * factors.draft),
            "acceptance": {
                "profile": str(
                    (
                        acceptance
                        or length_profile(bundle, cell, cell_dir)
                        or bundle.profile_at(drafter_kind(cell), cell.k)
                        or (
                            bundle.tree_acceptance_profile
                            if cell.tree_branching
                            else bundle.acceptance_profile
                        )
                    ).resolve()
                )
            },
        }
        spec = {"policy": cell.policy, "k": cell.k, "verifier": "greedy"}
        if cell.tree_branching:
            spec["tree"] = {"kind": "static", "branching": list(cell.tree_branching)}
        raw["speculation"] = spec
    else:
        raw["drafter"] = {"kind": "draft_model", "placement": "first_stage", "draft_ms": 0.0}
        raw["speculation"] = {"policy": "none", "verifier": "greedy"}
    head = (
        f"# Out-of-sample prediction of {cell.label} ({cell.mechanism}) from its configuration\n"
        f"# and the profile bundle {bundle.path} (load factors {factors.as_dict()}).\n"
        "# Re-run: wansim run scenario.yaml --engine both\n"
    )
    (cell_dir / "scenario.yaml").write_text(head + yaml.safe_dump(raw, sort_keys=False))
    return raw


def message_reference_ms(bundle: Bundle) -> float:
    """The per-message idle cost the bundle's own messages paid (0 without the table)."""
    return bundle.idle_message[1] if bundle.idle_message else 0.0


def idle_follows(bundle: Bundle) -> str:
    """``model.idle_follows`` of the cells: ``host`` where every stage runs on the bundle's
    host (``host_cores``) and the bundle has the tables at the host's idle (a stage that idled
    while the others computed finds the host warm: run AC, docs/calibrate.md), else
    ``stage``."""
    return "host" if bundle.host_cores is not None and bundle.idle_host_roles else "stage"


def idle_tables(cell: Cell, bundle: Bundle) -> list[tuple[tuple, float]]:
    """Per stage of the cell: (the idle-cost points it pays, the extra its bundle costs
    already hold). Stage 0 of a cell the draft model drafts for idles into its drafting (the
    bundle's ``drafting`` table and reference: its drafting and first-stage costs were
    measured after that idle); every other stage (stage 0 of an MTP cell too, whose pipeline
    was profiled the same way) pays the ``pass`` table and holds its reference, except stage 0
    without drafting in a draft-model bundle (its first-stage cost was measured right after
    the drafting: warm, nothing held). A bundle with the pooled table only: that table and
    its reference everywhere; none: no cost ((), 0). On a shared host (:func:`idle_follows`)
    the tables at the host's idle."""
    if not bundle.idle_points:
        return [((), 0.0)] * cell.stages
    pooled = (bundle.idle_points, bundle.idle_reference_extra_ms)
    roles = bundle.idle_host_roles if idle_follows(bundle) == "host" else bundle.idle_roles
    drafting, passing = roles.get("drafting", pooled), roles.get("pass", pooled)
    out = [passing] * cell.stages
    if cell.k > 0 and cell.drafter != "mtp":
        out[0] = drafting
    elif cell.drafter != "mtp" and roles:
        out[0] = (passing[0], 0.0)
    return out


def _mtp_fixed_extra(cell: Cell, bundle: Bundle, role: str) -> float:
    """An MTP cell's first/last stage: the MTP pipeline's fixed cost less the draft model's."""
    if cell.drafter != "mtp" or role == "middle" or not bundle.mtp_fixed_ms:
        return 0.0
    return bundle.mtp_fixed_ms[role] - bundle.stage_cost.fixed_ms[role]


def draft_nodes(cell: Cell) -> int:
    """Draft nodes per pass: K for a chain, a static tree's nodes (children per node per
    depth, multiplied down the levels)."""
    if not cell.tree_branching:
        return cell.k
    nodes, width = 0, 1
    for b in cell.tree_branching:
        width *= b
        nodes += width
    return nodes


def pass_tokens(cell: Cell) -> int:
    """Tokens a verify pass carries: the drafts + the last committed token."""
    return draft_nodes(cell) + 1


def predicted_components(
    cell: Cell, bundle: Bundle, factors: Factors, idle_extra_ms=None, hop_extra_ms=None
) -> dict:
    """The parts of a predicted mean lap, as :func:`cell_scenario` sets them (ms): per-stage
    service at n = K + 1, the K drafts, the mean per-message cost by hop role. With
    ``idle_extra_ms`` (per stage, the analytical engine's cost after each stage's mean idle)
    the bundle's own idle cost comes off and the cell's goes on: on the drafting at stage 0
    when the draft model drafts there (the first work after its idle), else on the stage;
    with ``hop_extra_ms`` (per hop) likewise on the per-message cost of each hop role."""
    per_stage = even_split(int(bundle.model["layers"]), cell.stages)
    parts = _components(cell, bundle, factors, per_stage)
    if hop_extra_ms is not None and bundle.idle_message:
        ref = message_reference_ms(bundle) * factors.forward
        forward, back = hop_extra_ms[:-1], hop_extra_ms[-1:]
        for role, each in (("forward", forward), ("return", back)):
            if each:
                parts["per_message_ms"][role] += float(np.mean(each)) - ref
    if idle_extra_ms is None or not bundle.idle_points:
        return parts
    held = idle_tables(cell, bundle)
    for i, e in enumerate(idle_extra_ms):
        ref = held[i][1] * factors.compute
        if i == 0 and cell.k > 0 and cell.drafter != "mtp":
            parts["draft_ms"] += e - ref
        else:
            parts["stage_service_ms"][i] += e - ref
    return parts


def _components(cell: Cell, bundle: Bundle, factors: Factors, per_stage) -> dict:
    return {
        "stage_service_ms": [
            (
                bundle.stage_cost.verify_ms(
                    stage_role(i, cell.stages), lay, pass_tokens(cell), cell.bits
                )
                + _mtp_fixed_extra(cell, bundle, stage_role(i, cell.stages))
            )
            * factors.compute
            for i, lay in enumerate(per_stage)
        ],
        "draft_ms": (
            (bundle.mtp_draft_ms(cell.k) if cell.drafter == "mtp" else bundle.draft_ms(cell.k))
            + max(0.0, bundle.draft_width_ms) * (draft_nodes(cell) - cell.k)
        )
        * factors.draft,
        "per_message_ms": {
            "forward": float(np.mean(bundle.error_samples("forward"))) * factors.forward,
            "return": float(np.mean(bundle.error_samples("return"))) * factors.back,
        },
    }


def engines(scenario_path: Path, des: bool = True, sample_requests: int | None = None) -> dict:
    """DES and analytical metrics of a scenario file. With ``sample_requests`` (the real cell's
    request count) ``tpot_ms_p99`` is the same estimator as the real cell's: the expected p99
    of that many requests' TPOTs (:func:`sample_p99`; the population's is kept as
    ``tpot_ms_p99_population``)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.results.result import jsonable

    sc = load_scenario(scenario_path)
    ana = analyze(sc)
    out = {"analytical": jsonable(ana.metrics)}
    note = oversubscribed_host(sc)
    if note:
        out["unmodelled"] = [note]
    if "idle_cost" in ana.details:  # each stage's cost after its mean idle (model.idle_cost)
        out["idle_extra_ms"] = ana.details["idle_cost"]["extra_ms"]
        out["hop_idle_extra_ms"] = ana.details["idle_cost"].get("hop_extra_ms")
    if sample_requests:
        m = out["analytical"]
        # the closed forms give TPOT quantiles: a normal through its p50 and p99
        sd = max(0.0, (m["tpot_ms_p99"] - m["tpot_ms_p50"]) / NORMAL_Z99)
        draws = np.random.default_rng(TPOT_SEED).normal(m["tpot_ms_p50"], sd, TPOT_DRAWS)
        m["tpot_ms_p99_population"] = m["tpot_ms_p99"]
        m["tpot_ms_p99"] = sample_p99(draws, sample_requests)
    if des:
        from wansim.sim import simulate
        from wansim.sim.metrics import measured_mask

        res = simulate(sc)
        out["des"] = jsonable(res.metrics)
        if "host" in res.details:  # the shared host's wait per pass (processor sharing)
            out["des"]["host_wait_ms_per_pass"] = res.details["host"]["wait_ms_per_job"]
        blocks = res.details.get("blocks")
        if blocks and blocks["bets_won"] + blocks["bets_lost"]:  # the block schedule's bets
            out["des"]["bet_win_rate"] = blocks["bets_won"] / (
                blocks["bets_won"] + blocks["bets_lost"]
            )
        if sample_requests:
            rec = res.details["record"]
            tpot = (rec.decode_ms / rec.decode_tokens)[measured_mask(rec)]
            out["des"]["tpot_ms_p99_population"] = out["des"]["tpot_ms_p99"]
            out["des"]["tpot_ms_p99"] = sample_p99(tpot, sample_requests)
    return out


def oversubscribed_host(scenario) -> str | None:
    """What the engines do not model about a cell whose stage processes outnumber the host's
    cores while several passes are in flight, or None. Measured (docs/calibrate.md, Runs Z
    and AD; each run's ``stage_wait_ms_per_pass`` against the DES's ``host_wait_ms_per_pass``):
    on the 4-stage rings with 4 in flight a real pass waits 0.7-1.4 ms for a core, 2-3x what
    processor sharing of the stages' computes gives (0.24-0.47, beyond a baseline of 0.2-0.4
    the bundle's passes carry too), at 1.1-1.3 busy cores; the run's CPU is what the DES's
    is. Not the vCPUs halting, not a slice longer than the passes (first-come-first-served
    waits less). Sharing ~1.6 cores fits these cells but not 3-stage rings, which 2 cores
    predict within 1% (and a busy 0.5 ms one the real host serves faster than either). Where
    it comes from: a pass with at most one other compute beside it waits 0.13-0.47 ms on 5 ms
    rings (none on a busy 0.5 ms ring): the kernel queues a woken stage on the busy core while
    the other idles."""
    from wansim.stages.host_cpu import passes_in_flight

    cores, stages = scenario.model.host_cores, int(np.max(scenario.stages))
    in_flight = passes_in_flight(scenario)
    if cores is None or stages <= cores or in_flight <= 1:
        return None
    return (
        f"oversubscribed host: {stages} stage processes on {cores} cores with {in_flight} "
        "passes in flight; the engines share the cores by processor sharing, while real "
        "passes wait for a core 2-3x longer (the table's 'waited', docs/calibrate.md, "
        "Runs Z and AD)"
    )


SAMPLE_BAND_SEEDS = 200  # DES runs of the cell's request count (its chance band)


def des_sample_band(scenario_path: Path, requests: int, seeds: int = SAMPLE_BAND_SEEDS) -> dict:
    """The DES's tokens/s over ``seeds`` runs of ``requests`` requests (the real cell's prompt
    count), seeds 0..seeds-1: how far a run of that few requests moves by chance (their
    acceptance draws and difficulty, the bets, the last pass of each request). Its 2.5 / 50 /
    97.5 percentiles; a real cell's tokens/s inside [p2_5, p97_5] is as close as that many
    requests can show (the long-run prediction is the engines' 1,000-request run)."""
    import dataclasses as dc

    from wansim.config.scenario import load_scenario
    from wansim.sim import simulate

    sc = load_scenario(scenario_path)
    wl = dc.replace(sc.workload, requests=int(requests))
    rates = [
        simulate(dc.replace(sc, seed=i, workload=wl)).metrics["tokens_per_s"] for i in range(seeds)
    ]
    lo, mid, hi = np.percentile(np.asarray(rates, dtype=float), [2.5, 50, 97.5])
    return {"requests": int(requests), "seeds": seeds, "p2_5": lo, "p50": mid, "p97_5": hi}


NORMAL_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile
TPOT_SEED = 12
TPOT_DRAWS = 4000
TPOT_SAMPLES = 2000


def sample_p99(population, n: int, samples: int = TPOT_SAMPLES, seed: int = TPOT_SEED) -> float:
    """The mean over ``samples`` random draws of ``n`` values from ``population`` (without
    replacement when it has enough) of their p99 (``np.quantile``, linear interpolation, as
    the real cell computes it over its ``n`` requests): the predicted value of the real
    estimator, which for a few requests sits near their maximum, not at the population's
    p99."""
    x = np.asarray(population, dtype=float)
    rng = np.random.default_rng(seed)
    replace = len(x) < n
    picks = np.stack([rng.choice(x, size=n, replace=replace) for _ in range(samples)])
    return float(np.mean(np.quantile(picks, 0.99, axis=1)))


# ----------------------------------------------------------------------------- real runs
def _target_layers(target_dir: str) -> int:
    return int(json.loads((Path(target_dir) / "config.json").read_text())["num_hidden_layers"])


def run_real_cell(
    cell: Cell, target_dir: str, drafter_dir: str, prompts, run_dir: Path, mtp_dir: str = ""
) -> dict:
    """One real run of a runnable cell: the simulator-definition metrics, the per-stage service
    means, the per-message cost by hop role, the machine's load average before/after and its
    CPU over the decode (``host_cpu``: busy cores, the run's own, others', steal)."""
    from wansim.calibrate.measure import decompose, real_bets, real_metrics
    from wansim.calibrate.profile_fits import hop_error_rows
    from wansim.real.config import DecodeSpec, PipelineSpec, TreeSpec
    from wansim.real.host_load import measured
    from wansim.real.link import LinkSpec
    from wansim.real.recording import read_raw
    from wansim.real.runner import Pipeline

    decode = DecodeSpec(
        k=cell.k,
        max_new_tokens=cell.tokens,
        tree=TreeSpec("static", branching=cell.tree_branching) if cell.tree_branching else None,
        schedule=cell.schedule,
        max_inflight_blocks=cell.max_inflight_blocks,
        concurrency=cell.concurrency,
        batching=cell.batching,
        micro_batches=cell.micro_batches,
    )
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir if cell.k > 0 and cell.drafter == "draft_model" else None,
        drafter_kind=cell.drafter,
        mtp_dir=mtp_dir if cell.drafter == "mtp" else None,
        stages=cell.stages,
        links=(
            LinkSpec(
                latency_ms=cell.latency_ms,
                bandwidth_mbps=cell.bandwidth_mbps,
                loss_rate=cell.loss_rate,
            ),
        ),
        activation_bits=cell.bits,
    )
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with Pipeline(spec, run_dir) as pipe:
        res, load = measured(pipe.pids, partial(pipe.generate, prompts, decode, name="job"))
        relays = pipe.relay_priorities()
    raw = read_raw(run_dir / "raw", cell.stages)
    passes = decompose(res.steps, raw, cell.stages)
    real = real_metrics(passes, cell.stages, cell.tokens)
    if cell.schedule == "async":
        real["bets"] = real_bets(raw["steps"], raw.get("cancelled"))
    v = passes[passes["kind"] == "verify"]
    real["stage_service_ms_mean"] = [float(v[f"service{i}_ms"].mean()) for i in range(cell.stages)]
    real["draft_ms_mean"] = float(v["draft_ms"].mean())
    err = hop_error_rows(passes, cell.stages)
    real["per_message_ms_mean"] = {
        r: float(err.loc[err["role"] == r, "error_ms"].mean()) for r in ("forward", "return")
    }
    real["load_avg_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    # the host's cores over the decode itself (wansim.real.host_load): the run's and others'
    real["host_cpu"] = load.as_dict() if load else None
    real["stage_wait_ms_per_pass"] = stage_waits(load, raw, cell.stages)
    real["relay_priority"] = relays  # per hop: realtime | nice | normal (wansim.real.relay)
    real["seconds"] = round(time.perf_counter() - t0, 1)
    return real


def stage_waits(load, raw: dict, stages: int) -> list[float | None] | None:
    """Per stage: its process's wait for a core over the decode (``host_cpu.
    wait_ms_by_process``, :mod:`wansim.real.host_load`) per pass it served (its raw rows:
    prefills, verify passes, cancelled blocks); None where the kernel kept no schedstats. The
    DES's counterpart is its shared host's wait per job (``host_wait_ms_per_pass``)."""
    waits = dict(load.wait_ms_by_process) if load else {}
    if not waits:
        return None
    out = []
    for i in range(stages):
        rows = raw.get(f"stage{i}")
        n = 0 if rows is None else len(rows)
        w = waits.get(f"stage{i}")
        out.append(w / n if w is not None and n else None)
    return out


def load_factors(bundle: Bundle, stage, draft, hops, k: int, split) -> Factors:
    """Load now / load when profiled, like for like: the re-profile's median stage service
    (first + last), median drafting and median per-message cost over the same medians of the
    bundle's own passes of that configuration (layer split, fp32, K). Medians: a short run under
    load has a heavy tail of a few stalled passes; its typical pass moves with the load."""

    def med(x) -> float:
        x = np.asarray(x, dtype=float)
        x = x[np.isfinite(x)]
        return float(np.median(x)) if len(x) else math.nan

    def chains(rows):
        col = "tree_nodes" if "tree_nodes" in rows.columns else None
        if col is None and "nodes" in rows.columns:
            return rows[rows["nodes"] == rows["k"]]
        return rows if col is None else rows[rows[col] == 0]

    def cpu_of(rows, drafts) -> float:
        rows, drafts = chains(rows), chains(drafts)
        v = rows[(rows["kind"] == "verify") & (rows["n_tokens"] == k + 1)]
        total = 0.0
        for role, (lo, hi) in zip(("first", "last"), split, strict=True):
            total += med(v.loc[(v["role"] == role) & (v["layers"] == hi - lo), "service_ms"])
        return total + med(drafts.loc[drafts["k"] == k, "draft_ms"])

    ref = bundle.stage_passes
    ref = ref[ref["bits"] == 32]

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else 1.0

    cpu = ratio(cpu_of(stage, draft), cpu_of(ref, bundle.drafter_rows))
    msg = ratio(med(hops["error_ms"]), med(bundle.emulator_error["error_ms"]))
    return Factors(compute=cpu, draft=cpu, forward=msg, back=msg)


def reprofile(
    bundle: Bundle, target_dir: str, drafter_dir: str, run_dir: Path
) -> tuple[Factors, dict]:
    """A short 2-stage run like one of the bundle's plans: load factors (module docstring)."""
    from wansim.calibrate.profiling import PROFILE_SEED, REFERENCE_SPLIT, run_plan
    from wansim.real.prompts import builtin_prompts

    k = REPROFILE["k"]
    prompts = builtin_prompts("code", REPROFILE["prompts"], bundle.prompt_tokens, seed=PROFILE_SEED)
    r = run_plan(
        target_dir, drafter_dir, REFERENCE_SPLIT, 32, (k,), prompts, REPROFILE["tokens"], run_dir
    )
    f = load_factors(bundle, r["stage"], r["draft"], r["hops"], k, REFERENCE_SPLIT)
    info = {"factors": f.as_dict(), "load_avg_1min": list(r["load"])}
    return f, info


def geometric_mean(factors: list[Factors]) -> Factors:
    """The factors' geometric mean, key by key (ratios: a 0.8 and a 1.25 average to 1)."""
    keys = Factors().as_dict()
    return Factors(
        **{key: math.exp(np.mean([math.log(getattr(f, key)) for f in factors])) for key in keys}
    )


def reprofile_rounds(profiles: list[dict]) -> list[int]:
    """The round each re-profile was taken in (``round``; before the slices, its ``index``)."""
    return [p.get("round", p.get("index", i)) for i, p in enumerate(profiles)]


def round_factors(profiles: list[dict], r: int) -> tuple[Factors, list[dict]]:
    """Round ``r``'s factors and the re-profiles they come from: the geometric mean of every
    re-profile taken in the round (its opening one and the slice before each of its cells)
    and the first one after it (the next round's opening, or the closing re-profile; absent
    in a stopped run). A re-profile without a ``round`` (runs recorded before the slices)
    was the round's opening one, ``round`` = its index: the mean is then the bracket of two.

    Why every cell gets a slice: on this shared host the CPU's speed moves ~16% between
    5-second windows and still ~9% between 20-second ones, so each one-second re-profile
    reads it to +-20% (back to back 0.67-1.09) and the two at a round's ends the round's host
    to about +-15%; slices spread over the
    round's ~25 minutes average that noise down and follow what the round's cells met."""
    at = reprofile_rounds(profiles)
    inside = [p for p, a in zip(profiles, at, strict=True) if a == r]
    after = next((p for p, a in zip(profiles, at, strict=True) if a > r), None)
    used = inside + ([after] if after is not None else [])
    if not used:
        raise ValueError(f"no re-profile in or after round {r}")
    return geometric_mean([Factors(**p["factors"]) for p in used]), used


# ----------------------------------------------------------------------------- the command
@dataclasses.dataclass(frozen=True)
class PredictSettings:
    profile: str
    matrix: str | None = None
    quick: bool = False
    target_dir: str = ""
    drafter_dir: str = ""
    mtp_dir: str = ""
    out: str = "out/predict"
    rounds: int = 4
    des_requests: int = 1000
    seed: int = 0
    reuse: str | None = None  # a predict output dir: its real runs and re-profiles, no new run
    same_prompts: bool = False  # every round replays round 0's prompts (spread: timing only)


def prepare(s: PredictSettings) -> tuple[Bundle, list[Cell]]:
    """Every input check (bundle, model identity, matrix, cells) before any process starts."""
    if s.rounds < 2:
        raise WansimInputError(
            "--rounds", "must be an integer >= 2 (the run-to-run spread)", s.rounds
        )
    if s.des_requests < 2:
        raise WansimInputError("--des-requests", "must be an integer >= 2", s.des_requests)
    for flag, d in (("--target", s.target_dir), ("--drafter", s.drafter_dir)):
        if not (Path(d) / "config.json").is_file():
            raise WansimInputError(
                flag, "must be a local checkpoint directory holding config.json", d
            )
    bundle = load_bundle(s.profile)
    mtp = s.mtp_dir if s.mtp_dir and (Path(s.mtp_dir) / "mtp_config.json").is_file() else None
    check_model(bundle, s.target_dir, s.drafter_dir, "--profile", mtp)
    if _target_layers(s.target_dir) != int(bundle.model["layers"]):
        raise WansimInputError("--profile", "was profiled on a target with other layers", s.profile)
    cells = load_matrix(s.matrix, quick=s.quick)
    check_cells(cells, bundle, s.matrix or "heldout.yaml")
    if s.reuse:
        _recorded(s.reuse)  # recorded real runs to reuse (else one line, exit 2)
    if any(c.drafter == "mtp" and c.runnable for c in cells) and mtp is None:
        raise WansimInputError(
            "--mtp", "must be an MTP head directory holding mtp_config.json", s.mtp_dir
        )
    return bundle, cells


def run_predict(s: PredictSettings, progress: Callable[[str], None] | None = None) -> dict:
    """Predict, run, compare; writes ``OUT/predict.json`` and the two PNGs next to it."""
    from wansim.calibrate.report import build_result, write_outputs

    bundle, cells = prepare(s)
    say = progress or (lambda _m: None)
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runnable = [c for c in cells if c.runnable]
    say(
        f"{len(cells)} cells: {len(runnable)} to run x {s.rounds} rounds, "
        f"{len(cells) - len(runnable)} pending (mechanism not in the real path yet)"
    )
    seeds = [round_prompt_seed(r, s.same_prompts) for r in range(s.rounds)]
    prompts = {  # (count, seed) -> that round's sample
        (n, seed): cell_prompts(n, bundle.prompt_tokens, seed)
        for n in {c.prompts for c in runnable}
        for seed in set(seeds)
    }
    runs: dict[str, list] = {c.label: [] for c in runnable}
    profiles = []

    def keep() -> None:  # every finished real run and re-profile, as they finish
        _write_atomic(out / RUNS_FILE, _dumps({"runs": runs, "profiles": profiles}))

    def measure_load(r: int, before: str | None = None) -> None:
        i = len(profiles)
        factors, info = reprofile(
            bundle, s.target_dir, s.drafter_dir, out / "real" / f"reprofile{i}"
        )
        info.update(index=i, round=r, before=before)
        profiles.append(info)
        keep()
        say(
            f"  re-profile {i}{f' (before {before})' if before else ''}: load factors CPU "
            f"{factors.compute:.2f}, per-message {factors.forward:.2f} (load average "
            f"{info['load_avg_1min'][0]:.1f})"
        )

    failed: BaseException | None = None
    rounds_info = []
    if s.reuse:  # predict the recorded real runs again (after an engine change): no torch
        prior = _recorded(s.reuse)
        for label, recorded in prior["runs"].items():
            if label in runs and recorded:
                runs[label] = recorded
        if prior["rounds"] is not None:
            rounds_info = prior["rounds"]
        else:  # an interrupted run's re-profiles: its rounds' factors are averaged below
            profiles.extend(prior["profiles"])
        say(f"reusing the real runs of {s.reuse} ({sum(map(bool, runs.values()))} cells)")
    try:
        for r in range(0 if s.reuse else s.rounds):
            say(
                f"round {r + 1}/{s.rounds}: short re-profile (2 stages, K=4), then every cell, "
                "each after a slice of it"
            )
            measure_load(r)
            order = runnable if r % 2 == 0 else runnable[::-1]
            for c in order:
                measure_load(r, before=c.label)
                real = run_real_cell(
                    c,
                    s.target_dir,
                    s.drafter_dir,
                    prompts[(c.prompts, seeds[r])],
                    out / "real" / c.label / f"run{r}",
                    s.mtp_dir,
                )
                real["round"] = r
                real["prompt_seed"] = seeds[r]
                runs[c.label].append(real)
                keep()
                say(
                    f"  {c.label}: {real['tokens_per_s']:.1f} tok/s, lap p50 "
                    f"{real['lap_ms_p50']:.1f} ms, load {real['load_avg_1min'][0]:.1f}-"
                    f"{real['load_avg_1min'][1]:.1f}, {time.perf_counter() - t0:.0f} s"
                )
                checkpoint("predict-cell", sum(map(len, runs.values())))
        if not s.reuse:
            say("closing re-profile")
            measure_load(s.rounds)  # after the last round: it closes that round
    except (PipelineError, KeyboardInterrupt) as err:
        failed = err  # keep the finished cells: predicted and reported below, then re-raised
        say(f"stopped: {err or type(err).__name__}; predicting the finished cells")
    workload_dir = out / "workload"
    if s.reuse:
        workload = recorded_profiles(Path(s.reuse) / "workload")
    else:
        say("the cells' prompts in process (their own acceptance, no deployment) ...")
        workload = workload_profiles(
            [  # each cell with the prompts of every round it ran, pooled
                (c, [p for seed in prompt_seeds(runs[c.label]) for p in prompts[(c.prompts, seed)]])
                for c in runnable
                if runs[c.label]
            ],
            bundle,
            s.target_dir,
            s.drafter_dir,
            s.mtp_dir,
            workload_dir,
        )
    began = set(reprofile_rounds(profiles))
    for r in range(s.rounds):
        if r not in began:  # stopped before this round
            break
        f, used = round_factors(profiles, r)
        rounds_info.append({"round": r, "factors": f.as_dict(), "reprofiles": used})
    say("predicting every cell (DES and analytical) ...")
    predictions = {}
    for c in cells:
        cdir = out / "cells" / c.label
        per_round = []
        ran = {run["round"] for run in runs.get(c.label, [])}
        sample = prompts_decoded(c, runs.get(c.label, []))
        if c.runnable:
            for r, info in enumerate(rounds_info):
                if r not in ran:  # stopped before this cell's run of round r
                    continue
                f = Factors(**info["factors"])
                cell_scenario(c, bundle, cdir / f"round{r}", f, s.des_requests, s.seed)
                pred = engines(cdir / f"round{r}" / "scenario.yaml", sample_requests=c.prompts)
                pred["components"] = predicted_components(
                    c, bundle, f, pred.get("idle_extra_ms"), pred.get("hop_idle_extra_ms")
                )
                if r == 0:  # the chance of the cell's few requests (all its rounds' prompts)
                    pred["sample_band"] = des_sample_band(cdir / "round0" / "scenario.yaml", sample)
                own = workload.get((drafter_kind(c), sample, c.tokens, c.k))
                if own is not None:
                    wdir = cdir / f"round{r}_workload_acceptance"
                    cell_scenario(c, bundle, wdir, f, s.des_requests, s.seed, acceptance=own)
                    pred["workload_acceptance"] = engines(
                        wdir / "scenario.yaml", sample_requests=c.prompts
                    )
                per_round.append(pred)
        try:
            cell_scenario(c, bundle, cdir / "bundle_only", Factors(), s.des_requests, s.seed)
            only = engines(cdir / "bundle_only" / "scenario.yaml", des=not c.runnable)
        except WansimInputError as err:
            only = {"error": str(err)}
        predictions[c.label] = {"rounds": per_round, "bundle_only": only}
    result = build_result(
        cells, runs, predictions, rounds_info, bundle, s, time.perf_counter() - t0
    )
    if failed is not None:
        done = sorted(label for label, r in runs.items() if r)
        result["summary"]["complete"] = False
        result["summary"]["failed"] = f"{type(failed).__name__}: {failed}"
        result["summary"]["finished_cells"] = done
        (out / "predict.json").write_text(_dumps(result))
        say(f"kept {len(done)} finished cell(s) in {out / 'predict.json'}")
        raise PredictStopped(str(failed), result) from failed
    result["summary"]["complete"] = True
    write_outputs(result, out)
    say(f"wrote {out / 'predict.json'} and the plots in {time.perf_counter() - t0:.0f} s")
    return result


RUNS_FILE = "real_runs.json"  # OUT/: every finished real run and re-profile, kept as they finish


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _recorded(out_dir: str) -> dict:
    """The real runs a predict output dir recorded, to predict again: from a finished
    ``predict.json`` (its rounds' load factors), else from ``real_runs.json``, the runs and
    re-profiles a stopped or interrupted run kept as they finished. ``{"runs": {cell: [run]},
    "rounds": [...] | None, "profiles": [...]}``; one line, exit 2, when there is neither."""
    try:
        prior = json.loads((Path(out_dir) / "predict.json").read_text())
        if not isinstance(prior["summary"]["rounds"], list) or not isinstance(prior["cells"], list):
            raise TypeError("rounds and cells must be lists")
        runs = {e["name"]: e["real"]["runs"] for e in prior["cells"] if e.get("real")}
        return {"runs": runs, "rounds": prior["summary"]["rounds"], "profiles": []}
    except OSError:
        pass  # no predict.json: an interrupted run's own record, below
    except (ValueError, KeyError, TypeError):
        raise WansimInputError(
            "--reuse", "must be a calibrate predict output dir holding predict.json", out_dir
        ) from None
    try:
        kept = json.loads((Path(out_dir) / RUNS_FILE).read_text())
        if not isinstance(kept["runs"], dict) or not isinstance(kept["profiles"], list):
            raise TypeError("runs must be a mapping, profiles a list")
        if not kept["profiles"] or not any(kept["runs"].values()):
            raise ValueError("no re-profile or no real run finished")
    except (OSError, ValueError, KeyError, TypeError):
        raise WansimInputError(
            "--reuse",
            f"must be a calibrate predict output dir holding predict.json or {RUNS_FILE} "
            "(an interrupted run's finished real runs)",
            out_dir,
        ) from None
    return {"runs": kept["runs"], "rounds": None, "profiles": kept["profiles"]}


class PredictStopped(RuntimeError):
    """A stage crashed (or Ctrl-C) mid-run: ``result`` holds the finished cells (real runs and
    both engines' predictions), also written to ``OUT/predict.json`` with ``complete: false``;
    the message is the pipeline's named error."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


def _dumps(result: dict) -> str:
    from wansim.calibrate.report import dumps

    return dumps(result)

"""The scenario: scenario YAML -> one frozen :class:`Scenario` of its sections, with defaults,
overrides and strict validation (:func:`load_scenario`).

The schema is README.md's scenario section; each section is a module of this package
(``model``, ``network``, ``payload``, ``drafter``, ``speculation``, ``schedule``,
``workload``, ``faults``), and this module holds what spans them: the checks between sections,
the hops as resolved from the network's defaults and overrides, loading (``extends:``,
resolvers, presets, file fields) and acceptance coverage. Every field has a default; a partial
mapping keeps the defaults of what it omits; unknown keys, wrong types and out-of-range values
are errors naming the dotted field path. ``--set a.b=v`` overrides
(:mod:`wansim.config.overrides`) are applied to the raw YAML (:mod:`wansim.config.raw`) before
validation, so they are typed and checked exactly like the file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from wansim.config.drafter import HIDDEN_STATE_DRAFTERS, Drafter
from wansim.config.faults import Faults
from wansim.config.limits import DEFAULT_STAGES, MAX_STAGES
from wansim.config.model import ComputeModel, Model
from wansim.config.network import Hop, HopOverride, Jitter, Network
from wansim.config.overrides import apply_overrides
from wansim.config.payload import Payload
from wansim.config.raw import (
    anchor_files,
    merge_scenarios,
    read_yaml_mapping,
    resolve_file,
    to_plain,
)
from wansim.config.schedule import CANCEL_ON_DIVERGENCE, FLUSH_ON_FULL_ACCEPTANCE, Schedule
from wansim.config.speculation import Speculation
from wansim.config.validation import parse, spec
from wansim.config.workload import Workload
from wansim.data import is_dir, on_disk_or_shipped
from wansim.errors import ScenarioError, WansimInputError


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str = spec("scenario")
    seed: int = spec(0, ge=0, le=2**63 - 1)
    stages: int = spec(DEFAULT_STAGES, ge=1, le=MAX_STAGES)
    model: Model = spec(factory=Model)
    network: Network = spec(factory=Network)
    payload: Payload = spec(factory=Payload)
    drafter: Drafter = spec(factory=Drafter)
    speculation: Speculation = spec(factory=Speculation)
    schedule: Schedule = spec(factory=Schedule)
    workload: Workload = spec(factory=Workload)
    faults: Faults = spec(factory=Faults)

    def check(self, path: str) -> None:
        self._check_schedule()
        for i, event in enumerate(self.faults.events):
            for name in ("stage", "link"):
                index = getattr(event, name)
                if index is not None and index >= self.stages:
                    raise ScenarioError(
                        f"faults.events[{i}].{name}",
                        f"must be < stages ({self.stages}; {name}s are numbered from 0)",
                        index,
                    )
        m = self.model
        for path, entries, what in (
            ("network.hops", self.network.hops, "one per stage; the last is the return hop"),
            ("model.stage_compute", m.stage_compute, "one compute model per stage"),
            ("model.stage_idle_cost", m.stage_idle_cost, "one per stage; or use model.idle_cost"),
            (
                "model.stage_overhead_ms",
                m.stage_overhead_ms,
                "one per stage; or use model.overhead_ms",
            ),
            (
                "model.stage_sequence_ms",
                m.stage_sequence_ms,
                "one per stage; or use model.sequence_ms",
            ),
        ):
            if entries and len(entries) != self.stages:
                raise ScenarioError(
                    path, f"needs {self.stages} entries ({what})", f"{len(entries)} entries"
                )
        for i, extra in enumerate(self.payload.extra_tensors):
            to_stage = self.stages - 1 if extra.to_stage is None else extra.to_stage
            if not extra.stage < to_stage <= self.stages:
                raise ScenarioError(
                    f"payload.extra_tensors[{i}].to_stage"
                    if extra.to_stage is not None
                    else f"payload.extra_tensors[{i}].stage",
                    f"needs stage < to_stage <= stages ({self.stages}; to_stage defaults to the"
                    f" last stage, {self.stages} is S0 over the return hop), stage is"
                    f" {extra.stage}",
                    to_stage if extra.to_stage is not None else extra.stage,
                )
        for name in ("noise", "straggler"):
            for j, s in enumerate(getattr(self.model, name).stages):
                if s >= self.stages:
                    raise ScenarioError(
                        f"model.{name}.stages[{j}]", f"must name a stage < {self.stages}", s
                    )

    def _check_schedule(self) -> None:
        """Async in-pipe speculation bets on drafts S0 drafted itself (module Schedule)."""
        sched = self.schedule
        if sched.kind == "sync" and sched.max_inflight_blocks != 1:
            raise ScenarioError(
                "schedule.max_inflight_blocks",
                "the sync schedule keeps one block in flight per request (use kind: async)",
                sched.max_inflight_blocks,
            )
        if sched.async_protocol != CANCEL_ON_DIVERGENCE and sched.kind != "async":
            raise ScenarioError(
                "schedule.async_protocol",
                f"is the async schedule's protocol (schedule.kind is {sched.kind}; use async)",
                sched.async_protocol,
            )
        self._check_micro_batches()
        self._check_hybrid()
        if sched.kind != "async":
            return
        if sched.async_protocol == FLUSH_ON_FULL_ACCEPTANCE and self.k < 2:
            raise ScenarioError(
                "speculation.k",
                "flush_on_full_acceptance commits K drafts or one token: it needs K >= 2",
                self.speculation.k,
            )
        if self.drafter.placement != "first_stage":
            raise ScenarioError(
                "drafter.placement",
                "async needs the drafter on S0 (first_stage) to draft the next block from its own"
                " drafts before the verdict returns; a last_stage drafter drafts only after a"
                " verification",
                self.drafter.placement,
            )
        if self.speculation.policy == "none":
            raise ScenarioError(
                "speculation.policy",
                "async launches draft blocks ahead of their verdicts: it needs speculation"
                " (policy chain)",
                "none",
            )
        if self.drafter.kind in HIDDEN_STATE_DRAFTERS:
            raise ScenarioError(
                "drafter.kind",
                "reads the last stage's hidden state, which S0 does not have for drafts still in"
                " flight: async at first_stage needs a drafter of token ids (draft_model | ngram)",
                self.drafter.kind,
            )

    def _check_hybrid(self) -> None:
        """The per-round hybrid mixes async chain rounds with sync tree rounds
        (:mod:`wansim.speculation.hybrid_rounds`): it needs the async schedule with a chain, one
        request's blocks per message (no continuous batching) and S0 drafting."""
        sched = self.schedule
        p = sched.hybrid_confident_fraction
        if p is None:
            return
        field = "schedule.hybrid_confident_fraction"
        if sched.kind != "async":
            raise ScenarioError(
                field,
                f"mixes async chain rounds with tree rounds: needs schedule.kind: async"
                f" (is {sched.kind})",
                p,
            )
        if self.speculation.policy != "chain":
            raise ScenarioError(
                "speculation.policy",
                "the hybrid's confident rounds are chains (its other rounds verify"
                " speculation.tree): needs policy chain",
                self.speculation.policy,
            )
        if sched.batching != "none":
            raise ScenarioError(
                "schedule.batching",
                "the hybrid's rounds are per request: needs batching: none",
                sched.batching,
            )
        if self.drafter.overlap:
            raise ScenarioError(
                "drafter.overlap",
                "the hybrid drafts on S0 between its rounds (an overlapped drafter is not"
                " modelled with it): needs overlap: false",
                True,
            )
        if sched.hedge_branches:
            raise ScenarioError(
                "schedule.hedge_branches",
                "hedge branches are a sync chain's; the hybrid's rounds are async chains or"
                " trees: needs 0",
                sched.hedge_branches,
            )

    def _check_micro_batches(self) -> None:
        """Micro-batches are a form of continuous batching in the sync schedule
        (:mod:`wansim.serving.micro_batching`); their two knobs need them."""
        sched = self.schedule
        if sched.micro_batches is None:
            for name in ("max_batch_size", "prefill_chunk_tokens"):
                if getattr(sched, name) is not None:
                    raise ScenarioError(
                        f"schedule.{name}",
                        "applies to micro-batches: set schedule.micro_batches too",
                        getattr(sched, name),
                    )
            return
        if sched.batching != "continuous":
            raise ScenarioError(
                "schedule.micro_batches",
                "are batches of continuous batching: needs schedule.batching: continuous",
                sched.micro_batches,
            )
        if sched.kind == "async" or (self.drafter.overlap and self.speculation.policy != "none"):
            raise ScenarioError(
                "schedule.micro_batches",
                "run the sync schedule (async and an overlapped drafter keep several blocks of"
                " one sequence in flight, so it cannot belong to one micro-batch: README,"
                " 'Scheduling levers'; use batching: continuous without micro_batches): needs"
                " schedule.kind: sync and drafter.overlap: false",
                sched.micro_batches,
            )

    @property
    def k(self) -> int:
        """Draft tokens per verify pass (0 without speculation)."""
        return 0 if self.speculation.policy == "none" else self.speculation.k

    def stage_compute_models(self) -> tuple[ComputeModel, ...]:
        """Stage i's compute model: ``model.stage_compute[i]`` where given, else
        ``model.compute`` (scalar ``stages``)."""
        return self.model.stage_compute or (self.model.compute,) * int(self.stages)

    def resolved_hops(self) -> tuple[Hop, ...]:
        """The P hops of the ring: hop i is S_i -> S_(i+1); hop P-1 is the return hop to S0."""
        net = self.network
        out = []
        for i in range(self.stages):
            o = net.hops[i] if net.hops else HopOverride()
            out.append(
                Hop(
                    latency_ms=net.latency_ms if o.latency_ms is None else o.latency_ms,
                    bandwidth_mbps=net.bandwidth_mbps
                    if o.bandwidth_mbps is None
                    else o.bandwidth_mbps,
                    jitter=net.jitter if o.jitter is None else o.jitter,
                    loss_rate=net.loss_rate if o.loss_rate is None else o.loss_rate,
                    retransmit_ms=net.retransmit_ms,
                    per_message_ms=net.per_message_ms
                    if o.per_message_ms is None
                    else o.per_message_ms,
                    codec_ms_per_mb=net.codec_ms_per_mb
                    if o.codec_ms_per_mb is None
                    else o.codec_ms_per_mb,
                )
            )
        return tuple(out)


def hop_name(i: int, stages: int) -> str:
    if i == stages - 1:
        return f"S{stages - 1}->S0 (return)"
    return f"S{i}->S{i + 1}"


# ----------------------------------------------------------------------------- loading
# Mappings that describe a scenario at a higher level, keyed by the top-level field that marks
# them (``nodes``: a deployment, resolved by wansim.deploy into a plain scenario mapping).
# The layers above register here (wansim/__init__.py), so this module imports none of them.
RAW_RESOLVERS: dict[str, Callable[[dict, Path], dict]] = {}


def register_raw_resolver(key: str, resolve: Callable[[dict, Path], dict]) -> None:
    """``resolve(raw, base_dir) -> scenario mapping`` for raw mappings that contain ``key``."""
    RAW_RESOLVERS[key] = resolve


def load_scenario(
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike | None = None,
) -> Scenario:
    """Load, override and validate a scenario (from a YAML file or an already-parsed mapping).

    ``overrides``: ``["a.b=v", ...]`` (values parsed as YAML scalars) or ``{"a.b": v}``.
    Relative file paths inside the scenario resolve against the scenario's folder (``base_dir``
    for ``data``; default the working directory), then the working directory, then the
    scenario folder's parents.
    """
    base_dir = Path.cwd() if base_dir is None else Path(base_dir).resolve()
    if data is None:
        if path is None:
            raise ScenarioError("scenario", "give a path or data", None)
        raw = read_scenario_raw(path)
        base_dir = on_disk_or_shipped(path).resolve().parent
    else:
        raw = to_plain(data)
    if not isinstance(raw, Mapping):
        raise ScenarioError("scenario", "must be a mapping", raw)
    if "base" in raw and ("grid" in raw or "zip" in raw):
        raise ScenarioError(
            "base",
            "a sweep file (base + grid), not a scenario: run it with `wansim sweep FILE`",
            raw["base"],
        )
    raw = apply_overrides(raw, overrides or (), in_place=data is not None)  # to_plain(data) copied
    for key, resolve in RAW_RESOLVERS.items():  # e.g. a deployment (``nodes``): wansim.deploy
        if key in raw:
            raw = resolve(raw, base_dir)
    raw = _apply_drafter_preset(raw)
    raw = _apply_compute_bundle(raw, base_dir)
    scenario = parse(Scenario, raw, "")
    scenario = _resolve_files(scenario, base_dir)
    _check_acceptance(scenario)
    if scenario.schedule.hybrid_confident_fraction is not None:  # its tree rounds' depth
        from wansim.speculation.hybrid_rounds import confident_fraction

        confident_fraction(scenario)  # ``profile`` resolves (else one line, exit 2)
        tree = dataclasses.replace(scenario.speculation, policy="tree")
        _check_acceptance(dataclasses.replace(scenario, speculation=tree))
    return scenario


def read_scenario_raw(path: str | os.PathLike, _seen: tuple = ()) -> dict:
    """The raw mapping of a scenario file, with ``extends: other.yaml`` merged in.

    ``extends`` names a scenario (relative to the file that says it) whose mapping this one
    deep-merges over: a family of scenarios states only what differs from its base. Relative
    file paths inside a file (acceptance profile, jitter samples) resolve against that file's
    own folder, whichever file extends it. An acceptance source (``profile``, ``alpha`` or
    ``per_position``) given by the extending file replaces the inherited one (see
    :func:`merge_acceptance`). An empty file is an error (``{}`` means "all defaults").
    """
    resolved = on_disk_or_shipped(path).resolve()
    if resolved in _seen:
        raise ScenarioError("extends", "cycle of scenarios extending each other", str(path))
    raw = read_yaml_mapping(path, "scenario")
    if raw is None:
        raise WansimInputError(
            "scenario", "the file is empty (write {} to run on the defaults)", str(path)
        )
    raw = anchor_files(raw, resolved.parent)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ScenarioError("extends", "must be a path to a scenario file", parent)
    parent_path = resolve_file(parent, resolved.parent, search_cwd=False)
    if parent_path is None:
        raise ScenarioError("extends", f"file not found (relative to {resolved.parent})", parent)
    return merge_scenarios(read_scenario_raw(parent_path, (*_seen, resolved)), raw)


def scenario_to_dict(scenario: Scenario) -> dict:
    return to_plain(scenario)


def _resolve_files(scenario: Scenario, base_dir: Path) -> Scenario:
    acc = scenario.drafter.acceptance
    if acc.profile is not None:
        found = resolve_file(acc.profile, base_dir)
        if found is None:
            raise ScenarioError("drafter.acceptance.profile", "file not found", acc.profile)
        acc = dataclasses.replace(acc, profile=str(found))
    if acc.activation_quality is not None:
        found = resolve_file(acc.activation_quality, base_dir)
        if found is None:
            raise ScenarioError(
                "drafter.acceptance.activation_quality", "file not found", acc.activation_quality
            )
        from wansim.acceptance.activation_quality import load_table

        load_table(found)  # checked now, one line, not mid-run
        acc = dataclasses.replace(acc, activation_quality=str(found))
    if acc is not scenario.drafter.acceptance:
        scenario = dataclasses.replace(
            scenario, drafter=dataclasses.replace(scenario.drafter, acceptance=acc)
        )

    def fix_jitter(j: Jitter | None, where: str) -> Jitter | None:
        if j is None or j.samples_file is None:
            return j
        found = resolve_file(j.samples_file, base_dir)
        if found is None:
            raise ScenarioError(f"{where}.samples_file", "file not found", j.samples_file)
        from wansim.links.expected_delay import read_samples

        read_samples(found, f"{where}.samples_file")  # its values are checked now, not mid-run
        return dataclasses.replace(j, samples_file=str(found))

    wl = scenario.workload
    if wl.trace is not None:
        found = resolve_file(wl.trace, base_dir)
        if found is None:
            raise ScenarioError("workload.trace", "file not found", wl.trace)

        wl = dataclasses.replace(wl, trace=str(found))
        scenario = dataclasses.replace(scenario, workload=wl)
    if wl.trace is not None or wl.arrival == "trace" or wl.lengths.kind in ("trace", "empirical"):
        from wansim.serving.workload import (
            check_workload,
        )  # (numpy: only for a workload that needs it)

        check_workload(wl)
    net = scenario.network
    hops = tuple(
        dataclasses.replace(h, jitter=fix_jitter(h.jitter, f"network.hops[{i}].jitter"))
        for i, h in enumerate(net.hops)
    )
    net = dataclasses.replace(net, jitter=fix_jitter(net.jitter, "network.jitter"), hops=hops)
    if net.trace_file is not None:
        found = resolve_file(net.trace_file, base_dir)
        if found is None:
            raise ScenarioError("network.trace_file", "file not found", net.trace_file)
        from wansim.links.nonstationary import read_trace

        read_trace(str(found))  # its samples are checked now, not mid-run
        net = dataclasses.replace(net, trace_file=str(found))
    return dataclasses.replace(scenario, network=net)


def _check_acceptance(scenario: Scenario) -> None:
    """Profile workload exists, and the profile/per-position vector covers K."""
    from wansim.acceptance.profile import load_profile

    acc = scenario.drafter.acceptance
    need = scenario.k
    field = "speculation.k"
    if scenario.speculation.policy == "tree":
        need = _tree_depth_needed(scenario)
        tree = scenario.speculation.tree
        field = "speculation.tree." + ("branching" if tree.kind == "static" else "max_depth")
    if acc.profile is not None:
        prof = load_profile(acc.profile)
        workload = acc.workload or prof.default_workload
        if workload not in prof.workloads:
            raise ScenarioError(
                "drafter.acceptance.workload",
                f"not in profile (has {', '.join(prof.workloads)})",
                workload,
            )
        for i, row in enumerate(scenario.workload.mix):
            if row.workload not in prof.workloads:
                raise ScenarioError(
                    f"workload.mix[{i}].workload",
                    f"not in profile (has {', '.join(prof.workloads)})",
                    row.workload,
                )
        measured = len(prof.workloads[workload].per_position)
        if need > measured and not acc.extrapolate:
            raise ScenarioError(
                field,
                f"profile measured positions 1..{measured} (set drafter.acceptance.extrapolate"
                " to hold the last rate)",
                need,
            )
    if scenario.workload.mix and acc.profile is None:
        raise ScenarioError(
            "workload.mix", "names profile workload rows: it needs drafter.acceptance.profile", None
        )
    if acc.per_position is not None:
        measured = len(acc.per_position)
        if need > measured and not acc.extrapolate:
            raise ScenarioError(
                field,
                f"per_position gives positions 1..{measured} (set drafter.acceptance.extrapolate"
                " to hold the last rate)",
                need,
            )


def acceptance_depth(scenario: Scenario) -> tuple[int, int | None]:
    """(positions the speculation needs: K, or the tree's depth; positions the acceptance
    measured: the profile workload's or per_position's length, None for a constant alpha).
    needed > measured means the rates beyond are extrapolated (the last one held)."""
    from wansim.acceptance.profile import load_profile

    acc = scenario.drafter.acceptance
    need = scenario.k
    if scenario.speculation.policy == "tree":
        need = _tree_depth_needed(scenario)
    if acc.profile is not None:
        prof = load_profile(acc.profile)
        workload = acc.workload or prof.default_workload
        return need, len(prof.workloads[workload].per_position)
    if acc.per_position is not None:
        return need, len(acc.per_position)
    return need, None


def _tree_depth_needed(scenario: Scenario) -> int:
    tree = scenario.speculation.tree
    if tree.kind == "static" and tree.branching:
        return len(tree.branching)
    if tree.max_depth is not None:
        return min(tree.max_depth, tree.budget_nodes)
    return 0


def _apply_compute_bundle(raw: dict, base_dir: Path) -> dict:
    """``model.compute: {kind: table, from: PROFILE_DIR}``: every stage's table from a profile
    bundle (``wansim calibrate profile``; :mod:`wansim.stages.profiled_cost`), unless ``stage_compute``
    is given."""
    model = raw.get("model")
    comp = model.get("compute") if isinstance(model, Mapping) else None
    if not isinstance(comp, Mapping) or "from" not in comp:
        return raw
    from wansim.stages.profiled_cost import tables_from_bundle

    where = "model.compute.from"
    if comp.get("kind", "table") != "table" or set(comp) - {"kind", "from"}:
        raise ScenarioError(where, "takes only kind: table beside it", dict(comp))
    if not isinstance(comp["from"], str):
        raise ScenarioError(where, "must be a profile bundle directory", comp["from"])
    found = resolve_file(comp["from"], base_dir)
    if found is None or not is_dir(found):
        raise ScenarioError(where, "profile bundle directory not found", comp["from"])
    stages = raw.get("stages", 10)
    payload = raw.get("payload")
    bits = payload.get("activation_bits", 16) if isinstance(payload, Mapping) else 16
    if not isinstance(stages, int) or not isinstance(bits, int):
        return raw  # the schema reports the bad field
    tables = tables_from_bundle(found, stages, bits, where)
    new = {**model, "compute": tables[0]}
    new.setdefault("stage_compute", tables)
    return {**raw, "model": new}


def _apply_drafter_preset(raw: dict) -> dict:
    """``drafter: {preset: NAME, ...}``: the catalog entry's values under the explicit keys."""
    drafter = raw.get("drafter")
    if not isinstance(drafter, Mapping) or drafter.get("preset") is None:
        return raw
    from wansim.speculation.drafters import preset_mapping

    merged = preset_mapping(drafter["preset"], drafter)
    return {**raw, "drafter": merged}

"""Layers -> stages: contiguous slices, one per node in ring order, balancing stage time.

Objective: minimise the slowest stage's pass time (the pipeline's throughput bound when it is
full), ties broken by the sum of stage times (one request's lap compute), subject to every
node's memory (:func:`wansim.deploy.stages.memory_gb`). Exact by dynamic programming over
(node, first layer): O(P * L^2) stage evaluations.

When no assignment fits, a second DP finds the assignment minimising the largest memory
shortfall, and the error names that node and its shortfall in GB.
"""

from __future__ import annotations

import dataclasses
import math

from wansim.deploy.stages import Load, Precision, StageSlice, compute_model, memory_gb
from wansim.errors import WansimInputError
from wansim.stages import memory
from wansim.stages.compute import stage_ms


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    hardware: object  # HardwareSpec
    region: str | None
    coords: tuple[float, float]
    uplink_mbps: float
    layers: tuple[int, int] | None  # explicit [first, last]
    cuda_graphs: bool = True
    cpu_loaded: bool = False


@dataclasses.dataclass(frozen=True)
class Stage:
    node: Node
    slice: StageSlice
    pass_ms: float
    memory: dict


def _stage(model, node, first, last, P, j, prec, load) -> tuple[float, dict, StageSlice]:
    s = StageSlice(first, last, is_first=(j == 0), is_last=(j == P - 1))
    cm = compute_model(
        model,
        node.hardware,
        s,
        prec,
        load,
        cuda_graphs=node.cuda_graphs,
        cpu_loaded=node.cpu_loaded,
    )
    ms = float(stage_ms(cm, load.batch * load.tokens_per_seq))
    return ms, memory_gb(model, s, prec, load), s


def partition(
    model, nodes: list[Node], prec: Precision, load: Load, memo: dict | None = None
) -> list[Stage]:
    """Best contiguous assignment of the model's layers to ``nodes`` (in this order).
    ``memo``: a dict shared between calls for the same model and precision (stage results
    keyed by node name, slice, ends and load), so that trying ring rotations is cheap."""
    P, L = len(nodes), model.layers
    if P > L:
        raise WansimInputError("nodes", f"{P} nodes but {model.name} has only {L} layers", P)
    if all(n.layers is not None for n in nodes):
        return _explicit(model, nodes, prec, load)
    if any(n.layers is not None for n in nodes):
        raise WansimInputError("nodes", "give layers for every node or for none", None)
    cache: dict = {} if memo is None else memo

    def get(j, a, b):
        key = (nodes[j].name, a, b, j == 0, j == P - 1, load)
        if key not in cache:
            cache[key] = _stage(model, nodes[j], a, b, P, j, prec, load)
        return cache[key]

    inf = (math.inf, math.inf)
    # best[j][end]: (max stage ms, sum ms) placing layers [0, end) on nodes 0..j-1
    best = [[inf] * (L + 1) for _ in range(P + 1)]
    choice = [[-1] * (L + 1) for _ in range(P + 1)]
    best[0][0] = (0.0, 0.0)
    for j in range(1, P + 1):
        cap = nodes[j - 1].hardware.memory_gb
        for end in range(j, L - (P - j) + 1):
            for k in range(j - 1, end):
                prev = best[j - 1][k]
                if prev[0] == math.inf:
                    continue
                ms, mem, _ = get(j - 1, k, end - 1)
                if mem["total"] > cap:
                    continue
                cand = (max(prev[0], ms), prev[1] + ms)
                if cand < best[j][end]:
                    best[j][end], choice[j][end] = cand, k
    if best[P][L][0] == math.inf:
        _raise_shortfall(model, nodes, prec, load, get)
    stages, end = [], L
    for j in range(P, 0, -1):
        k = choice[j][end]
        ms, mem, s = get(j - 1, k, end - 1)
        stages.append(Stage(nodes[j - 1], s, ms, mem))
        end = k
    return stages[::-1]


def _explicit(model, nodes, prec, load) -> list[Stage]:
    P = len(nodes)
    expect = 0
    out = []
    for j, n in enumerate(nodes):
        first, last = n.layers
        if first != expect or last < first:
            raise WansimInputError(
                f"nodes[{j}].layers",
                f"must continue the previous node's slice at layer {expect}",
                [first, last],
            )
        expect = last + 1
        ms, mem, s = _stage(model, n, first, last, P, j, prec, load)
        if mem["total"] > n.hardware.memory_gb:
            _short(j, n, mem, s)
        out.append(Stage(n, s, ms, mem))
    if expect != model.layers:
        raise WansimInputError(
            f"nodes[{P - 1}].layers", f"must end at layer {model.layers - 1}", expect - 1
        )
    return out


def _short(j, node, mem, s, total_short_gb: float | None = None) -> None:
    need, cap = mem["total"], node.hardware.memory_gb
    tail = ""
    if total_short_gb is not None and total_short_gb > 0:
        tail = f"; all nodes together are short of {total_short_gb:.1f} GB"
    raise WansimInputError(
        f"nodes[{j}] ({node.name}, {node.hardware.name})",
        f"short of {need - cap:.1f} GB: layers {s.first}-{s.last} need {need:.1f} GB"
        f" (weights {mem['weights']:.1f}, KV {mem['kv']:.1f}, drafter {mem['drafter']:.1f})"
        f" but it has {cap:g} GB{tail}",
    )


def _raise_shortfall(model, nodes, prec, load, get) -> None:
    """The assignment with the smallest worst shortfall; name its worst node."""
    P, L = len(nodes), model.layers
    inf = math.inf
    best = [[inf] * (L + 1) for _ in range(P + 1)]
    choice = [[-1] * (L + 1) for _ in range(P + 1)]
    best[0][0] = -inf
    for j in range(1, P + 1):
        cap = nodes[j - 1].hardware.memory_gb
        for end in range(j, L - (P - j) + 1):
            for k in range(j - 1, end):
                if best[j - 1][k] == inf:
                    continue
                _, mem, _ = get(j - 1, k, end - 1)
                cand = max(best[j - 1][k], mem["total"] - cap)
                if cand < best[j][end]:
                    best[j][end], choice[j][end] = cand, k
    worst, end, total = None, L, 0.0
    for j in range(P, 0, -1):
        k = choice[j][end]
        _, mem, s = get(j - 1, k, end - 1)
        excess = mem["total"] - nodes[j - 1].hardware.memory_gb
        total += excess
        if worst is None or excess > worst[0]:
            worst = (excess, j - 1, mem, s)
        end = k
    _, j, mem, s = worst
    _short(j, nodes[j], mem, s, total)


def largest_batch(model, stages: list[Stage], prec: Precision, load: Load) -> int:
    """The most sequences every stage can hold with its layers (:func:`wansim.stages.memory.
    largest_batch` on each stage's memory at batch 0 and its growth per sequence)."""
    empty = dataclasses.replace(load, batch=0)
    one = dataclasses.replace(load, batch=1)
    fixed = [memory_gb(model, st.slice, prec, empty)["total"] for st in stages]
    per = [
        memory_gb(model, st.slice, prec, one)["total"] - f
        for st, f in zip(stages, fixed, strict=True)
    ]
    return memory.largest_batch([st.node.hardware.memory_gb for st in stages], fixed, per)

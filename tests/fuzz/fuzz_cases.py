"""Generated scenarios for the fuzz tests: valid-but-extreme and corrupted, all seeded.

``make_case(seed, index)`` is a pure function of its arguments (``random.Random`` seeded from
both), so a failing case is reproduced from its two numbers alone:

    python -m tests.fuzz.fuzz_harness SEED INDEX     (prints the case and its outcome)

A case is a small valid scenario (a few stages, requests and tokens, so that both engines run
it in well under a second) plus mutations drawn from one family:

- ``extreme``: values at and past the edges of what the schema allows (1e-308, 1e308, loss
  rates near 1, 1e12 ms latencies, the largest trees and pipelines, huge sizes);
- ``limits``: numbers exactly at each numeric field's own limits (read off the schema: its
  bounds, the global magnitude limits), one to three fields at a time;
- ``wrong_type``: a list, mapping, string, bool or null where something else is expected, at
  any field path of the schema (the paths are read off the dataclasses, so new fields are
  fuzzed without editing this file);
- ``nonfinite``: NaN and +-inf (as floats and as the YAML spellings);
- ``huge_int``: integers with more than 308 digits, 2**63, 2**64;
- ``unicode``: odd strings (control characters, right-to-left marks, emoji, newlines, 10k
  characters) as values and as keys;
- ``structure``: extra/unknown keys, a scalar or list for the whole document, empty lists,
  very long lists, mappings nested thousands deep;
- ``file``: bytes that are not the scenario mapping: non-UTF-8, billion-laughs alias bombs,
  YAML nested too deep for the parser, binary junk, a jitter samples file holding nan/inf;
- ``overrides``: ``--set`` strings of every kind (bad paths, bad YAML, out-of-range indices,
  NaN, 1e3, huge numbers, aliases).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import typing
from typing import Any

from wansim.config.scenario import Scenario
from wansim.config.validation import _hints

FAMILIES = (
    "extreme",
    "limits",
    "wrong_type",
    "nonfinite",
    "huge_int",
    "unicode",
    "structure",
    "file",
    "overrides",
)

# the families in turn, the valid-but-extreme ones more often (they reach the engines)
FAMILY_CYCLE = (*FAMILIES, "extreme", "limits", "limits")
HUGE_INT = int("9" * 400)  # > 308 digits: float(HUGE_INT) overflows


@dataclasses.dataclass
class Case:
    """One generated input. ``data`` goes to ``load_scenario(data=...)`` in process (and is
    dumped to ``scenario.yaml`` for the CLI); ``files`` (name -> bytes) are written beside it
    and, when ``scenario.yaml`` is among them, replace the dumped mapping."""

    seed: int
    index: int
    family: str
    label: str
    data: Any = None
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    overrides: list[str] = dataclasses.field(default_factory=list)

    @property
    def has_file(self) -> bool:
        return "scenario.yaml" in self.files


# ----------------------------------------------------------------------------- schema paths
def schema_paths(cls: type = Scenario, prefix: str = "") -> list[str]:
    """Every dotted field path of the schema (lists of mappings as ``[0]``; each variant of a
    tagged union contributes its own fields)."""
    out: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        out.append(path)
        tp = hints[f.name]
        variants = f.metadata.get("variants")
        item = _item_dataclass(tp)
        if variants:
            sub = f"{path}[0]" if typing.get_origin(tp) is tuple else path
            for vcls in variants.values():
                out.extend(p for p in schema_paths(vcls, sub) if p not in out)
        elif item is not None:
            sub = f"{path}[0]" if typing.get_origin(tp) is tuple else path
            out.extend(schema_paths(item, sub))
    return out


def _item_dataclass(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        found = _item_dataclass(arg)
        if found is not None:
            return found
    return None


PATHS = schema_paths()


def numeric_fields(cls: type = Scenario, prefix: str = "") -> dict[str, tuple[type, dict]]:
    """Numeric leaf paths -> (int or float, the field's validation metadata)."""
    out: dict[str, tuple[type, dict]] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        variants = f.metadata.get("variants")
        sub = f"{path}[0]" if typing.get_origin(tp) is tuple else path
        if variants:
            for vcls in variants.values():
                out.update(numeric_fields(vcls, sub))
            continue
        item = _item_dataclass(tp)
        if item is not None:
            out.update(numeric_fields(item, sub))
            continue
        words_beside_number = str in typing.get_args(tp)  # e.g. a fraction or ``profile``
        for num in (int, float):
            if (tp is num or num in typing.get_args(tp)) and (
                f.metadata.get("choices") is None or words_beside_number
            ):
                out[sub] = (num, dict(f.metadata))
    return out


NUMERIC = numeric_fields()


def limit_values(tp: type, meta: dict) -> list[Any]:
    """The values at a field's limits (and a step past them)."""
    from wansim.config.validation import MAX_MAGNITUDE, MIN_MAGNITUDE

    hi = next((meta[k] for k in ("le", "lt") if meta.get(k) is not None), MAX_MAGNITUDE)
    lo = next((meta[k] for k in ("ge", "gt") if meta.get(k) is not None), -MAX_MAGNITUDE)
    if tp is int:
        return [int(hi), int(hi) + 1, int(lo), int(lo) - 1, int(hi) // 2]
    return [
        float(hi),
        float(hi) * (1 - 1e-12),
        float(hi) * (1 + 1e-12),
        float(lo),
        float(lo) + MIN_MAGNITUDE,
        MIN_MAGNITUDE,
        MIN_MAGNITUDE / 2,
        MAX_MAGNITUDE,
    ]


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """Set ``dotted`` in ``raw``, creating (or replacing) whatever stands in the way."""
    parts: list[str | int] = []
    for seg in dotted.split("."):
        name, _, rest = seg.partition("[")
        parts.append(name)
        if rest:
            parts.append(int(rest.rstrip("]")))
    node: Any = raw
    for part, nxt in itertools.pairwise(parts):
        want_list = isinstance(nxt, int)
        if isinstance(part, int):
            while len(node) <= part:
                node.append({})
            if not isinstance(node[part], (list if want_list else dict)):
                node[part] = [] if want_list else {}
            node = node[part]
        else:
            if not isinstance(node.get(part), (list if want_list else dict)):
                node[part] = [] if want_list else {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append({})
    node[last] = value


# ----------------------------------------------------------------------------- a valid base
def base_scenario(rng: random.Random) -> dict:
    """A small valid scenario (most of the time), varied over the schema's choices."""
    stages = rng.choice([1, 1, 2, 3, 4, 6])
    policy = rng.choice(["none", "chain", "chain", "tree"])
    k = rng.randint(1, 6)
    raw: dict[str, Any] = {
        "name": f"fuzz-{rng.randrange(1000)}",
        "seed": rng.randrange(1000),
        "stages": stages,
        "model": {"hidden_size": rng.choice([64, 1024, 7168]), "compute": _compute(rng)},
        "network": {
            "latency_ms": rng.choice([0, 0.5, 5, 25, 80]),
            "bandwidth_mbps": rng.choice([10, 100, 1000, 10000]),
            "jitter": _jitter(rng),
            "loss_rate": rng.choice([0.0, 0.0, 0.0, 0.01, 0.1]),
            "retransmit_ms": rng.choice([0, 50, 200]),
        },
        "payload": {"activation_bits": rng.choice([3, 4, 8, 16, 32])},
        "drafter": {
            "kind": rng.choice(["mtp", "dspark", "eagle", "ngram"]),
            "placement": rng.choice(["first_stage", "last_stage"]),
            "parallel": rng.random() < 0.7,
            "draft_ms": rng.choice([0.0, 1.0, 4.0]),
            "acceptance": _acceptance(rng, k),
        },
        "speculation": {"policy": policy, "k": k, "verifier": rng.choice(["lossless", "greedy"])},
        "workload": {
            "requests": rng.randint(1, 6),
            "concurrency": rng.choice([1, 1, 2, 3]),
            "prompt_tokens": rng.choice([1, 16, 128]),
            "output_tokens": rng.randint(2, 40),
        },
    }
    if policy == "tree":
        raw["speculation"]["tree"] = rng.choice(
            [
                {"kind": "sequoia", "budget_nodes": rng.randint(1, 12), "max_depth": k},
                {"kind": "dynamic", "budget_nodes": rng.randint(1, 12), "max_depth": k},
                {"kind": "static", "branching": [rng.randint(1, 3) for _ in range(min(k, 3))]},
            ]
        )
    roll = rng.random()
    if roll < 0.15 and policy == "chain":
        raw["drafter"]["placement"] = "first_stage"
        raw["schedule"] = {"kind": "async", "max_inflight_blocks": rng.randint(1, 4)}
    elif roll < 0.25:
        raw["schedule"] = {"batching": "continuous"}
    elif roll < 0.3 and policy == "chain":
        raw["drafter"]["overlap"] = True
    if rng.random() < 0.2:
        raw["network"]["hops"] = [
            {"latency_ms": rng.choice([1, 10, 40]), "loss_rate": rng.choice([0.0, 0.02])}
            for _ in range(stages)
        ]
    if rng.random() < 0.15:
        raw["model"]["stage_compute"] = [_compute(rng) for _ in range(stages)]
    return raw


def _compute(rng: random.Random) -> dict:
    kind = rng.choice(["linear", "linear", "roofline", "moe", "table"])
    if kind == "linear":
        return {"kind": "linear", "base_ms": rng.choice([0, 1, 6]), "per_token_ms": 0.02}
    if kind == "table":
        return {"kind": "table", "points": [[1, 5.0], [8, 5.5], [64, 7.0]]}
    if kind == "moe":
        return {"kind": "moe", "experts": 64, "experts_per_token": 4}
    return {"kind": "roofline", "params_b": rng.choice([0.5, 4.9])}


def _jitter(rng: random.Random) -> dict:
    kind = rng.choice(["none", "none", "normal", "lognormal", "pareto", "empirical"])
    if kind == "none":
        return {"kind": "none"}
    if kind == "empirical":
        return {"kind": "empirical", "samples_ms": [0.0, 1.5, 3.0, 12.0]}
    return {"kind": kind, "std_ms": rng.choice([0.5, 3.0, 10.0])}


def _acceptance(rng: random.Random, k: int) -> dict:
    if rng.random() < 0.5:
        return {"alpha": rng.choice([0.3, 0.6, 0.8, 0.95])}
    return {"per_position": [round(rng.uniform(0.3, 0.95), 3) for _ in range(k)]}


# ----------------------------------------------------------------------------- values
EXTREME_NUMBERS = [
    0,
    0.0,
    -0.0,
    1e-308,
    5e-324,
    -1e-308,
    1e308,
    1.7976931348623157e308,
    -1e308,
    1e300,
    1e12,
    1e9,
    -1,
    -1e-12,
    1e-12,
    0.99999,
    1 - 1e-8,
    1 - 1e-16,
    1.0,
    2,
    10**6,
    10**9,
    2**31,
]
EXTREME_AT = {  # path -> values that are in range (or just past it) for that field
    "workload.requests": [10**9, 10**7, 10**6, 1e9],
    "workload.concurrency": [10**6, 4096, 10**9],
    "workload.output_tokens": [10**9, 10**6, 2],
    "workload.prompt_tokens": [10**12, 10**9, 1],
    "workload.rate_per_s": [1e-300, 1e300, 1e-9],
    "stages": [1024, 10**6, 1025, 1],
    "speculation.k": [64, 65, 1],
    "speculation.tree.budget_nodes": [4096, 4097, 1024],
    "speculation.tree.max_depth": [10**6, 64, 1],
    "network.loss_rate": [0.99999, 1 - 1e-8, 0.999, 0.9, 1 - 1e-16],
    "network.latency_ms": [1e12, 1e15, 1e300, 1e-300],
    "network.bandwidth_mbps": [1e-300, 1e-9, 1e300],
    "network.retransmit_ms": [1e12, 1e300],
    "network.jitter.std_ms": [1e12, 1e300, 1e-300],
    "model.hidden_size": [10**9, 10**12, 1],
    "model.compute.base_ms": [1e300, 1e12, 0],
    "model.compute.per_token_ms": [1e300, 0],
    "drafter.draft_ms": [1e300, 1e12],
    "drafter.acceptance.alpha": [1 - 1e-16, 1e-300, 0.99999999],
    "drafter.acceptance.domain_shift": [1e-300, 1e-9],
    "schedule.max_inflight_blocks": [10**6, 10**9, 64],
    "schedule.hedge_branches": [10**6, 64],
    "payload.header_bytes": [10**15, 10**9],
    "payload.return_bytes": [10**15],
    "payload.quant_group_size": [10**12, 1],
    "seed": [2**64, 2**128, 10**30],
}
ODD_STRINGS = [
    "",
    " ",
    "ünïcødé",
    "\u202eevil",
    "🚀" * 3,
    "line\nbreak",
    "tab\there",
    "null\x00byte",
    "x" * 10_000,
    "1e3",
    "nan",
    "inf",
    "-.inf",
    "0x10",
    "true",
    "~",
    "{}",
    "[1, 2]",
    "../../../../etc/passwd",
    "/dev/zero",
    "/dev/stdin",
    "/proc/self/mem",
]


def _wrong_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            [],
            [1, 2],
            ["linear"],
            [[1, 2], [3]],
            {},
            {"kind": "linear"},
            {"a": 1},
            {"kind": ["linear"]},
            {"kind": {"x": 1}},
            "abc",
            "",
            "12",
            True,
            False,
            None,
            3,
            -3,
            2.5,
            [None],
            [{"kind": []}],
            [[[]]],
        ]
    )


def _nonfinite(rng: random.Random) -> Any:
    return rng.choice(
        [math.nan, math.inf, -math.inf, [math.nan], [1.0, math.inf], {"kind": math.nan}]
    )


def _huge_int(rng: random.Random) -> Any:
    return rng.choice([HUGE_INT, -HUGE_INT, 2**63, 2**64, -(2**63) - 1, 10**309, [HUGE_INT]])


# ----------------------------------------------------------------------------- families
def make_case(seed: int, index: int) -> Case:
    """Case ``index`` of the run seeded ``seed`` (a pure function of both)."""
    rng = random.Random(f"wansim-fuzz:{seed}:{index}")
    family = FAMILY_CYCLE[index % len(FAMILY_CYCLE)]
    raw = base_scenario(rng)
    case = Case(seed, index, family, family, data=raw)
    getattr(_Mutate, family)(rng, case)
    return case


def _mutate_paths(rng: random.Random, case: Case, value_of, count: int | None = None) -> None:
    count = count or rng.choice([1, 1, 1, 2, 3])
    labels = []
    for _ in range(count):
        path = rng.choice(PATHS)
        value = value_of(rng, path)
        set_path(case.data, path, value)
        labels.append(f"{path}={_short(value)}")
    case.label = f"{case.family}: " + ", ".join(labels)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def make_room(rng: random.Random, raw: dict, path: str) -> str:
    """Make ``path`` meaningful in ``raw`` (a list entry for every stage, the compute kind or
    jitter kind or policy that uses the field), and return it with a concrete list index."""
    from wansim.config.model import COMPUTE_VARIANTS

    stages = raw["stages"] if raw["stages"] in range(1, 1025) else 1
    index = rng.randrange(stages)
    field = path.rsplit(".", 1)[-1]
    kind = next((k for k, c in COMPUTE_VARIANTS.items() if field in _field_names(c)), "linear")
    if path.startswith("model.stage_compute[0]"):
        raw["model"]["stage_compute"] = [{"kind": kind} for _ in range(stages)]
    elif path.startswith("model.compute."):
        raw["model"]["compute"] = {"kind": kind}
    elif path.startswith("network.hops[0]"):
        raw["network"]["hops"] = [{} for _ in range(stages)]
    if ".jitter." in path:
        jitter_kind = {"shape": "pareto", "samples_ms": "empirical"}.get(field, "normal")
        jitter = {"kind": jitter_kind, "std_ms": 1.0}
        if jitter_kind == "empirical":
            jitter = {"kind": "empirical", "samples_ms": [0.0, 2.0]}
        if path.startswith("network.hops"):
            raw["network"]["hops"][index]["jitter"] = jitter
        else:
            raw["network"]["jitter"] = jitter
    if path.startswith("speculation.tree"):
        raw["speculation"]["policy"] = "tree"
        raw["speculation"]["tree"] = {"kind": "static" if field == "branching" else "sequoia"}
        raw["drafter"]["acceptance"] = {"alpha": 0.8}
    if path.startswith("schedule.") or field == "cancel_bytes":
        raw["speculation"]["policy"] = "chain"
        if field in ("max_inflight_blocks", "cancel_bytes"):
            raw["schedule"] = {"kind": "async"}
            raw["drafter"]["placement"] = "first_stage"
    return path.replace("[0]", f"[{index}]", 1)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


class _Mutate:
    @staticmethod
    def extreme(rng: random.Random, case: Case) -> None:
        def value_of(rng: random.Random, path: str) -> Any:
            return rng.choice(EXTREME_AT.get(path) or EXTREME_NUMBERS)

        if rng.random() < 0.6:  # aim at the fields with known edges
            path = rng.choice(list(EXTREME_AT))
            value = rng.choice(EXTREME_AT[path])
            path = make_room(rng, case.data, path)
            set_path(case.data, path, value)
            case.label = f"extreme: {path}={_short(value)}"
            if rng.random() < 0.3:  # with batching and concurrency (the 1e12 ms trigger)
                case.data["schedule"] = {"batching": "continuous"}
                case.data["drafter"].pop("overlap", None)
                case.data["workload"]["concurrency"] = rng.choice([2, 4])
        else:
            _mutate_paths(rng, case, value_of)

    @staticmethod
    def limits(rng: random.Random, case: Case) -> None:
        labels = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            path = rng.choice(sorted(NUMERIC))
            tp, meta = NUMERIC[path]
            value = rng.choice(limit_values(tp, meta))
            path = make_room(rng, case.data, path)
            set_path(case.data, path, value)
            labels.append(f"{path}={_short(value)}")
        case.label = "limits: " + ", ".join(labels)

    @staticmethod
    def wrong_type(rng: random.Random, case: Case) -> None:
        _mutate_paths(rng, case, lambda rng, path: _wrong_value(rng))

    @staticmethod
    def nonfinite(rng: random.Random, case: Case) -> None:
        _mutate_paths(rng, case, lambda rng, path: _nonfinite(rng))

    @staticmethod
    def huge_int(rng: random.Random, case: Case) -> None:
        _mutate_paths(rng, case, lambda rng, path: _huge_int(rng))

    @staticmethod
    def unicode(rng: random.Random, case: Case) -> None:
        if rng.random() < 0.3:  # an odd key somewhere
            key = rng.choice(ODD_STRINGS) or "k"
            section = rng.choice(["", "network", "drafter", "model.compute"])
            target = case.data
            for part in filter(None, section.split(".")):
                target = target.setdefault(part, {})
            target[key] = rng.choice(ODD_STRINGS)
            case.label = f"unicode: key {_short(key)} in {section or 'the top level'}"
            return
        _mutate_paths(rng, case, lambda rng, path: rng.choice(ODD_STRINGS))

    @staticmethod
    def structure(rng: random.Random, case: Case) -> None:
        roll = rng.randrange(7)
        if roll == 0:
            case.data = rng.choice([[], [1, 2], "scenario", 3, None, True, [{"stages": 2}]])
            case.label = f"structure: the document is {_short(case.data)}"
        elif roll == 1:  # mappings nested deeper than the interpreter's recursion limit
            depth = rng.choice([200, 5_000, 50_000])
            deep: Any = {}
            for _ in range(depth):
                deep = {"x": deep} if rng.random() < 0.5 else [deep]
            set_path(case.data, rng.choice(PATHS), deep)
            case.label = f"structure: nested {depth} deep"
        elif roll == 2:
            n = rng.choice([0, 1, 10_000, 200_000])
            path = rng.choice(
                [
                    "network.hops",
                    "model.stage_compute",
                    "drafter.acceptance.per_position",
                    "network.jitter.samples_ms",
                    "speculation.tree.branching",
                    "model.compute.points",
                ]
            )
            item = {
                "network.hops": {},
                "model.stage_compute": {"kind": "linear"},
                "drafter.acceptance.per_position": 0.7,
                "network.jitter.samples_ms": 1.0,
                "speculation.tree.branching": 2,
                "model.compute.points": [1, 1.0],
            }[path]
            set_path(case.data, path, [item] * n)
            case.label = f"structure: {path} with {n} items"
        elif roll == 3:
            case.data[rng.choice(["extends", "unknown", "Stages", "network.latency_ms"])] = 1
            case.label = "structure: an unknown or misplaced key"
        elif roll == 4:  # a self-referencing mapping (only YAML aliases make these)
            node: dict = {}
            node["x"] = node
            set_path(case.data, rng.choice(PATHS), node)
            case.label = "structure: a mapping that contains itself"
        elif roll == 5:
            case.data = {rng.choice([1, 2.5, None, True, (1, 2)]): 1, **case.data}
            case.label = "structure: a key that is not a string"
        else:
            _mutate_paths(
                rng, case, lambda rng, path: rng.choice([_wrong_value(rng), _nonfinite(rng)]), 4
            )

    @staticmethod
    def file(rng: random.Random, case: Case) -> None:
        roll = rng.randrange(8)
        if roll == 0:
            junk = bytes(rng.randrange(256) for _ in range(rng.choice([4, 64, 1024])))
            case.files["scenario.yaml"] = rng.choice(
                [b"stages: 4\nname: \xff\xfe\xfa\n", b"\xc3\x28: 1\n", junk, b"\x00\x00\x00"]
            )
            case.label = "file: bytes that are not UTF-8 text"
        elif roll == 1:
            case.files["scenario.yaml"] = alias_bomb(rng.choice([9, 12]))
            case.label = "file: billion-laughs alias bomb"
        elif roll == 2:
            depth = rng.choice([1_000, 100_000])
            opener = rng.choice(["[", "{a: "])
            closer = "]" if opener == "[" else "}"
            case.files["scenario.yaml"] = (
                f"name: deep\nmodel: {opener * depth}1{closer * depth}\n".encode()
            )
            case.label = f"file: YAML nested {depth} deep"
        elif roll == 3:
            text = rng.choice(
                [
                    "",
                    "# only a comment\n",
                    "- 1\n- 2\n",
                    "just a string\n",
                    "stages: [\n",
                    "a: &x 1\nb: *y\n",
                    "stages: !!python/object/apply:os.system ['true']\n",
                    "stages: 2\nstages: 3\n",
                    "? [1, 2]\n: 3\n",
                    "network: {latency_ms: .nan, bandwidth_mbps: .inf}\n",
                    "network: {bandwidth_mbps: 1e3}\nworkload: {requests: 1e9}\n",
                    f"stages: {HUGE_INT}\n",
                    "stages: 0x10\n",
                    "stages: 1_000\n",
                    "\ufeffstages: 2\n",
                ]
            )
            case.files["scenario.yaml"] = text.encode()
            case.label = f"file: {_short(text)}"
        elif roll in (4, 5):  # a jitter samples file holding nan/inf/junk
            content = rng.choice(
                [
                    "nan\n1\n2\n",
                    "inf\n",
                    "1\n-inf\n",
                    "1e400\n",
                    "1\n2\n3\n",
                    "",
                    "# nothing\n",
                    "\xff\xfe",
                    "1,2,3\n",
                    "-5\n-7\n",
                    "1e308\n1e308\n",
                ]
            )
            case.files["samples.txt"] = content.encode("latin-1")
            jitter = {"kind": "empirical", "samples_file": "samples.txt"}
            if rng.random() < 0.5:
                case.data["network"]["jitter"] = jitter
            else:
                stages = case.data["stages"]
                case.data["network"]["hops"] = [{} for _ in range(stages)]
                case.data["network"]["hops"][-1] = {"jitter": jitter}
            case.label = f"file: jitter samples file {_short(content)}"
        elif roll == 6:  # extends chains: missing, cyclic, non-string, a directory
            case.data["extends"] = rng.choice(["missing.yaml", "scenario.yaml", [1], ".", 3])
            case.label = f"file: extends {case.data['extends']!r}"
        else:  # a profile path that is not a profile
            case.files["profile.yaml"] = rng.choice(
                [b"workloads: 3\n", b"[1, 2]\n", alias_bomb(9), b"\xff\xff"]
            )
            case.data["drafter"]["acceptance"] = {"profile": "profile.yaml"}
            case.label = "file: a broken acceptance profile"

    @staticmethod
    def overrides(rng: random.Random, case: Case) -> None:
        count = rng.choice([1, 2, 3])
        for _ in range(count):
            path = rng.choice(
                [*PATHS, "network.hops[3].latency_ms", "a..b", "x[", "hops[99999999999999999999]"]
            )
            path = path.replace("[0]", f"[{rng.choice([0, 1, 5, 10**20])}]")
            value = rng.choice(
                [
                    "1e3",
                    "1E-5",
                    ".nan",
                    "-.inf",
                    "1e400",
                    "9" * 400,
                    "[1, 2]",
                    "{kind: [x]}",
                    "{a: 1}",
                    "",
                    "null",
                    "~",
                    "&a [*a]",
                    "*b",
                    "!!binary aGVsbG8=",
                    "!!python/name:os.system",
                    "'unterminated",
                    "ünï",
                    "true",
                    "0",
                    "-1",
                    "0.99999",
                    "1e12",
                    "=x",
                ]
            )
            case.overrides.append(f"{path}={value}")
        if rng.random() < 0.1:
            case.overrides.append(rng.choice(["no-equals-sign", "=1", " = ", "stages"]))
        case.label = "overrides: " + " ".join(_short(o) for o in case.overrides)


def alias_bomb(levels: int) -> bytes:
    """The billion-laughs document: ``levels`` lists of 9 aliases to the list before (9**levels
    leaves from ~40 bytes a level)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"name: *a{levels - 1}")
    return ("\n".join(lines) + "\n").encode()

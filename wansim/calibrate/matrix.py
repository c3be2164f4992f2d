"""A held-out matrix: the cells ``wansim calibrate predict`` predicts and runs (no torch here).

File (YAML)::

    defaults: {prompts: 4, tokens: 48, bandwidth_mbps: 1000, bits: 32, policy: chain,
               concurrency: 1, schedule: sync}
    quick_defaults: {prompts: 3, tokens: 32}      # what --quick uses instead
    cells:
      - {stages: 4, latency_ms: 20, k: 4}                  # a chain, fp32 activations
      - {stages: 6, latency_ms: 5, k: 2, bits: 8}          # + compressed
      - {stages: 4, latency_ms: 20, k: 4, policy: tree}    # pending until the real path has it
      - {stages: 2, latency_ms: 50, k: 4, concurrency: 4, quick: true}

A cell's ``mechanism`` is what it exercises beyond one synchronous chain request, joined by
``+``: ``chain`` or ``tree``, then ``mtp`` (``drafter: mtp``: the MTP head drafts at the last
stage), ``concurrent`` (concurrency > 1), ``batched`` (continuous
batching), ``async`` (in-pipe speculation), ``compressed`` (activations below 32 bits),
``lossy`` (loss_rate > 0). A cell whose mechanisms the real path does not run yet
(:data:`REAL_PATH_MECHANISMS`) is ``pending``: predicted, listed, not run. ``quick: true``
marks the cells of ``--quick``. The shipped matrix is ``heldout.yaml`` beside this module.
"""

from __future__ import annotations

import dataclasses
import math
from importlib import resources
from pathlib import Path

import yaml

from wansim.config.schedule import SCHEDULES
from wansim.errors import WansimInputError

MECHANISMS = ("chain", "tree", "mtp", "concurrent", "batched", "async", "compressed", "lossy")
# What the real runner executes today: chains and draft trees, the MTP head, several requests
# in flight (``DecodeSpec.concurrency``), continuous batching (``DecodeSpec.batching``: the
# requests in flight share every pass), async in-pipe speculation, any activation bits, the
# link emulator's loss. Extend when the real path gains a mechanism.
REAL_PATH_MECHANISMS = frozenset(
    {"chain", "tree", "mtp", "concurrent", "batched", "async", "compressed", "lossy"}
)
# Mechanisms the real path runs alone but not together (``wansim.real.config.DecodeSpec`` and
# the runner refuse them: concurrency runs the draft model's chains (sync or async) or trees,
# batching sync chains of the draft model; async runs chains of the draft model; trees need the
# draft model).
REAL_PATH_EXCLUSIVE = tuple(
    frozenset(pair)
    for pair in (
        ("concurrent", "mtp"),
        ("batched", "tree"),
        ("batched", "async"),
        ("batched", "mtp"),
        ("tree", "async"),
        ("mtp", "tree"),
        ("mtp", "async"),
    )
)
DRAFTERS = ("draft_model", "mtp")  # the draft model at stage 0 | the MTP head at the last
POLICIES = ("chain", "tree")
ASYNC_INFLIGHT_BLOCKS = 2  # an async cell's blocks in flight, real run and engines alike
BATCHING = ("none", "continuous")
BITS = (32, 16, 8, 4, 3)
CELL_KEYS = {
    "stages",
    "latency_ms",
    "k",
    "bits",
    "policy",
    "concurrency",
    "schedule",
    "batching",
    "micro_batches",
    "drafter",
    "bandwidth_mbps",
    "loss_rate",
    "prompts",
    "tokens",
    "quick",
    "name",
}
DEFAULTS = {
    "prompts": 4,
    "tokens": 48,
    "bandwidth_mbps": 1000.0,
    "bits": 32,
    "policy": "chain",
    "concurrency": 1,
    "schedule": "sync",
    "batching": "none",
    "micro_batches": 1,
    "drafter": "draft_model",
    "loss_rate": 0.0,
}


@dataclasses.dataclass(frozen=True)
class Cell:
    stages: int
    latency_ms: float
    k: int
    bits: int = 32
    policy: str = "chain"
    concurrency: int = 1
    schedule: str = "sync"
    batching: str = "none"
    micro_batches: int = 1
    drafter: str = "draft_model"
    bandwidth_mbps: float = 1000.0
    loss_rate: float = 0.0
    prompts: int = 4
    tokens: int = 48
    quick: bool = False
    name: str = ""

    @property
    def mechanisms(self) -> tuple[str, ...]:
        m = [self.policy]
        if self.drafter == "mtp":
            m.append("mtp")
        if self.concurrency > 1:
            m.append("concurrent")
        if self.batching != "none":
            m.append("batched")
        if self.schedule == "async":
            m.append("async")
        if self.bits < 32:
            m.append("compressed")
        if self.loss_rate > 0:
            m.append("lossy")
        return tuple(m)

    @property
    def mechanism(self) -> str:
        return "+".join(self.mechanisms)

    @property
    def tree_branching(self) -> tuple[int, ...]:
        """A tree cell's static draft tree, the same in the real run and the engines: two
        candidates at depth 1, then one child per node down to depth K (2K draft nodes)."""
        return (2,) + (1,) * (self.k - 1) if self.policy == "tree" and self.k > 0 else ()

    @property
    def max_inflight_blocks(self) -> int:
        """Blocks in flight per request (async: :data:`ASYNC_INFLIGHT_BLOCKS`)."""
        return ASYNC_INFLIGHT_BLOCKS if self.schedule == "async" else 1

    @property
    def pending_reason(self) -> str | None:
        """Why the real path cannot run the cell yet (None: it can)."""
        mech = set(self.mechanisms)
        missing = sorted(mech - REAL_PATH_MECHANISMS)
        if missing:
            return f"the real path has no {' / '.join(missing)} mode yet"
        for pair in REAL_PATH_EXCLUSIVE:
            if pair <= mech:
                return f"the real path does not combine {' and '.join(sorted(pair))} yet"
        return None

    @property
    def runnable(self) -> bool:
        """The real path runs every mechanism of the cell, together."""
        return self.pending_reason is None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        extra = "".join(
            f"-{m}" if m not in ("compressed",) else f"-b{self.bits}"
            for m in self.mechanisms
            if m != "chain"
        )
        if self.micro_batches > 1:
            extra += f"-mb{self.micro_batches}"
        if self.loss_rate > 0:
            extra += f"{self.loss_rate:g}"
        return f"P{self.stages}-L{self.latency_ms:g}-K{self.k}{extra}"


def shipped_matrix(name: str = "heldout.yaml") -> Path:
    """A matrix shipped with wansim (package data): ``heldout.yaml`` or ``mechanisms.yaml``."""
    return Path(str(resources.files("wansim.calibrate") / name))


def _field(where: str, what: str, value) -> WansimInputError:
    return WansimInputError(where, what, value)


def _int(raw: dict, key: str, where: str, lo: int, hi: int | None = None) -> int:
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise _field(f"{where}.{key}", f"must be an integer {rng}", v)
    return v


def _float(raw: dict, key: str, where: str, lo: float, strict: bool = False) -> float:
    v = raw[key]
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    if not ok or v < lo or (strict and v <= lo):
        raise _field(f"{where}.{key}", f"must be a finite number {'>' if strict else '>='} {lo}", v)
    return float(v)


def parse_cell(raw: dict, defaults: dict, where: str) -> Cell:
    if not isinstance(raw, dict):
        raise _field(where, "must be a mapping {stages, latency_ms, k, ...}", raw)
    unknown = sorted(set(raw) - CELL_KEYS)
    if unknown:
        raise _field(
            f"{where}.{unknown[0]}",
            f"is not a cell field ({', '.join(sorted(CELL_KEYS))})",
            raw[unknown[0]],
        )
    for key in ("stages", "latency_ms", "k"):
        if key not in raw:
            raise _field(f"{where}.{key}", "is required", None)
    merged = {**defaults, **raw}
    choices = {
        "policy": POLICIES,
        "schedule": SCHEDULES,
        "batching": BATCHING,
        "bits": BITS,
        "drafter": DRAFTERS,
    }
    for key, allowed in choices.items():
        if merged[key] not in allowed:
            raise _field(
                f"{where}.{key}", f"must be one of {' | '.join(map(str, allowed))}", merged[key]
            )
    loss = _float(merged, "loss_rate", where, 0.0)
    if loss >= 1:
        raise _field(f"{where}.loss_rate", "must be < 1", loss)
    micro = _int(merged, "micro_batches", where, 1, 64)
    if micro > 1 and merged["batching"] != "continuous":
        raise _field(f"{where}.micro_batches", "needs batching: continuous", micro)
    if micro > _int(merged, "concurrency", where, 1, 64):
        raise _field(f"{where}.micro_batches", "must be <= concurrency", micro)
    quick = merged.get("quick", False)
    if not isinstance(quick, bool):
        raise _field(f"{where}.quick", "must be true or false", quick)
    return Cell(
        stages=_int(merged, "stages", where, 2),
        latency_ms=_float(merged, "latency_ms", where, 0.0),
        k=_int(merged, "k", where, 0, 64),
        bits=int(merged["bits"]),
        policy=merged["policy"],
        concurrency=_int(merged, "concurrency", where, 1, 64),
        schedule=merged["schedule"],
        batching=merged["batching"],
        micro_batches=micro,
        drafter=merged["drafter"],
        bandwidth_mbps=_float(merged, "bandwidth_mbps", where, 0.0, strict=True),
        loss_rate=loss,
        prompts=_int(merged, "prompts", where, 1, 64),
        tokens=_int(merged, "tokens", where, 2, 1024),
        quick=quick,
        name=str(merged.get("name", "")),
    )


def load_matrix(path: str | Path | None, quick: bool = False, flag: str = "--matrix") -> list[Cell]:
    """The matrix's cells (``--quick``: the ``quick: true`` cells with ``quick_defaults``)."""
    p = Path(path) if path is not None else shipped_matrix()
    if not p.is_file() and path is not None and str(path) in ("heldout", "mechanisms"):
        p = shipped_matrix(f"{path}.yaml")  # a shipped matrix by name
    if not p.is_file():
        raise _field(flag, "file not found", str(p))
    try:
        raw = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        raise _field(flag, "is not valid YAML", str(p)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) or not raw["cells"]:
        raise _field(f"{p}: cells", "must be a non-empty list of cells", _kind(raw))
    defaults = dict(DEFAULTS)
    for key in ("defaults", "quick_defaults") if quick else ("defaults",):
        extra = raw.get(key, {}) or {}
        if not isinstance(extra, dict):
            raise _field(f"{p}: {key}", "must be a mapping", extra)
        defaults.update(extra)
    cells = [parse_cell(c, defaults, f"{p}: cells[{i}]") for i, c in enumerate(raw["cells"])]
    if quick:
        cells = [c for c in cells if c.quick]
        if not cells:
            raise _field(f"{p}: cells", "has no cell marked quick: true (needed by --quick)", None)
    names = [c.label for c in cells]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise _field(f"{p}: cells", "has two cells with the same configuration", dup)
    return cells


def _kind(raw):
    return type(raw).__name__ if not isinstance(raw, dict) else sorted(raw)

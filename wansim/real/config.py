"""Settings of a real run (frozen dataclasses, validated on construction; no torch here).

- :class:`PipelineSpec`: the deployment: target and drafter checkpoints, number of stages and
  their layer ranges, one emulated link per hop (hop i: stage i -> i+1; the last hop is the
  return hop from the last stage to stage 0), activation bits on the wire.
- :class:`DecodeSpec`: how to decode: K drafts per verify pass, the verifier, temperature,
  tokens per prompt, seed.
- :class:`TreeSpec`: the draft tree a verify pass carries instead of a chain (static branching,
  Sequoia's optimal shape for a positional acceptance vector, or a dynamic EAGLE-2 shape).
- :class:`Prompt`: one prompt (token ids) with its workload name and id for the trace.
"""

from __future__ import annotations

import ipaddress
import itertools
import numbers
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wansim.config.schedule import BATCHING, SCHEDULES
from wansim.config.speculation import REAL_VERIFIERS, TREE_KINDS
from wansim.real.codec import check_bits
from wansim.real.errors import RealConfigError
from wansim.real.link import LinkSpec

DRAFTER_KINDS = ("draft_model", "mtp")  # placement: first_stage | last_stage
MTP_FILES = ("mtp_config.json", "mtp.safetensors")


def check_checkpoint_dir(path: str | None, field_name: str) -> None:
    """A local directory holding ``config.json`` (checked before any process starts)."""
    if path is None:
        return
    p = Path(path)
    if not p.is_dir():
        raise RealConfigError(field_name, "must be an existing local checkpoint directory", path)
    if not (p / "config.json").is_file():
        raise RealConfigError(
            field_name, "has no config.json (not a transformers checkpoint)", path
        )


def check_mtp_dir(path: str | None, field_name: str = "mtp_dir") -> Path:
    """A local MTP head directory (``mtp_config.json`` + ``mtp.safetensors``)."""
    if path is None:
        raise RealConfigError(field_name, "is needed when drafter_kind is 'mtp'", None)
    p = Path(path)
    if not p.is_dir():
        raise RealConfigError(field_name, "must be an existing local MTP head directory", path)
    for name in MTP_FILES:
        if not (p / name).is_file():
            raise RealConfigError(field_name, f"has no {name} (not an MTP head checkpoint)", path)
    return p


@dataclass(frozen=True)
class PipelineSpec:
    """A staged target (+ drafter at stage 0) connected by emulated links.

    ``links``: empty = every hop is a plain loopback relay with no added delay; one entry = the
    same link on every hop; ``stages`` entries = per hop (the last is the return hop).
    ``layer_splits``: explicit ``[(lo, hi), ...]`` per stage, else an even split.
    ``activation_bits``: 32 (fp32, exact), 16 (fp16) or 8/4/3 (quantized, ``group_size`` values
    per fp16 scale). ``drafter_noise``: sigma of the weight noise added to the drafter at load
    (0 = as trained). ``fail_stage_after_passes``: fault injection (stage, passes) for tests.
    ``drafter_kind``: ``draft_model`` (the LM in ``drafter_dir`` drafts at stage 0) or ``mtp``
    (the head in ``mtp_dir`` drafts at the last stage right after verifying, and the drafts ride
    the verdict back on the return hop: ``drafter.placement: last_stage``). ``device``: where
    every stage (and the drafter) computes: ``cpu``, or ``cuda``/``cuda:N`` (all stages share
    that GPU; checked for before any process starts); the wire and sampling stay on the CPU.
    ``kv_capacity_tokens``: the KV-cache positions one stage may hold over all the requests in
    flight (the memory limit, as the scenario's ``workload.kv_capacity_tokens``; the tiny
    target's 2 x 4 heads x 32 x 4 bytes = 1 KiB per position per layer, so the default 65536
    is 64 MiB per layer); a job whose requests in flight could need more (each: prompt +
    ``max_new_tokens`` + the pass's drafted tokens or tree nodes + 1) is refused before any
    process starts.
    """

    target_dir: str
    drafter_dir: str | None = None
    stages: int = 2
    layer_splits: tuple[tuple[int, int], ...] | None = None
    links: tuple[LinkSpec, ...] = ()
    activation_bits: int = 32
    group_size: int = 128
    drafter_noise: float = 0.0
    noise_seed: int = 0
    host: str = "127.0.0.1"
    stall_timeout_s: float = 60.0
    start_timeout_s: float = 180.0
    threads_per_stage: int = 1
    fail_stage_after_passes: tuple[int, int] | None = None
    drafter_kind: str = "draft_model"
    mtp_dir: str | None = None
    device: str = "cpu"
    kv_capacity_tokens: int = 65536

    def __post_init__(self):
        check_checkpoint_dir(self.target_dir, "target_dir")
        kv = self.kv_capacity_tokens
        if isinstance(kv, bool) or not isinstance(kv, numbers.Integral) or not kv >= 1:
            raise RealConfigError("kv_capacity_tokens", "must be an integer >= 1", kv)
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise RealConfigError("device", "must be cpu, cuda or cuda:N", self.device)
        check_checkpoint_dir(self.drafter_dir, "drafter_dir")
        if self.drafter_kind not in DRAFTER_KINDS:
            raise RealConfigError(
                "drafter_kind", f"must be one of {list(DRAFTER_KINDS)}", self.drafter_kind
            )
        if self.drafter_kind == "mtp":
            check_mtp_dir(self.mtp_dir)
            if self.drafter_dir is not None:
                raise RealConfigError(
                    "drafter_dir",
                    "must be None when drafter_kind is 'mtp' (the head drafts at the last stage)",
                    self.drafter_dir,
                )
            if self.drafter_noise != 0:
                raise RealConfigError(
                    "drafter_noise",
                    "applies to drafter_kind 'draft_model' only",
                    self.drafter_noise,
                )
        elif self.mtp_dir is not None:
            raise RealConfigError(
                "mtp_dir", "is only used when drafter_kind is 'mtp'", self.mtp_dir
            )
        if not isinstance(self.stages, numbers.Integral) or self.stages < 2:
            raise RealConfigError("stages", "must be an integer >= 2", self.stages)
        object.__setattr__(self, "stages", int(self.stages))
        if self.layer_splits is not None:
            splits = tuple(tuple(int(v) for v in s) for s in self.layer_splits)
            object.__setattr__(self, "layer_splits", splits)
            ok = len(splits) == self.stages and splits[0][0] == 0
            ok = ok and all(lo < hi for lo, hi in splits)
            ok = ok and all(a[1] == b[0] for a, b in itertools.pairwise(splits))
            if not ok:
                raise RealConfigError(
                    "layer_splits",
                    f"must be {self.stages} contiguous non-empty [lo, hi) ranges from layer 0",
                    [list(s) for s in splits],
                )
        links = tuple(self.links)
        object.__setattr__(self, "links", links)
        if len(links) not in (0, 1, self.stages):
            raise RealConfigError(
                "links", f"must have 0, 1 or {self.stages} entries (one per hop)", len(links)
            )
        for i, link in enumerate(links):
            if not isinstance(link, LinkSpec):
                raise RealConfigError(f"links[{i}]", "must be a LinkSpec", type(link).__name__)
        check_bits(self.activation_bits)
        if not 1 <= self.group_size <= 65535:
            raise RealConfigError("group_size", "must be in 1..65535", self.group_size)
        if not self.drafter_noise >= 0:
            raise RealConfigError("drafter_noise", "must be >= 0", self.drafter_noise)
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise RealConfigError(
                "host", "must be an IP address (default 127.0.0.1)", self.host
            ) from None
        if not self.stall_timeout_s > 0:
            raise RealConfigError("stall_timeout_s", "must be > 0", self.stall_timeout_s)
        if not 1 <= self.threads_per_stage <= 64:
            raise RealConfigError("threads_per_stage", "must be in 1..64", self.threads_per_stage)

    @property
    def draft_placement(self) -> str:
        """``first_stage`` (draft model at stage 0) or ``last_stage`` (MTP head)."""
        return "last_stage" if self.drafter_kind == "mtp" else "first_stage"

    @property
    def can_draft(self) -> bool:
        return self.drafter_kind == "mtp" or self.drafter_dir is not None

    def hop_links(self) -> tuple[LinkSpec, ...]:
        """One LinkSpec per hop (``stages`` entries, the last is the return hop), each drawing
        the DES's streams for its hop of this ring (``ring_stages``, ``hop``; seed as given)."""
        from dataclasses import replace

        links = self.links or (LinkSpec(),)
        if len(links) == 1:
            links = links * self.stages
        return tuple(replace(link, ring_stages=self.stages, hop=h) for h, link in enumerate(links))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["links"] = [asdict(link) for link in self.hop_links()]
        return d


MAX_TREE_NODES = 256  # draft nodes per pass (root excluded): the mask is nodes x context
MAX_TREE_DEPTH = 64


@dataclass(frozen=True)
class TreeSpec:
    """A draft tree per verify pass (shapes and budget semantics of ``wansim.acceptance.trees``;
    ``budget`` counts draft nodes, the root excluded).

    - ``static``: ``branching[d-1]`` children for every node at depth d-1 (e.g. ``(2, 2, 1)``);
    - ``sequoia``: Sequoia's optimal tree of at most ``budget`` nodes and depth ``depth`` for the
      positional acceptance vector ``acceptance`` (P_1, P_2, ...: rank-r rate), built once;
    - ``dynamic``: EAGLE-2 shaped per pass from the drafter's own probabilities: ``depth``
      levels, the ``width`` likeliest nodes of each level expanded with their ``width`` likeliest
      children, then the ``budget`` nodes of largest path probability kept (greedy verifier
      only: a shape chosen from the drafted tokens would bias rejection sampling).
    """

    kind: str = "static"
    branching: tuple[int, ...] = ()
    budget: int = 0
    depth: int = 0
    acceptance: tuple[float, ...] = ()
    width: int = 2

    def __post_init__(self):
        if self.kind not in TREE_KINDS:
            raise RealConfigError("tree.kind", f"must be one of {list(TREE_KINDS)}", self.kind)
        object.__setattr__(self, "branching", tuple(self.branching))
        object.__setattr__(self, "acceptance", tuple(float(a) for a in self.acceptance))
        if self.kind == "static":
            b = self.branching
            if not b or not all(isinstance(x, numbers.Integral) and x >= 1 for x in b):
                raise RealConfigError(
                    "tree.branching", "must be a non-empty list of integers >= 1", list(b)
                )
            if len(b) > MAX_TREE_DEPTH:
                raise RealConfigError("tree.branching", f"must have <= {MAX_TREE_DEPTH} levels", b)
            from wansim.acceptance.trees import static_nodes

            n = static_nodes(b)
            if n > MAX_TREE_NODES:
                raise RealConfigError(
                    "tree.branching",
                    f"makes {n} draft nodes; at most {MAX_TREE_NODES} fit one pass",
                    list(b),
                )
            object.__setattr__(self, "budget", n)
            object.__setattr__(self, "depth", len(b))
            return
        if not isinstance(self.budget, numbers.Integral) or not 1 <= self.budget <= MAX_TREE_NODES:
            raise RealConfigError(
                "tree.budget", f"must be an integer in 1..{MAX_TREE_NODES}", self.budget
            )
        if not isinstance(self.depth, numbers.Integral) or not 1 <= self.depth <= MAX_TREE_DEPTH:
            raise RealConfigError(
                "tree.depth", f"must be an integer in 1..{MAX_TREE_DEPTH}", self.depth
            )
        if self.kind == "sequoia":
            a = self.acceptance
            if not a or not all(0 <= x <= 1 for x in a):
                raise RealConfigError(
                    "tree.acceptance", "must be a non-empty list of rates in [0, 1]", list(a)
                )
        if self.kind == "dynamic" and not (
            isinstance(self.width, numbers.Integral) and 1 <= self.width <= 16
        ):
            raise RealConfigError("tree.width", "must be an integer in 1..16", self.width)

    def shape(self):
        """The fixed :class:`wansim.acceptance.trees.Tree` (static, sequoia); None for dynamic."""
        from wansim.acceptance import trees

        if self.kind == "static":
            return trees.static_tree(self.branching)
        if self.kind == "sequoia":
            rates = trees.positional_rates(self.acceptance, self.depth)
            return trees.optimal_tree(rates, self.budget)[0]
        return None

    @property
    def max_depth(self) -> int:
        """The most drafts one pass can accept."""
        return self.depth

    @property
    def max_children(self) -> int:
        """The most children a node can have (each a distinct token)."""
        if self.kind == "static":
            return max(self.branching)
        if self.kind == "sequoia":
            return len(self.acceptance)
        return self.width

    @classmethod
    def parse(cls, text: str, field_name: str = "--tree") -> TreeSpec:
        """``static:2,2,1`` | ``sequoia:BUDGET:DEPTH:P1,P2,..`` | ``dynamic:BUDGET:DEPTH[:WIDTH]``."""
        kind, _, rest = text.partition(":")
        parts = rest.split(":") if rest else []
        args = None
        try:
            if kind == "static" and len(parts) == 1:
                args = {"branching": tuple(int(x) for x in parts[0].split(",") if x)}
            elif kind == "sequoia" and len(parts) == 3:
                acc = tuple(float(x) for x in parts[2].split(",") if x)
                args = {"budget": int(parts[0]), "depth": int(parts[1]), "acceptance": acc}
            elif kind == "dynamic" and len(parts) in (2, 3):
                width = int(parts[2]) if len(parts) == 3 else 2
                args = {"budget": int(parts[0]), "depth": int(parts[1]), "width": width}
        except ValueError:
            args = None
        if args is not None:
            return cls(kind, **args)
        raise RealConfigError(
            field_name,
            "must be static:B1,B2,.. | sequoia:BUDGET:DEPTH:P1,P2,.. | dynamic:BUDGET:DEPTH[:WIDTH]",
            text,
        )

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DecodeSpec:
    """``k`` drafts per pass (0 = no speculation), ``verifier`` greedy|lossless, ``temperature``
    (0 for greedy, > 0 for lossless), ``max_new_tokens`` per prompt, ``seed``. ``tree``: draft a
    tree per pass instead of a chain; ``k`` is then set to the tree's depth. ``schedule``:
    ``sync`` (one block in flight) or ``async`` (in-pipe speculation: up to
    ``max_inflight_blocks`` blocks in flight, later ones betting on the earlier; see
    ``wansim.real.async_schedule``). ``concurrency``: requests in flight at once (each stage
    FIFO, one KV cache per request, chains or trees; ``wansim.real.concurrent_schedule``; with
    async each request keeps its own window of blocks). ``batching``:
    ``continuous`` = the requests in flight share passes: ``micro_batches`` micro-batches
    circulate at once, each one forward per stage over its members' blocks, at most
    ``max_batch_size`` members each (None: no cap; ``wansim.real.batched_schedule``)."""

    k: int = 4
    verifier: str = "greedy"
    temperature: float = 0.0
    max_new_tokens: int = 64
    seed: int = 0
    tree: TreeSpec | None = None
    schedule: str = "sync"
    max_inflight_blocks: int = 1
    concurrency: int = 1
    batching: str = "none"
    micro_batches: int = 1
    max_batch_size: int | None = None

    def __post_init__(self):
        if self.verifier not in REAL_VERIFIERS:
            raise RealConfigError(
                "verifier", f"must be one of {list(REAL_VERIFIERS)}", self.verifier
            )
        if self.schedule not in SCHEDULES:
            raise RealConfigError("schedule", f"must be one of {list(SCHEDULES)}", self.schedule)
        b = self.max_inflight_blocks
        if not isinstance(b, numbers.Integral) or not 1 <= b <= 64:
            raise RealConfigError("max_inflight_blocks", "must be an integer in 1..64", b)
        if self.schedule == "sync" and b != 1:
            raise RealConfigError(
                "max_inflight_blocks", "is 1 for the sync schedule (use schedule async)", b
            )
        c = self.concurrency
        if not isinstance(c, numbers.Integral) or not 1 <= c <= 256:
            raise RealConfigError("concurrency", "must be an integer in 1..256", c)
        if self.batching not in BATCHING:
            raise RealConfigError("batching", f"must be one of {list(BATCHING)}", self.batching)
        m = self.micro_batches
        if not isinstance(m, numbers.Integral) or not 1 <= m <= 64:
            raise RealConfigError("micro_batches", "must be an integer in 1..64", m)
        mb = self.max_batch_size
        if mb is not None and (not isinstance(mb, numbers.Integral) or not 1 <= mb <= 256):
            raise RealConfigError("max_batch_size", "must be null or an integer in 1..256", mb)
        if self.batching == "none" and (m != 1 or mb is not None):
            raise RealConfigError(
                "micro_batches" if m != 1 else "max_batch_size",
                "needs batching: continuous",
                m if m != 1 else mb,
            )
        if self.batching == "continuous" and (self.schedule != "sync" or self.tree is not None):
            raise RealConfigError(
                "batching",
                "continuous batches chains with the sync schedule (no tree, no async)",
                self.batching,
            )
        if self.batching == "continuous" and m > c:
            raise RealConfigError(
                "micro_batches", f"must be <= concurrency ({c}): one request each at least", m
            )
        if self.schedule == "async" and (self.tree is not None or self.k < 1):
            raise RealConfigError(
                "schedule",
                "async needs a chain of k >= 1 drafts (no tree)",
                f"k={self.k} tree={self.tree.kind if self.tree else None}",
            )
        if self.tree is not None:
            if not isinstance(self.tree, TreeSpec):
                raise RealConfigError("tree", "must be a TreeSpec", type(self.tree).__name__)
            if self.tree.kind == "dynamic" and self.verifier != "greedy":
                raise RealConfigError(
                    "tree.kind",
                    "dynamic trees need the greedy verifier (a shape chosen from the drafted "
                    "tokens would bias rejection sampling); use static or sequoia",
                    self.tree.kind,
                )
            object.__setattr__(self, "k", self.tree.max_depth)  # k: the most drafts accepted
        if not isinstance(self.k, numbers.Integral) or not 0 <= self.k <= 64:
            raise RealConfigError("k", "must be an integer in 0..64", self.k)
        object.__setattr__(self, "k", int(self.k))
        if not self.temperature >= 0:
            raise RealConfigError("temperature", "must be >= 0", self.temperature)
        if self.verifier == "lossless" and self.temperature <= 0:
            raise RealConfigError(
                "temperature", "must be > 0 for the lossless verifier", self.temperature
            )
        if self.verifier == "greedy" and self.temperature != 0:
            raise RealConfigError(
                "temperature", "must be 0 for the greedy verifier", self.temperature
            )
        if not isinstance(self.max_new_tokens, numbers.Integral) or self.max_new_tokens < 1:
            raise RealConfigError("max_new_tokens", "must be an integer >= 1", self.max_new_tokens)
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))


@dataclass(frozen=True)
class Prompt:
    """Token ids of one prompt, tagged for the trace."""

    workload: str
    prompt_id: int
    tokens: tuple[int, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if not self.tokens:
            raise RealConfigError(f"prompts[{self.prompt_id}].tokens", "must be non-empty", [])


def split_layers(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """Even split of ``n_layers`` into ``stages`` contiguous ``[lo, hi)`` ranges (earlier stages
    take the remainder)."""
    if not 1 <= stages <= n_layers:
        raise RealConfigError("stages", f"must be <= the target's {n_layers} layers", stages)
    base, extra = divmod(n_layers, stages)
    out, lo = [], 0
    for i in range(stages):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out

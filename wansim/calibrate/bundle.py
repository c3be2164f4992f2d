"""The profile bundle: what ``wansim calibrate profile`` measured once, as a versioned directory.

A bundle holds the properties of the hardware and software (not of a deployment) that the
engines need to predict a real run from its configuration alone (``docs/calibrate.md`` lists
every field with its unit):

- ``bundle.yaml``: format name and ``version``, the model's identity (checkpoint names and the
  SHA-256 of each ``config.json``, layers, hidden size, vocabulary), what was profiled (stages,
  layer splits, K values, bits, link latency, prompts, the machine's load average) and the
  fitted costs:

  * ``stage_cost``: a stage's service time per verify pass (frame in -> frame out) as
    ``fixed_ms[role] + per_layer_ms * layers + per_token_ms[role] * n + per_layer_token_ms *
    layers * n + codec_ms_per_op[bits] * codec_ops[role]`` with role first | middle | last
    (codec ops: first 1 encode, last 1 decode, middle 2; the middle role ``measured`` on a
    3-stage plan or ``derived`` from the others; version 2 had one ``per_token_ms``), and the
    prefill pass (``prefill``, at ``profiled.prompt_tokens``) as ``fixed_ms[role] +
    per_layer_ms * layers``;
  * ``drafter``: K autoregressive drafts at stage 0 cost ``intercept_ms + per_draft_ms * K``;
  * ``message``: the per-message software cost of a hop (the sender's send stamp -> the
    receiver has the frame, minus the link's scheduled delay: framing, the loopback legs, the
    relay's wake-up), mean per hop role; its distribution in ``emulator_error_ms.csv``;
  * ``acceptance``: the profile fitted from the traces of every profiled K pooled
    (``acceptance_profile.yaml``; per-position rates up to ``max_k``); ``tree``: the same for
    static trees of 2K nodes (``acceptance_profile_tree.yaml``: rank-1 rates per depth and the
    rank-2 sibling rate at depth 1); both name ``activation_quality.yaml``;
  * ``activation_quality``: per activation width below 32 bits its measured acceptance factor
    (T=1 and greedy) and exactness (``activation_quality.yaml``,
    ``wansim-activation-quality/1``), so compressed cells are predicted with their cost;
  * ``mtp`` (optional): the MTP head's K drafts at the last stage (``intercept_ms +
    per_draft_ms * K``, ``mtp_drafter.csv``), the fixed cost per pass of the first and last
    stage of its pipeline (``fixed_ms``), its config hash and its acceptance profile
    (``acceptance_profile_mtp.yaml``, in-process decoding of the head);
  * ``drafter.width_ms``: each tree candidate beyond one per depth (the engines'
    ``drafter.width_ms``); ``dimensions``: what the bundle covers and what it does not
    (concurrency, batches, the MTP head);
  * ``batch`` (optional): a batched pass's cost per sequence beyond the first,
    ``sequence_ms[role] + sequence_per_layer_ms * layers`` per stage and
    ``drafter_sequence_ms`` per drafter pass (the engines' ``model.stage_sequence_ms`` and
    ``drafter.sequence_ms``), fitted from ``batch_passes.csv``.

- ``stage_passes.csv``: the verify and prefill passes the costs were fitted from (one row per
  stage per pass: role, layers, n, bits, service, compute, codec and verify ms);
- ``drafter.csv``: K, draft nodes (K for a chain, 2K for a tree), draft ms per verify pass; ``emulator_error_ms.csv``: role, bytes,
  error ms per frame;
- ``acceptance_traces.csv`` (optional): the per-prompt in-process traces the acceptance
  profiles were fitted from (drafter chain / tree / mtp, prompt, K, step, accepted), from which
  a prediction bootstraps its cells' prompt-sample band (:mod:`wansim.calibrate.workload_sample`).

:func:`load_bundle` checks everything a prediction reads before anything runs; a missing or
corrupt file, another format or version, a field of the wrong type: one
:class:`~wansim.errors.WansimInputError` naming the file and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from wansim.calibrate.workload_sample import TRACE_COLUMNS
from wansim.errors import WansimInputError
from wansim.stages import profiled_cost as stage_cost
from wansim.stages.profiled_cost import BUNDLE_FORMAT as FORMAT
from wansim.stages.profiled_cost import BUNDLE_VERSION as VERSION
from wansim.stages.profiled_cost import READABLE_VERSIONS

ROLES = ("first", "middle", "last")
HOP_ROLES = ("forward", "return")
MANIFEST = "bundle.yaml"
FILES = {
    "stage_passes": "stage_passes.csv",
    "drafter": "drafter.csv",
    "emulator_error": "emulator_error_ms.csv",
    "acceptance": "acceptance_profile.yaml",
    "acceptance_tree": "acceptance_profile_tree.yaml",
    "activation_quality": "activation_quality.yaml",
}
# present when the MTP head was profiled (``mtp`` in bundle.yaml)
MTP_FILES = {"mtp_drafter": "mtp_drafter.csv", "acceptance_mtp": "acceptance_profile_mtp.yaml"}
# optional (bundles profiled before it have none): the in-process traces the acceptance
# profiles were fitted from, per prompt (wansim.calibrate.workload_sample reads them)
TRACE_FILE = "acceptance_traces.csv"
# optional: the per-pass rows the idle cost was fitted from (wansim.calibrate.idle_profile)
IDLE_FILE = "idle_passes.csv"
IDLE_MESSAGES_FILE = "idle_messages.csv"
# optional (bundles profiled before it have none): the batched jobs' passes ``batch`` was
# fitted from (wansim.calibrate.profile_fits.batched_pass_rows)
BATCH_FILE = "batch_passes.csv"


def config_sha256(checkpoint_dir: str | Path) -> str:
    """SHA-256 of a checkpoint's ``config.json`` bytes (the bundle's model identity)."""
    return hashlib.sha256((Path(checkpoint_dir) / "config.json").read_bytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class StageCost:
    """Service ms of one stage per pass (module docstring: the model)."""

    fixed_ms: dict
    per_layer_ms: float
    per_token_ms: dict  # role -> ms per token of a verify pass
    per_layer_token_ms: float
    codec_ms_per_op: dict  # bits -> ms per encode or decode beyond fp32's
    prefill_fixed_ms: dict
    prefill_per_layer_ms: float

    def as_mapping(self) -> dict:
        """The ``stage_cost`` mapping :mod:`wansim.stages.profiled_cost` evaluates."""
        return {
            "fixed_ms": self.fixed_ms,
            "per_layer_ms": self.per_layer_ms,
            "per_token_ms": self.per_token_ms,
            "per_layer_token_ms": self.per_layer_token_ms,
            "codec_ms_per_op": self.codec_ms_per_op,
            "prefill": {
                "fixed_ms": self.prefill_fixed_ms,
                "per_layer_ms": self.prefill_per_layer_ms,
            },
        }

    def verify_ms(self, role: str, layers: int, n: int, bits: int = 32) -> float:
        return stage_cost.verify_ms(self.as_mapping(), role, layers, n, bits)

    def prefill_ms(self, role: str, layers: int) -> float:
        return stage_cost.prefill_ms(self.as_mapping(), role, layers)


@dataclasses.dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict
    stage_cost: StageCost
    draft_intercept_ms: float
    draft_per_draft_ms: float
    per_message_ms: dict  # hop role -> mean ms
    emulator_error: pd.DataFrame  # role, bytes, error_ms
    stage_passes: pd.DataFrame  # the rows stage_cost was fitted from
    drafter_rows: pd.DataFrame  # k, nodes, draft_ms
    draft_width_ms: float = 0.0  # per tree candidate beyond one per depth
    mtp_intercept_ms: float | None = None  # the MTP head's K drafts at the last stage, if profiled
    mtp_per_draft_ms: float | None = None
    mtp_fixed_ms: dict | None = None  # the MTP pipeline's first/last fixed cost per pass
    # drafter (chain / tree / mtp), prompt_id, k, step, accepted; None in older bundles
    acceptance_traces: pd.DataFrame | None = None
    # (drafter kind, K) -> the profile fitted from that K's traces alone (older bundles: none)
    per_k_profiles: dict = dataclasses.field(default_factory=dict)
    # a pass after an idle: [idle ms, extra ms] points and the extra the fitted costs already
    # hold (wansim.calibrate.idle_profile); None in bundles profiled before it
    idle_points: tuple | None = None
    idle_reference_extra_ms: float = 0.0
    # per role (drafting: stage 0's drafting and pass; pass: a stage's pass) -> (points,
    # reference extra ms); empty in bundles with the pooled table only
    idle_roles: dict = dataclasses.field(default_factory=dict)
    # the same per role at the host's idle (``idle_cost.host``, or fitted from
    # idle_passes.csv for bundles written before it; empty without those rows)
    idle_host_roles: dict = dataclasses.field(default_factory=dict)
    # a message after its hop's sender idled: (points, reference extra ms), None without
    idle_message: tuple | None = None
    # a batched pass: per role the fixed cost of each sequence beyond the first, its part
    # per layer, and each drafter pass's per sequence (``batch``); None in bundles without
    sequence_fixed_ms: dict | None = None
    sequence_per_layer_ms: float = 0.0
    draft_sequence_ms: float = 0.0

    @property
    def model(self) -> dict:
        return self.manifest["model"]

    @property
    def max_k(self) -> int:
        return int(self.manifest["acceptance"]["max_k"])

    @property
    def prompt_tokens(self) -> int:
        return int(self.manifest["profiled"]["prompt_tokens"])

    @property
    def host_cores(self) -> int | None:
        """The cores the profiled stage processes shared (None: a bundle from before
        ``profiled.host_cores`` was recorded; its cells are predicted on an unlimited host)."""
        cores = self.manifest["profiled"].get("host_cores")
        return None if cores is None else int(cores)

    @property
    def acceptance_profile(self) -> Path:
        return self.path / FILES["acceptance"]

    @property
    def tree_acceptance_profile(self) -> Path:
        return self.path / FILES["acceptance_tree"]

    @property
    def has_mtp(self) -> bool:
        return self.mtp_intercept_ms is not None

    @property
    def mtp_acceptance_profile(self) -> Path:
        return self.path / MTP_FILES["acceptance_mtp"]

    def profile_at(self, kind: str, k: int) -> Path | None:
        """The acceptance profile fitted from the traces at K = ``k`` alone (``kind``: chain,
        tree or mtp), if the bundle profiled that K; None otherwise (the pooled profile then
        serves). Pooling every K into one per-position fit moves tau at a profiled K by a few
        percent (measured in-sample: +2.4% at K = 4, +2.6% at K = 7), so a K the bundle
        measured is predicted from its own traces."""
        return self.per_k_profiles.get((kind, int(k)))

    def mtp_draft_ms(self, k: int) -> float:
        """The MTP head's K drafts at the last stage, total ms (0 for K = 0)."""
        if k == 0 or not self.has_mtp:
            return 0.0
        return max(0.0, self.mtp_intercept_ms + self.mtp_per_draft_ms * k)

    @property
    def quality_bits(self) -> set[int]:
        """Activation widths whose acceptance cost the bundle measured (32: the reference)."""
        return {32, *(int(b) for b in self.manifest["activation_quality"]["bits"])}

    def draft_ms(self, k: int) -> float:
        """K drafts' total ms at stage 0 (0 for K = 0)."""
        return 0.0 if k == 0 else max(0.0, self.draft_intercept_ms + self.draft_per_draft_ms * k)

    @property
    def has_batch(self) -> bool:
        return self.sequence_fixed_ms is not None

    def sequence_ms(self, role: str, layers: int) -> float:
        """What each sequence beyond the first adds to a batched pass of a stage of ``role``
        and ``layers`` (0 without ``batch``)."""
        if not self.has_batch:
            return 0.0
        return self.sequence_fixed_ms[role] + self.sequence_per_layer_ms * layers

    def error_samples(self, role: str) -> np.ndarray:
        e = self.emulator_error
        return e.loc[e["role"] == role, "error_ms"].to_numpy(float)


# ----------------------------------------------------------------------------- writing
def write_bundle(
    out: Path,
    manifest: dict,
    tables: dict[str, pd.DataFrame],
    profile_text: str,
    tree_text: str,
    quality_text: str,
    mtp: tuple[pd.DataFrame, str] | None = None,
    traces: pd.DataFrame | None = None,
    per_k: dict[str, str] | None = None,
    idle_rows: pd.DataFrame | None = None,
    idle_messages: pd.DataFrame | None = None,
    batch_rows: pd.DataFrame | None = None,
):
    """``mtp``: the MTP head's drafting rows and its acceptance profile text, if profiled;
    ``traces``: the per-prompt acceptance traces (``TRACE_FILE``); ``per_k``: file name ->
    profile text of the per-K profiles (``manifest['acceptance']['per_k']`` names them)."""
    out.mkdir(parents=True, exist_ok=True)
    files = dict(FILES)
    if traces is not None:
        files["acceptance_traces"] = TRACE_FILE
        traces.loc[:, list(TRACE_COLUMNS)].to_csv(out / TRACE_FILE, index=False)
    if idle_rows is not None:
        files["idle_passes"] = IDLE_FILE
        idle_rows.to_csv(out / IDLE_FILE, index=False)
    if idle_messages is not None:
        files["idle_messages"] = IDLE_MESSAGES_FILE
        idle_messages.to_csv(out / IDLE_MESSAGES_FILE, index=False)
    if batch_rows is not None:
        files["batch_passes"] = BATCH_FILE
        batch_rows.to_csv(out / BATCH_FILE, index=False)
    if mtp is not None:
        files.update(MTP_FILES)
        mtp[0].to_csv(out / MTP_FILES["mtp_drafter"], index=False)
        (out / MTP_FILES["acceptance_mtp"]).write_text(mtp[1])
    for key, frame in tables.items():
        frame.to_csv(out / FILES[key], index=False)
    for name, text in (per_k or {}).items():
        (out / name).write_text(text)
    (out / FILES["acceptance"]).write_text(profile_text)
    (out / FILES["acceptance_tree"]).write_text(tree_text)
    (out / FILES["activation_quality"]).write_text(quality_text)
    manifest = {"format": FORMAT, "version": VERSION, **manifest, "files": files}
    head = (
        "# wansim profile bundle (docs/calibrate.md, 'The profile bundle'): measured once by\n"
        "# `wansim calibrate profile`; read by `wansim calibrate predict --profile DIR`.\n"
    )
    (out / MANIFEST).write_text(head + yaml.safe_dump(_plain(manifest), sort_keys=False))


def _plain(obj):
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


# ----------------------------------------------------------------------------- reading
def _bad(field: str, what: str, value) -> WansimInputError:
    return WansimInputError(field, what, value)


def _get(d: dict, dotted: str, where: str):
    cur = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise _bad(f"{where}: {dotted}", "is missing (not a complete profile bundle)", None)
        cur = cur[part]
    return cur


def _num(d: dict, dotted: str, where: str) -> float:
    v = _get(d, dotted, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"{where}: {dotted}", "must be a finite number", v)
    return float(v)


def _per_token(man: dict, sc: str, where: str) -> dict:
    """``stage_cost.per_token_ms`` per role: a mapping from version 3; in version 2 (2-stage
    profiles only) one number that every role took."""
    if man.get("version") == 2:
        one = _num(man, f"{sc}.per_token_ms", where)
        return {r: one for r in ROLES}
    return {r: _num(man, f"{sc}.per_token_ms.{r}", where) for r in ROLES}


def _csv(path: Path, columns: tuple[str, ...], flag: str) -> pd.DataFrame:
    if not path.is_file():
        raise _bad(flag, f"{path.name} is missing from the bundle", str(path.parent))
    try:
        frame = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError):
        raise _bad(flag, f"{path.name} is not a readable CSV file", str(path)) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing or frame.empty:
        raise _bad(
            flag, f"{path.name} needs rows with columns {', '.join(columns)}", str(path)
        ) from None
    return frame


def load_bundle(path: str | Path, flag: str = "--profile") -> Bundle:
    """Read and check a bundle (one-line :class:`WansimInputError` on any problem)."""
    p = Path(path)
    man_path = p / MANIFEST
    if not p.is_dir() or not man_path.is_file():
        raise _bad(flag, f"must be a profile bundle directory holding {MANIFEST}", str(path))
    try:
        man = yaml.safe_load(man_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        raise _bad(flag, f"{MANIFEST} is not valid YAML", str(man_path)) from None
    where = str(man_path)
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise _bad(f"{where}: format", f"must be {FORMAT!r}", _short(man, "format"))
    if man.get("version") not in READABLE_VERSIONS:
        raise _bad(
            f"{where}: version",
            f"must be {' or '.join(map(str, READABLE_VERSIONS))} (this wansim's bundles)",
            man.get("version"),
        )
    for key in ("model.target", "model.target_config_sha256", "model.drafter_config_sha256"):
        _get(man, key, where)
    for key in ("model.layers", "model.hidden_size", "model.vocab_size"):
        _num(man, key, where)
    sc = "stage_cost"
    fixed = {r: _num(man, f"{sc}.fixed_ms.{r}", where) for r in ROLES}
    prefill = {r: _num(man, f"{sc}.prefill.fixed_ms.{r}", where) for r in ROLES}
    codec = _get(man, f"{sc}.codec_ms_per_op", where)
    if not isinstance(codec, dict):
        raise _bad(f"{where}: {sc}.codec_ms_per_op", "must map bits to ms", codec)
    codec = {int(b): _num(codec, str(b), f"{where}: {sc}.codec_ms_per_op") for b in codec}
    cost = StageCost(
        fixed_ms=fixed,
        per_layer_ms=_num(man, f"{sc}.per_layer_ms", where),
        per_token_ms=_per_token(man, sc, where),
        per_layer_token_ms=_num(man, f"{sc}.per_layer_token_ms", where),
        codec_ms_per_op=codec,
        prefill_fixed_ms=prefill,
        prefill_per_layer_ms=_num(man, f"{sc}.prefill.per_layer_ms", where),
    )
    max_k = _num(man, "acceptance.max_k", where)
    _num(man, "profiled.prompt_tokens", where)
    _num(man, "profiled.stages", where)
    cores = man["profiled"].get("host_cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise _bad(f"{where}: profiled.host_cores", "must be an integer >= 1", cores)
    if max_k < 1:
        raise _bad(f"{where}: acceptance.max_k", "must be >= 1", max_k)
    per_msg = {r: _num(man, f"message.per_message_ms.{r}", where) for r in HOP_ROLES}
    errors = _csv(p / FILES["emulator_error"], ("role", "bytes", "error_ms"), flag)
    for role in HOP_ROLES:
        e = errors.loc[errors["role"] == role, "error_ms"]
        if e.empty or not np.isfinite(e.to_numpy(float)).all():
            raise _bad(
                flag, f"{FILES['emulator_error']} needs finite error_ms rows for role {role}", path
            )
    passes = _csv(
        p / FILES["stage_passes"],
        ("kind", "role", "layers", "n_tokens", "bits", "service_ms"),
        flag,
    )
    drafter_rows = _csv(p / FILES["drafter"], ("k", "draft_ms"), flag)
    from wansim.acceptance.activation_quality import load_table
    from wansim.acceptance.profile import load_profile
    from wansim.errors import ProfileError

    def checked(name: str, loader=load_profile, what: str = "acceptance profile") -> Path:
        """The bundle's file ``name``, read once by ``loader`` (one line when it cannot be)."""
        f = p / str(name)
        if not f.is_file():
            raise _bad(flag, f"{name} is missing from the bundle", str(path))
        try:
            loader(f)
        except (ProfileError, WansimInputError, ValueError, TypeError, yaml.YAMLError):
            raise _bad(flag, f"{name} is not a valid {what}", str(f)) from None
        return f

    checked(FILES["activation_quality"], load_table, "activation-quality table")
    checked(FILES["acceptance"])
    checked(FILES["acceptance_tree"])
    mtp = {}
    if "mtp" in man:
        _get(man, "mtp.mtp_config_sha256", where)
        mtp = {
            "mtp_intercept_ms": _num(man, "mtp.drafter.intercept_ms", where),
            "mtp_per_draft_ms": _num(man, "mtp.drafter.per_draft_ms", where),
            "mtp_fixed_ms": {r: _num(man, f"mtp.fixed_ms.{r}", where) for r in ("first", "last")},
        }
        _csv(p / MTP_FILES["mtp_drafter"], ("k", "draft_ms"), flag)
        checked(MTP_FILES["acceptance_mtp"])
    q = _get(man, "activation_quality.bits", where)
    if not isinstance(q, dict):
        raise _bad(f"{where}: activation_quality.bits", "must map bits to their cost", q)
    width = _num(man, "drafter.width_ms", where)
    traces = None
    if (p / TRACE_FILE).exists():
        traces = _csv(p / TRACE_FILE, TRACE_COLUMNS, flag)
        ok = traces["drafter"].isin(("chain", "tree", "mtp")).all() and all(
            pd.api.types.is_integer_dtype(traces[c]) and (traces[c] >= 0).all()
            for c in TRACE_COLUMNS[1:]
        )
        if not ok:
            raise _bad(
                flag,
                f"{TRACE_FILE} needs drafter in chain/tree/mtp and whole numbers >= 0 in "
                "prompt_id, k, step, accepted",
                str(p / TRACE_FILE),
            )
    per_k = {}
    table = man["acceptance"].get("per_k") or {}
    if not isinstance(table, dict):
        raise _bad(f"{where}: acceptance.per_k", "must map chain/tree/mtp to K -> file", table)
    for kind, files in table.items():
        if kind not in ("chain", "tree", "mtp") or not isinstance(files, dict):
            raise _bad(f"{where}: acceptance.per_k", "must map chain/tree/mtp to K -> file", kind)
        for k, name in files.items():
            per_k[(kind, int(k))] = checked(name)
    idle_points, idle_ref = _idle_cost(man, where)
    idle_roles, idle_host_roles, idle_message = {}, {}, None
    if idle_points is not None and "message" in man["idle_cost"]:
        idle_message = _idle_cost(
            {"idle_cost": man["idle_cost"]["message"]}, f"{where}: idle_cost.message"
        )
    if idle_points is not None:
        roles = man["idle_cost"].get("stages") or {}
        if not isinstance(roles, dict) or not set(roles) <= {"drafting", "pass"}:
            raise _bad(f"{where}: idle_cost.stages", "must map drafting / pass to tables", roles)
        idle_roles = {
            role: _idle_cost({"idle_cost": t}, f"{where}: idle_cost.stages.{role}")
            for role, t in roles.items()
        }
        idle_host_roles = _idle_host_roles(man, p, where, flag)
    batch = {}
    if "batch" in man:
        batch = {
            "sequence_fixed_ms": {r: _num(man, f"batch.sequence_ms.{r}", where) for r in ROLES},
            "sequence_per_layer_ms": _num(man, "batch.sequence_per_layer_ms", where),
            "draft_sequence_ms": _num(man, "batch.drafter_sequence_ms", where),
        }
    return Bundle(
        path=p,
        **batch,
        idle_points=idle_points,
        idle_reference_extra_ms=idle_ref,
        idle_roles=idle_roles,
        idle_host_roles=idle_host_roles,
        idle_message=idle_message,
        manifest=man,
        stage_cost=cost,
        draft_intercept_ms=_num(man, "drafter.intercept_ms", where),
        draft_per_draft_ms=_num(man, "drafter.per_draft_ms", where),
        per_message_ms=per_msg,
        emulator_error=errors,
        stage_passes=passes,
        drafter_rows=drafter_rows,
        draft_width_ms=width,
        acceptance_traces=traces,
        per_k_profiles=per_k,
        **mtp,
    )


def _idle_host_roles(man: dict, p: Path, where: str, flag: str) -> dict:
    """``idle_cost.host`` per role as :func:`_idle_cost` reads a table; a bundle written
    before it: fitted from its ``idle_passes.csv`` (the same fit), or {} without the file."""
    host = man["idle_cost"].get("host")
    if host is None and (p / IDLE_FILE).is_file():
        from wansim.calibrate.idle_profile import fit_idle_cost

        rows = _csv(p / IDLE_FILE, ("latency_ms", "stage", "idle_ms", "work_ms"), flag)
        latency = man["profiled"].get("latency_ms", 5.0)
        try:
            host = fit_idle_cost(rows, float(latency))["host"]
        except (ValueError, KeyError, TypeError):
            raise _bad(flag, f"{IDLE_FILE} holds no idle sweep to fit", str(p)) from None
    host = host or {}
    if not isinstance(host, dict) or not set(host) <= {"drafting", "pass"}:
        raise _bad(f"{where}: idle_cost.host", "must map drafting / pass to tables", host)
    return {
        role: _idle_cost({"idle_cost": t}, f"{where}: idle_cost.host.{role}")
        for role, t in host.items()
    }


def _idle_cost(man: dict, where: str) -> tuple[tuple | None, float]:
    """``idle_cost.points`` as (idle ms, extra ms) pairs (idle >= 0 strictly increasing, extra
    >= 0) and ``idle_cost.reference_extra_ms``; (None, 0) when the bundle has none."""
    if "idle_cost" not in man:
        return None, 0.0
    pts = _get(man, "idle_cost.points", where)
    ok = (
        isinstance(pts, list)
        and pts
        and all(
            isinstance(q, list)
            and len(q) == 2
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in q
            )
            and q[0] >= 0
            and q[1] >= 0
            for q in pts
        )
    )
    if not ok or any(b[0] <= a[0] for a, b in itertools.pairwise(pts)):
        raise _bad(
            f"{where}: idle_cost.points",
            "must be [idle ms, extra ms] pairs, finite and >= 0, idle strictly increasing",
            pts,
        )
    ref = _num(man, "idle_cost.reference_extra_ms", where)
    if ref < 0:
        raise _bad(f"{where}: idle_cost.reference_extra_ms", "must be >= 0", ref)
    return tuple((float(a), float(b)) for a, b in pts), ref


def _short(man, key):
    return man.get(key) if isinstance(man, dict) else type(man).__name__


def check_model(
    bundle: Bundle,
    target_dir: str | Path,
    drafter_dir: str | Path,
    flag: str,
    mtp_dir: str | Path | None = None,
):
    """The bundle was measured on these checkpoints (their config.json hashes; the MTP head's
    ``mtp_config.json`` when the bundle profiled one and ``mtp_dir`` is given)."""
    m = bundle.model
    if config_sha256(target_dir) != m["target_config_sha256"]:
        raise _bad(
            flag,
            f"was profiled on another target model ({m['target']}, config sha256 "
            f"{m['target_config_sha256'][:12]}); profile this one with `wansim calibrate "
            "profile`",
            str(bundle.path),
        )
    if mtp_dir is not None and bundle.has_mtp:
        got = hashlib.sha256((Path(mtp_dir) / "mtp_config.json").read_bytes()).hexdigest()
        if got != bundle.manifest["mtp"]["mtp_config_sha256"]:
            raise _bad(
                flag,
                f"was profiled with another MTP head ({bundle.manifest['mtp'].get('name')}); "
                "profile this one",
                str(bundle.path),
            )
    if config_sha256(drafter_dir) != m["drafter_config_sha256"]:
        raise _bad(
            flag,
            f"was profiled with another drafter ({m.get('drafter')}); profile this pair",
            str(bundle.path),
        )

"""A pipeline stage's service time per pass from a profile bundle's fitted costs.

One formula for ``wansim calibrate predict`` (``wansim.calibrate.bundle``) and for scenarios
that say ``model.compute: {kind: table, from: PROFILE_DIR}``:

    verify pass of n tokens:  fixed_ms[role] + per_layer_ms * layers + per_token_ms[role] * n
                              + per_layer_token_ms * layers * n + codec_ms_per_op[bits] * ops
    prefill pass:             prefill.fixed_ms[role] + prefill.per_layer_ms * layers

role: first (stage 0), middle, last; ops: the encodes/decodes a stage does beyond fp32's (first
1, middle 2, last 1); layers: the even split of the model's layers that the real runner uses
(earlier stages take the remainder). ``per_token_ms`` is one number for every role in
version-2 bundles (profiled on 2-stage pipelines only), a mapping per role from version 3. Only
``yaml`` and the errors module are imported: the scenario loader calls this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import yaml

from wansim.config.user_yaml import read_text
from wansim.data import is_file
from wansim.errors import WansimInputError

CODEC_OPS = {"first": 1, "middle": 2, "last": 1}
BUNDLE_FORMAT = "wansim-profile-bundle"
BUNDLE_VERSION = 3
# the versions this wansim reads: 2 had one per-token cost for every role
READABLE_VERSIONS = (2, 3)


def stage_role(i: int, stages: int) -> str:
    return "first" if i == 0 else "last" if i == stages - 1 else "middle"


def even_split(layers: int, stages: int) -> list[int]:
    """Layers per stage as the real runner splits them (earlier stages take the remainder)."""
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def verify_ms(cost: Mapping, role: str, layers: int, n: int, bits: int = 32) -> float:
    """Service ms of a verify pass of ``n`` tokens (module docstring); ``cost`` is a bundle's
    ``stage_cost`` mapping (codec keys as ints or strings)."""
    codec = {int(b): float(v) for b, v in cost["codec_ms_per_op"].items()}
    return (
        float(cost["fixed_ms"][role])
        + float(cost["per_layer_ms"]) * layers
        + per_token_ms(cost, role) * n
        + float(cost["per_layer_token_ms"]) * layers * n
        + codec.get(int(bits), 0.0) * CODEC_OPS[role]
    )


def per_token_ms(cost: Mapping, role: str) -> float:
    """The role's cost per token of a verify pass (a number in version-2 bundles: every role's)."""
    per = cost["per_token_ms"]
    return float(per[role]) if isinstance(per, Mapping) else float(per)


def prefill_ms(cost: Mapping, role: str, layers: int) -> float:
    pre = cost["prefill"]
    return float(pre["fixed_ms"][role]) + float(pre["per_layer_ms"]) * layers


def tables_from_bundle(bundle_dir: Path, stages: int, bits: int, where: str) -> list[dict]:
    """One ``table`` compute model per stage: verify passes of n = 1 .. max_k + 1 tokens and
    the prefill at the bundle's prompt length (ms never below 0)."""
    path = Path(bundle_dir) / "bundle.yaml"
    if not is_file(path):
        raise WansimInputError(
            where, "must be a profile bundle directory holding bundle.yaml", str(bundle_dir)
        )
    try:
        man = yaml.safe_load(read_text(path, where))
        if man.get("format") != BUNDLE_FORMAT or man.get("version") not in READABLE_VERSIONS:
            raise WansimInputError(
                where,
                f"is not a {BUNDLE_FORMAT} of version " + " or ".join(map(str, READABLE_VERSIONS)),
                str(bundle_dir),
            )
        cost = man["stage_cost"]
        layers = int(man["model"]["layers"])
        max_k = int(man["acceptance"]["max_k"])
        prompt = int(man["profiled"]["prompt_tokens"])
        for role in ("first", "middle", "last"):
            verify_ms(cost, role, 1, 1, bits)
        prefill_ms(cost, "middle", 1)
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError):
        raise WansimInputError(where, "bundle.yaml is corrupt or incomplete", str(path)) from None
    if not 1 <= stages <= layers:
        raise WansimInputError(
            "stages", f"must be <= {layers}: the bundle's model has {layers} layers", stages
        )
    tables = []
    for i, lay in enumerate(even_split(layers, stages)):
        role = stage_role(i, stages)
        pts = {float(n): verify_ms(cost, role, lay, n, bits) for n in range(1, max_k + 2)}
        if prompt > max_k + 1:
            pts[float(prompt)] = prefill_ms(cost, role, lay)
        if not all(math.isfinite(v) for v in pts.values()):
            raise WansimInputError(where, "bundle.yaml holds a non-finite cost", str(path))
        tables.append(
            {"kind": "table", "points": [[n, max(0.0, ms)] for n, ms in sorted(pts.items())]}
        )
    return tables

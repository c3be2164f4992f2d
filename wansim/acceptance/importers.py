"""Import acceptance data from serving engines' speculative-decoding metrics into profiles.

- **vLLM, Prometheus text** (the server's ``/metrics`` page, saved to a file): the counters
  ``vllm:spec_decode_num_drafts_total`` and
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` (0-based position i:
  verify steps whose draft i was accepted, hence all before it too). With c_-1 = drafts:

      p_(i+1) = c_i / c_(i-1),      steps with A = a:  c_(a-1) - c_a   (c_K = 0)

  Series are summed over label sets (engines, replicas); ``model`` keeps one model_name only.
  Aggregate counters carry no per-prompt split: the profile's dispersion is 0 and says so.
  Diff two snapshots (before/after a benchmark) to cover exactly that workload.
- **SGLang, per-step accept lengths**: JSON lines ``{"prompt_id": ..., "accept_lengths": [...]}``
  where an accept length counts the bonus token (accepted drafts + 1), one entry per verify
  step, from a run with ``--speculative-num-steps K``. Converted to a trace and fitted like any
  trace (per-position rates, histogram and the per-prompt dispersion).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.acceptance.profile import Profile, ProfileHeader, WorkloadProfile
from wansim.acceptance.trace import fit_profile
from wansim.config.user_yaml import read_text
from wansim.data import is_file
from wansim.errors import ProfileError

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def vllm_counts(
    text: str, model: str | None = None, where: str = "vllm metrics"
) -> tuple[float, np.ndarray]:
    """(number of drafts, accepted counts per 0-based position) summed over label sets."""
    drafts = 0.0
    per_pos: dict[int, float] = defaultdict(float)
    seen = False
    for name, labels, value in parse_prometheus(text):
        if model is not None and labels.get("model_name") != model:
            continue
        if name == DRAFTS:
            drafts += value
            seen = True
        elif name == PER_POS:
            if "position" not in labels:
                raise ProfileError(where, f"{PER_POS} sample without a position label", labels)
            per_pos[int(labels["position"])] += value
    if not seen or not per_pos:
        raise ProfileError(where, f"needs {DRAFTS} and {PER_POS} samples", model or "all models")
    k = max(per_pos) + 1
    counts = np.array([per_pos.get(i, 0.0) for i in range(k)])
    return drafts, counts


def profile_from_vllm(
    text: str,
    *,
    workload: str = "default",
    model: str | None = None,
    where: str = "vllm metrics",
    **header,
) -> Profile:
    drafts, counts = vllm_counts(text, model, where)
    if drafts <= 0:
        raise ProfileError(where, "no drafts counted", drafts)
    chain = np.concatenate([[drafts], counts])
    if np.any(np.diff(chain) > 0):
        raise ProfileError(where, "accepted counts must not grow with position", chain.tolist())
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(chain[:-1] > 0, chain[1:] / chain[:-1], 0.0)
    hist = np.append(chain[:-1] - chain[1:], chain[-1])
    wl = WorkloadProfile(
        per_position=tuple(float(r) for r in rates),
        histogram=tuple(round(float(h)) for h in hist),
        dispersion=0.0,
        steps=round(float(drafts)),
        notes="imported from vLLM spec-decode counters; aggregate counters carry no per-prompt dispersion",
    )
    return Profile(
        header=_header(len(rates), header, "vLLM /metrics spec-decode counters"),
        workloads={workload: wl},
    )


def trace_from_sglang(path: str | os.PathLike, k: int, workload: str = "default") -> pd.DataFrame:
    """Per-step trace from SGLang accept lengths (JSON lines, see module docstring)."""
    rows = []
    p = Path(path)
    if not is_file(p):
        raise ProfileError("sglang accept lengths", "file not found", str(path))
    for lineno, line in enumerate(read_text(p, "sglang accept lengths").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ProfileError(where, "not valid JSON", line[:60]) from None
        lengths = item.get("accept_lengths") if isinstance(item, dict) else None
        if not isinstance(lengths, list):
            raise ProfileError(where, "needs an accept_lengths list", item)
        for step, length in enumerate(lengths):
            if not isinstance(length, int) or not 1 <= length <= k + 1:
                raise ProfileError(
                    f"{where}: accept_lengths[{step}]", f"must be an integer in 1..{k + 1}", length
                )
            rows.append((workload, item.get("prompt_id", lineno), step, k, length - 1))
    if not rows:
        raise ProfileError(str(path), "no verify steps", None)
    frame = pd.DataFrame(rows, columns=["workload", "prompt_id", "step", "k", "accepted"])
    frame["prompt_id"] = pd.factorize(frame["prompt_id"].astype(str))[0]
    return frame


def profile_from_sglang(
    path: str | os.PathLike, k: int, *, workload: str = "default", **header
) -> Profile:
    frame = trace_from_sglang(path, k, workload)
    fitted = fit_profile(frame, source="measured", **header)
    return Profile(
        header=_header(k, header, "SGLang per-step accept lengths"), workloads=fitted.workloads
    )


def _header(k: int, header: dict, what: str) -> ProfileHeader:
    return ProfileHeader(
        drafter=header.get("drafter", "unknown"),
        target=header.get("target", "unknown"),
        k=k,
        temperature=header.get("temperature", 1.0),
        verifier=header.get("verifier", "lossless"),
        source="measured",
        provenance=header.get("provenance", f"imported from {what}"),
    )

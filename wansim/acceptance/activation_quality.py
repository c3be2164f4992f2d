"""What compressed activations on the wire cost the target: a table per bit width.

Model (both engines, through :func:`wansim.speculation.policy` and
:func:`wansim.speculation.target_exact`): activations carried at b bits

- multiply every conditional acceptance rate by ``acceptance_factor`` f_b (the drafter is
  accepted less often by the perturbed target; f_b <= 1, composed with the domain shift g:
  p_i -> g f_b p_i); ``acceptance_factor_greedy`` for the greedy rule (lossless and typical
  use ``acceptance_factor``);
- make the output no longer the trained target's below ``EXACT_MIN_BITS`` = 16
  (``target_exact: false``): a lossy codec perturbs the target's logits, and the measured
  greedy tokens already differ at 8 bits (12% of them on the tiny models), while at 16 bits
  KL was 7e-9 nats and every token equal. Lossless verification is then exact for the
  *compressed* target only.

Widths of 16 bits and more are the reference: no cost, exact, visible without a table. Below
16 bits the cost is *visible* only where a table gives that width: the scenario's
``drafter.acceptance.activation_quality`` file, else the profile's ``activation_quality``
(a file relative to the profile, or the table inline). Without one the engines apply no
acceptance penalty (they cannot see it), say ``target_exact: false``, and the analytical
result is marked unvalidated; ``wansim optimize`` and ``wansim plan`` refuse to pick such a
width (:func:`cost_visible`).

File format (YAML, ``format: wansim-activation-quality/1``)::

    format: wansim-activation-quality/1
    source: measured            # measured | reconstructed | assumed
    target: ...                 # the model the table was measured on
    provenance: ...             # how, when, with what command
    bits:
      8: {acceptance_factor: 1.0, acceptance_factor_greedy: 1.0, target_exact: false,
          kl_mean: 1.9e-5, token_agreement: 0.88}
      ...

This module is a leaf: it parses tables and answers lookups.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from wansim.data import exists, is_file, on_disk_or_shipped
from wansim.errors import ProfileError, WansimInputError

FORMAT = "wansim-activation-quality/1"
SOURCES = ("measured", "reconstructed", "assumed")
EXACT_MIN_BITS = 16


@dataclasses.dataclass(frozen=True)
class BitQuality:
    """The cost of one activation width (``visible``: known, from a table or the threshold)."""

    bits: int
    acceptance_factor: float = 1.0
    acceptance_factor_greedy: float = 1.0
    target_exact: bool = True
    kl_mean: float | None = None
    token_agreement: float | None = None
    visible: bool = True
    source: str = "reference (>= 16 bits)"

    def factor(self, verifier: str) -> float:
        return self.acceptance_factor_greedy if verifier == "greedy" else self.acceptance_factor


@dataclasses.dataclass(frozen=True)
class QualityTable:
    entries: tuple[BitQuality, ...]
    source: str
    target: str
    provenance: str

    def at(self, bits: int) -> BitQuality | None:
        return next((e for e in self.entries if e.bits == bits), None)


_ENTRY_KEYS = (
    "acceptance_factor",
    "acceptance_factor_greedy",
    "target_exact",
    "kl_mean",
    "kl_p90",
    "token_agreement",
    "identical_prefix_mean",
    "acceptance_rate",
    "acceptance_lossless",
    "acceptance_ratio",
    "acceptance_lossless_ratio",
)


def table_from_mapping(raw, where: str) -> QualityTable:
    """Validate a parsed table (``where`` names it in errors)."""
    if not isinstance(raw, Mapping):
        raise ProfileError(where, "an activation-quality table must be a mapping", raw)
    fmt = raw.get("format", FORMAT)
    if fmt != FORMAT:
        raise ProfileError(f"{where}: format", f"must be {FORMAT}", fmt)
    source = raw.get("source", "measured")
    if source not in SOURCES:
        raise ProfileError(f"{where}: source", f"must be one of {SOURCES}", source)
    bits_raw = raw.get("bits")
    if not isinstance(bits_raw, Mapping) or not bits_raw:
        raise ProfileError(f"{where}: bits", "needs a mapping {bits: {...}}", bits_raw)
    entries = []
    for b, body in bits_raw.items():
        path = f"{where}: bits.{b}"
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ProfileError(path, "a bit width must be an integer >= 1", b)
        if not isinstance(body, Mapping):
            raise ProfileError(path, "must be a mapping", body)
        for key in body:
            if key not in _ENTRY_KEYS:
                raise ProfileError(f"{path}.{key}", f"unknown field (allowed: {_ENTRY_KEYS})")
        factors = {}
        for key in ("acceptance_factor", "acceptance_factor_greedy"):
            v = body.get(key, body.get("acceptance_factor", 1.0))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ProfileError(f"{path}.{key}", "must be a number in (0, 1]", v)
            factors[key] = float(v)
        exact = body.get("target_exact", b >= EXACT_MIN_BITS)
        if not isinstance(exact, bool):
            raise ProfileError(f"{path}.target_exact", "must be true or false", exact)
        if exact and b < EXACT_MIN_BITS:
            raise ProfileError(
                f"{path}.target_exact",
                f"widths below {EXACT_MIN_BITS} bits are lossy for the target (must be false)",
                exact,
            )
        entries.append(
            BitQuality(
                bits=b,
                target_exact=exact,
                kl_mean=body.get("kl_mean"),
                token_agreement=body.get("token_agreement"),
                source=f"{source}: {where}",
                **factors,
            )
        )
    return QualityTable(
        entries=tuple(sorted(entries, key=lambda e: -e.bits)),
        source=source,
        target=str(raw.get("target", "unknown")),
        provenance=str(raw.get("provenance", "")),
    )


def load_table(path: str | os.PathLike) -> QualityTable:
    """Read and validate a table file (a shipped ``traces/reference/...`` name works)."""
    p = on_disk_or_shipped(path)
    if not is_file(p):
        raise ProfileError("activation_quality", "file not found", str(path))
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime_ns: int) -> QualityTable:
    from wansim.config.user_yaml import read_yaml_file

    try:
        raw = read_yaml_file(path, "activation_quality")
    except WansimInputError as err:
        raise ProfileError(err.path, err.problem, err.value) from None
    return table_from_mapping(raw, path)


def table_ref(value, base_dir: Path, where: str) -> QualityTable:
    """A table given as a file name (relative to ``base_dir``) or inline."""
    if isinstance(value, str):
        p = Path(value)
        found = p if p.is_absolute() else base_dir / p
        return load_table(found if exists(found) else value)
    return table_from_mapping(value, where)


def quality_at(table: QualityTable | None, bits: int) -> BitQuality:
    """The cost of ``bits`` under ``table``: reference at >= 16 bits, the table's entry below,
    else unseen (no penalty applied, not exact, ``visible`` false)."""
    bits = int(bits)
    if bits >= EXACT_MIN_BITS:
        found = table.at(bits) if table is not None else None
        return found or BitQuality(bits)
    found = table.at(bits) if table is not None else None
    if found is not None:
        return found
    return BitQuality(bits, target_exact=False, visible=False, source="unmeasured")

"""Per-hop latency from geography.

Measured: ``data/azure_rtt_p95_2026-07.md`` (Microsoft Learn, "Azure network round-trip
latency statistics", P95 RTT over 30 days ending 2026-07-30, CC BY 4.0): a node in a listed
region (``region: frankfurt`` or ``germany-west-central``) gets one-way latency = RTT / 2
between regions (the mean of both directions where both are listed). P95 makes it a
conservative (busy-hour) figure.

Elsewhere (``lat``/``lon`` given, or a region without a measured pair): great-circle distance d
at the speed of light in fibre (2/3 c = 199.86 km/ms) times a route-inflation factor, plus a
fixed cost: RTT = a_ms + f * 2 d / v, with (a_ms, f) fitted by least squares on the shipped
table (:func:`fit_route_inflation`; its leave-one-region-out error is stated by
:func:`held_out_error`). Same-region nodes get ``SAME_REGION_RTT_MS``.

Users can also give their own measured RTTs: ``ping_file: pings.csv`` with rows
``node_a,node_b,rtt_ms`` (node names), overriding the above for the pairs it lists.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from wansim.config.user_yaml import read_text
from wansim.data import is_file
from wansim.errors import WansimInputError

FIBRE_KM_PER_MS = 299_792.458 / 1000 * 2 / 3
EARTH_RADIUS_KM = 6371.0
SAME_REGION_RTT_MS = 1.0  # assumed: two data centres in one metro area
TABLE = "azure_rtt_p95_2026-07.md"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")


@cache
def regions() -> dict[str, tuple[float, float]]:
    """Region slug -> (lat, lon)."""
    return {slug: (lat, lon) for slug, (lat, lon) in _region_rows()[0].items()}


@cache
def _region_rows() -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    text = resources.files("wansim.deploy").joinpath("data/regions.csv").read_text()
    coords: dict[str, tuple[float, float]] = {}
    alias: dict[str, str] = {}
    for row in csv.reader(line for line in text.splitlines() if not line.startswith("#")):
        slug, names, lat, lon = row
        coords[slug] = (float(lat), float(lon))
        alias[slug] = slug
        for n in names.split(";"):
            alias[_slug(n)] = slug
    return coords, alias


def region_slug(name: str) -> str | None:
    return _region_rows()[1].get(_slug(name))


@cache
def measured_rtt_ms() -> dict[tuple[str, str], float]:
    """(a, b) -> RTT ms from the shipped table, symmetrised (mean of both directions)."""
    text = resources.files("wansim.deploy").joinpath(f"data/{TABLE}").read_text()
    raw: dict[tuple[str, str], float] = {}
    columns: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Source":
            columns = [_slug(c) for c in cells[1:]]
            continue
        src = _slug(cells[0])
        for dst, value in zip(columns, cells[1:], strict=True):
            if value:
                raw[(src, dst)] = float(value)
    out: dict[tuple[str, str], float] = {}
    for (a, b), v in raw.items():
        back = raw.get((b, a), v)
        out[(a, b)] = out[(b, a)] = (v + back) / 2
    return out


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Haversine distance on a sphere of the Earth's mean radius."""
    la1, lo1, la2, lo2 = map(math.radians, (*a, *b))
    h = (
        math.sin((la2 - la1) / 2) ** 2
        + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


def fibre_rtt_ms(km: float) -> float:
    """Round trip at 2/3 c over the great circle, no detour."""
    return 2 * km / FIBRE_KM_PER_MS


def fit_route_inflation(pairs: list[tuple[str, str]] | None = None) -> tuple[float, float]:
    """(a_ms, f): least squares of RTT = a_ms + f * fibre_rtt_ms(d) on measured pairs."""
    coords = regions()
    table = measured_rtt_ms()
    if pairs is None:
        pairs = [(a, b) for (a, b) in table if a < b and a in coords and b in coords]
    x = np.array([fibre_rtt_ms(great_circle_km(coords[a], coords[b])) for a, b in pairs])
    y = np.array([table[(a, b)] for a, b in pairs])
    design = np.column_stack([np.ones_like(x), x])
    (a_ms, f), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a_ms), float(f)


def held_out_error() -> dict[str, float]:
    """Leave-one-region-out: fit without every pair touching region R, predict R's pairs.
    Returns the median and 90th-percentile absolute relative error over all held-out pairs."""
    coords = regions()
    table = measured_rtt_ms()
    pairs = [(a, b) for (a, b) in table if a < b and a in coords and b in coords]
    errors = []
    for r in coords:
        train = [p for p in pairs if r not in p]
        test = [p for p in pairs if r in p]
        if not test:
            continue
        a_ms, f = fit_route_inflation(train)
        for a, b in test:
            pred = a_ms + f * fibre_rtt_ms(great_circle_km(coords[a], coords[b]))
            errors.append(abs(pred / table[(a, b)] - 1))
    return {
        "median_abs_rel_error": float(np.median(errors)),
        "p90_abs_rel_error": float(np.percentile(errors, 90)),
        "pairs": len(errors),
    }


def estimated_rtt_ms(a: tuple[float, float], b: tuple[float, float]) -> float:
    a_ms, f = fit_route_inflation()
    return a_ms + f * fibre_rtt_ms(great_circle_km(a, b))


def read_ping_csv(path: str | Path, node_names: list[str]) -> dict[tuple[str, str], float]:
    """``node_a,node_b,rtt_ms`` rows (a header line is allowed) -> symmetric RTT map."""
    p = Path(path)
    if not is_file(p):
        raise WansimInputError("ping_file", "file not found", str(path))
    out: dict[tuple[str, str], float] = {}
    for i, row in enumerate(csv.reader(read_text(p, "ping_file").splitlines())):
        if not row or row[0].startswith("#") or (i == 0 and row[-1].strip() == "rtt_ms"):
            continue
        if len(row) != 3:
            raise WansimInputError(f"ping_file line {i + 1}", "expected node_a,node_b,rtt_ms", row)
        a, b, v = (c.strip() for c in row)
        for n in (a, b):
            if n not in node_names:
                raise WansimInputError(
                    f"ping_file line {i + 1}", f"unknown node (nodes: {', '.join(node_names)})", n
                )
        try:
            rtt = float(v)
        except ValueError:
            raise WansimInputError(
                f"ping_file line {i + 1}", "rtt_ms must be a number", v
            ) from None
        if not rtt >= 0:
            raise WansimInputError(f"ping_file line {i + 1}", "rtt_ms must be >= 0", rtt)
        out[(a, b)] = out[(b, a)] = rtt
    return out


def rtt_matrix_ms(
    nodes: list[Mapping], pings: Mapping[tuple[str, str], float] | None = None
) -> tuple[np.ndarray, list[str]]:
    """Symmetric RTT matrix between the nodes, and how each pair was obtained."""
    table = measured_rtt_ms()
    n = len(nodes)
    rtt = np.zeros((n, n))
    how: list[str] = []
    for i in range(n):
        for j in range(i + 1, n):
            a, b = nodes[i], nodes[j]
            key = (a["name"], b["name"])
            if pings and key in pings:
                v, src = pings[key], "ping_file"
            elif a.get("region") and a.get("region") == b.get("region"):
                v, src = SAME_REGION_RTT_MS, "same region (assumed)"
            elif (a.get("region"), b.get("region")) in table:
                v, src = table[(a["region"], b["region"])], "measured (Azure P95)"
            else:
                v, src = estimated_rtt_ms(a["coords"], b["coords"]), "great-circle fit"
            rtt[i, j] = rtt[j, i] = v
            how.append(f"{a['name']}-{b['name']}: {v:.1f} ms RTT ({src})")
    return rtt, how

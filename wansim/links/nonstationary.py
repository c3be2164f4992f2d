"""Links that change over time: every hop's latency and bandwidth multiplied by factors that
depend on simulated time t, from a drift (``network.drift``: a linear ramp) and/or a replayed
trace (``network.trace_file``); with both, the factors multiply.

Trace file: CSV, a header row ``t_ms,latency_factor,bandwidth_factor`` then one sample a row
(``#`` comments and blank lines skipped), t_ms >= 0 strictly increasing, factors > 0. Replay is
sample-and-hold: at time t the factors of the last sample at or before t (before the first
sample: the first; after the last: the last). A trace measured in absolute units becomes
factors by dividing by the value the scenario's hops are given.

Engines: the DES and the emulator apply :meth:`Modulation.at` to every message at its start
(:class:`wansim.links.delivery.HopSender`). The analytical engine, stationary by construction,
evaluates its closed forms per piece of the run with the factors held (:func:`pieces`;
:mod:`wansim.analytical.nonstationary`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from pathlib import Path

from wansim.data import is_file

HEADER = ("t_ms", "latency_factor", "bandwidth_factor")
MAX_TRACE_ROWS = 1_000_000


@functools.lru_cache(maxsize=16)
def read_trace(path: str, where: str = "network.trace_file") -> tuple[tuple[float, ...], ...]:
    """(t_ms, latency_factors, bandwidth_factors) of a trace file, validated (module
    docstring); bad content is a :class:`~wansim.errors.ScenarioError` naming the line."""
    from wansim.config.user_yaml import read_text
    from wansim.config.validation import MAX_MAGNITUDE
    from wansim.errors import ScenarioError

    p = Path(path)
    if not is_file(p):
        raise ScenarioError(where, "file not found", path)
    rows: list[tuple[float, float, float]] = []
    header = None
    for i, line in enumerate(read_text(p, where).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None:
            header = tuple(cells)
            if header != HEADER:
                raise ScenarioError(where, f"line {i}: the header must be {','.join(HEADER)}", line)
            continue
        if len(cells) != 3:
            raise ScenarioError(where, f"line {i} needs 3 comma-separated numbers", line[:60])
        try:
            t, lat, bw = (float(c) for c in cells)
        except ValueError:
            raise ScenarioError(where, f"line {i} is not 3 numbers", line[:60]) from None
        if not all(abs(v) <= MAX_MAGNITUDE for v in (t, lat, bw)):
            raise ScenarioError(where, f"line {i}: values must be finite numbers", line[:60])
        if lat <= 0 or bw <= 0:
            raise ScenarioError(where, f"line {i}: factors must be > 0", line[:60])
        if t < 0 or (rows and t <= rows[-1][0]):
            raise ScenarioError(where, f"line {i}: t_ms must be >= 0 and increasing", t)
        rows.append((t, lat, bw))
        if len(rows) > MAX_TRACE_ROWS:
            raise ScenarioError(where, f"has more than {MAX_TRACE_ROWS} samples", path)
    if not rows:
        raise ScenarioError(where, "has no samples", path)
    return tuple(tuple(col) for col in zip(*rows, strict=True))


@dataclasses.dataclass(frozen=True)
class Ramp:
    """A drift's fields (``wansim.config.network.Drift``'s names) without importing the scenario."""

    latency_factor: float
    bandwidth_factor: float
    over_ms: float


def drift_factors(t_ms: float, drift) -> tuple[float, float]:
    """(latency, bandwidth) multipliers at simulated time ``t_ms`` for a ``Drift`` (None: off):
    1 + (factor - 1) * min(t / over_ms, 1) each."""
    if drift is None:
        return 1.0, 1.0
    x = t_ms / drift.over_ms
    if x > 1.0:
        x = 1.0
    return 1.0 + (drift.latency_factor - 1.0) * x, 1.0 + (drift.bandwidth_factor - 1.0) * x


def drift_on(drift) -> bool:
    return drift is not None and (drift.latency_factor, drift.bandwidth_factor) != (1.0, 1.0)


class Modulation:
    """The factors of a drift and/or a trace at time t (:meth:`at`)."""

    __slots__ = ("drift", "trace")

    def __init__(self, drift=None, trace=None):
        self.drift = drift if drift_on(drift) else None
        self.trace = trace  # (t, latency factors, bandwidth factors) or None

    def at(self, t_ms: float) -> tuple[float, float]:
        lat, bw = drift_factors(t_ms, self.drift)
        if self.trace is not None:
            ts, lats, bws = self.trace
            i = bisect.bisect_right(ts, t_ms) - 1
            if i < 0:
                i = 0
            lat *= lats[i]
            bw *= bws[i]
        return lat, bw


def network_modulation(network) -> Modulation | None:
    """The network's :class:`Modulation`, or None when its links are stationary."""
    trace = read_trace(network.trace_file) if network.trace_file else None
    if not drift_on(network.drift) and trace is None:
        return None
    return Modulation(network.drift, trace)


DRIFT_PIECES = 16  # the ramp cut into this many pieces, each at its midpoint's factors
MAX_PIECES = 256  # a longer trace is merged into this many pieces (time-weighted)


def pieces(network) -> list[tuple[float, float, float]]:
    """(start_ms, latency factor, bandwidth factor) pieces of the run, each held until the
    next piece's start and the last forever: the trace's samples (merged into at most
    :data:`MAX_PIECES` by time-weighted latency and harmonic bandwidth factors), cut further
    by the drift's ramp at its midpoints."""
    trace = read_trace(network.trace_file) if network.trace_file else None
    drift = network.drift if drift_on(network.drift) else None
    cuts = {0.0}
    if trace is not None:
        ts = trace[0]
        if len(ts) > MAX_PIECES:
            span = ts[-1] - ts[0]
            cuts |= {ts[0] + span * k / MAX_PIECES for k in range(MAX_PIECES + 1)}
        else:
            cuts |= set(ts)
    if drift is not None:
        cuts |= {drift.over_ms * k / DRIFT_PIECES for k in range(DRIFT_PIECES + 1)}
    starts = sorted(cuts)
    mod = Modulation(drift, trace)
    out = []
    for k, t0 in enumerate(starts):
        if k + 1 < len(starts):
            out.append((t0, *_piece_mean(mod, trace, t0, starts[k + 1])))
        else:
            out.append((t0, *mod.at(t0)))
    return out


def _piece_mean(mod: Modulation, trace, t0: float, t1: float) -> tuple[float, float]:
    """Time-weighted latency factor and harmonic bandwidth factor over [t0, t1) (a drift:
    at the midpoint; a trace's samples inside: held pieces)."""
    inner = [t0]
    if trace is not None:
        ts = trace[0]
        inner += [t for t in ts[bisect.bisect_right(ts, t0) : bisect.bisect_left(ts, t1)]]
    inner.append(t1)
    lat = inv_bw = 0.0
    for a, b in itertools.pairwise(inner):
        la, ba = mod.at(0.5 * (a + b))  # held within: no trace sample inside (a, b)
        lat += la * (b - a)
        inv_bw += (b - a) / ba
    width = t1 - t0
    return lat / width, width / inv_bw

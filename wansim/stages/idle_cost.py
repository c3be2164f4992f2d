"""A pass after an idle period costs more (``model.idle_cost``), and a message after its hop's
sender idled (``network.idle_cost``).

Model: the first work a stage does after it idled ``g`` ms costs ``extra_ms(g)`` ms on top of
its pass time, from measured points [idle ms, extra ms] linearly interpolated, the end values
held beyond them (one table for every stage, ``model.idle_cost``, or one per stage,
``model.stage_idle_cost``): a host's caches, TLBs and clock cool while its thread sleeps
(measured on the real path: a pass at 50 ms links costs 0.5-1.3 ms more than at 0 ms,
docs/calibrate.md). The drafting on a stage (``placement: first_stage``) is part of its pass:
the cold start is paid once per pass, whichever comes first. A pass that starts as the one
before ends (a queue) idled 0 ms. A hop's sender likewise: a message after the sender idled
``g`` ms adds the network table's extra to its per-message cost
(:class:`wansim.links.delivery.HopSender`, the rule the DES and the emulator share).

Whose idle (``model.idle_follows``): ``stage``, the stage's own since its last work (each
stage on its own machine), or ``host``, the time since any stage last worked (every stage on
one host, as ``wansim calibrate``'s cells: a stage that idled while the others computed finds
the host warm; measured, run AC in docs/calibrate.md).

- DES (:class:`wansim.sim.stage.Stage`): each pass adds :func:`extra_ms` of the time since the
  stage's last busy instant (its first pass: since the run's start), or the host's
  (:class:`wansim.sim.host_idle.HostIdleClock`), to its compute, before compute noise and
  stragglers scale it.
- Analytical (:mod:`wansim.analytical.idle_cost`): each stage's mean idle before a pass,
  ``s (1 - rho) / rho`` (a pass of ``s`` ms at utilisation ``rho``: one request in the sync
  schedule, the lap less the stage's busy time), its extra added to the stage's fixed cost per
  pass, to a fixed point; a hop's sender idles the interval between its stage's passes,
  ``s / rho``, less its message's busy time, its extra added to the hop's per-message cost.
  The mean idle stands for every pass's own (the extra of the mean, not the mean of the
  extras). The host's idle (:func:`wansim.analytical.idle_cost.host_idle`): the hop into the
  stage, paid with the chance that no other stage is busy as the pass starts.
"""

from __future__ import annotations

import numpy as np


def active(model) -> bool:
    """Whether any stage pays an idle cost (``model.idle_cost`` or ``model.stage_idle_cost``
    with points)."""
    return bool(model.idle_cost.points) or any(c.points for c in model.stage_idle_cost)


def in_scenario(scenario) -> bool:
    """Whether a stage or a hop pays an idle cost (:func:`active`, ``network.idle_cost``)."""
    return active(scenario.model) or bool(scenario.network.idle_cost.points)


def field_of(scenario) -> str:
    """The field that sets an idle cost (for error lines): the first of ``model.idle_cost``,
    ``model.stage_idle_cost``, ``network.idle_cost`` with points."""
    m = scenario.model
    if m.idle_cost.points:
        return "model.idle_cost"
    return "model.stage_idle_cost" if active(m) else "network.idle_cost"


def table(cost) -> tuple[np.ndarray, np.ndarray] | None:
    """(idle ms, extra ms) of one ``IdleCost`` as arrays; None without points."""
    if not cost.points:
        return None
    points = np.asarray(cost.points, dtype=float).reshape(-1, 2)
    return points[:, 0].copy(), points[:, 1].copy()


def stage_tables(model, stages: int) -> list:
    """Per stage, its table (:func:`table`: ``model.stage_idle_cost[i]`` where given, else
    ``model.idle_cost``), None where it pays none."""
    each = model.stage_idle_cost or (model.idle_cost,) * stages
    return [table(c) for c in each]


def extra_ms(idle_ms, idle_points: np.ndarray, extra_points: np.ndarray):
    """Extra ms of a pass after ``idle_ms`` ms idle: linear between the points, the end values
    held beyond them (broadcasts over ``idle_ms``)."""
    return np.interp(idle_ms, idle_points, extra_points)


def scalar_extra(idle_points: np.ndarray, extra_points: np.ndarray):
    """A fast scalar :func:`extra_ms` for the DES (one call a pass): a Python function of the
    idle ms, the same values as ``np.interp`` for points in increasing order."""
    xs = [float(x) for x in idle_points]
    ys = [float(y) for y in extra_points]
    if len(xs) == 1:
        only = ys[0]
        return lambda _idle: only

    first_x, last_x, first_y, last_y = xs[0], xs[-1], ys[0], ys[-1]
    segments = list(zip(xs[:-1], xs[1:], ys[:-1], ys[1:], strict=True))

    def extra(idle: float) -> float:
        if idle <= first_x:
            return first_y
        if idle >= last_x:
            return last_y
        for x0, x1, y0, y1 in segments:
            if idle <= x1:
                return y0 + (y1 - y0) * (idle - x0) / (x1 - x0)
        return last_y

    return extra

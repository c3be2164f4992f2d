"""Stage slowdowns: compute noise and intermittent stragglers (``model.noise``,
``model.straggler``). The DES draws them per pass; the analytical engine takes their moments.

A pass that would take c ms at stage i (compute model + overhead) takes c X Y:

- X, noise: independent per pass, mean 1, coefficient of variation cv: lognormal (sigma^2 =
  ln(1 + cv^2), mu = -sigma^2 / 2) or gamma (shape 1 / cv^2, scale cv^2);
- Y, straggler: ``factor`` s while the stage is in a slow episode when the pass starts, else 1.
  Episodes alternate with fast periods, both exponential: slow of mean E = ``episode_ms``, fast
  of mean E (1 - f) / f, so a fraction f of the time is slow (started in the stationary state,
  one process per stage). E = 0: each pass is slow with probability f on its own.

Moments (X and Y independent):

    m      = E[XY]     = 1 + f (s - 1)
    E[(XY)^2]          = (1 + cv^2) (1 - f + f s^2),   Var(XY) = E[(XY)^2] - m^2

The analytical engine multiplies every stage's pass time by m (:func:`mean_factors`) and adds
c^2 Var(XY) per stage to a lap's variance (:func:`lap_variance_ms2`): exact for the mean lap
when passes are slow independently (E = 0, noise); with episodes (E > 0) a stage's consecutive
passes share a state, passes are fewer while it is slow, and the per-pass mean is an
approximation (``validated: false``).
"""

from __future__ import annotations

import math

import numpy as np

DRAW_BLOCK = 4096
STREAM_KEY = 1 << 20  # spawn_key prefix: independent of wansim.links.draws.ring_seeds' children


def listed(stages: tuple[int, ...], stage: int) -> bool:
    """Whether a ``stages`` list (empty: all) names ``stage``."""
    return not stages or stage in stages


def stage_moments(model, stage: int) -> tuple[float, float]:
    """(m, Var(XY)) of stage ``stage``'s slowdown (module docstring); (1, 0) when off."""
    noise, strag = model.noise, model.straggler
    cv = noise.cv if noise.kind != "none" and listed(noise.stages, stage) else 0.0
    f, s = (
        (strag.fraction, strag.factor) if strag.fraction and listed(strag.stages, stage) else (0, 1)
    )
    m = 1.0 + f * (s - 1.0)
    second = (1.0 + cv * cv) * (1.0 - f + f * s * s)
    return m, max(second - m * m, 0.0)


def active(model) -> bool:
    """Whether any stage is slowed (noise or stragglers)."""
    return model.noise.kind != "none" or model.straggler.fraction > 0


def mean_factors(model, stages: int) -> list[float]:
    """Per stage, m = E[XY]."""
    return [stage_moments(model, i)[0] for i in range(stages)]


def lap_variance_ms2(model, pass_ms_each) -> float | np.ndarray:
    """Sum over stages of c_i^2 Var(X_i Y_i) for deterministic pass times ``pass_ms_each``."""
    return sum(
        (np.asarray(c, dtype=float) ** 2 * stage_moments(model, i)[1])
        for i, c in enumerate(pass_ms_each)
    )


def lap_terms(model, pass_ms_each) -> tuple[float, list[tuple]]:
    """(sum of the deterministic stages' pass ms, one (c, noise kind, cv, f, s) per slowed
    stage) for the lap distribution (:func:`wansim.analytical.distribution.lap_distribution`);
    f is the stationary slow share (episodes taken as independent per pass)."""
    noise, strag = model.noise, model.straggler
    fixed, terms = 0.0, []
    for i, c in enumerate(pass_ms_each):
        c = float(c)
        kind = noise.kind if noise.kind != "none" and listed(noise.stages, i) else "none"
        f = strag.fraction if strag.fraction and listed(strag.stages, i) else 0.0
        if c <= 0 or (kind == "none" and not f):  # (a pass of 0 ms stays 0)
            fixed += c
        else:
            terms.append((c, kind, noise.cv if kind != "none" else 0.0, f, strag.factor))
    return fixed, terms


def stage_rng(seed: int, stage: int) -> np.random.Generator:
    """Stage ``stage``'s slowdown stream (its own; the ring's documented streams unchanged)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(STREAM_KEY, stage)))


class StageSlowdown:
    """One stage's draws in the DES: :meth:`factor` (X Y for a pass starting at ``t_ms``)."""

    __slots__ = (
        "_noise",
        "_noise_i",
        "_slow_draws",
        "_slow_i",
        "cv",
        "episode_ms",
        "fast_mean_ms",
        "fraction",
        "kind",
        "next_switch_ms",
        "rng",
        "slow",
        "slow_factor",
    )

    def __init__(self, model, stage: int, rng: np.random.Generator):
        noise, strag = model.noise, model.straggler
        self.kind = noise.kind if listed(noise.stages, stage) else "none"
        self.cv = noise.cv
        on = strag.fraction > 0 and listed(strag.stages, stage)
        self.fraction = strag.fraction if on else 0.0
        self.slow_factor = strag.factor
        self.episode_ms = strag.episode_ms
        self.rng = rng
        self._noise: list[float] = []
        self._noise_i = 0
        self._slow_draws: list[float] = []
        self._slow_i = 0
        self.slow = False
        self.next_switch_ms = 0.0
        if self.fraction and self.episode_ms > 0:
            self.fast_mean_ms = self.episode_ms * (1.0 - self.fraction) / self.fraction
            self.slow = bool(rng.random() < self.fraction)  # stationary start
            mean = self.episode_ms if self.slow else self.fast_mean_ms
            self.next_switch_ms = float(rng.exponential(mean))  # memoryless: residual = full

    @staticmethod
    def enabled(model, stage: int) -> bool:
        m, var = stage_moments(model, stage)
        return m != 1.0 or var > 0.0

    def factor(self, t_ms: float) -> float:
        """X Y for a pass starting at ``t_ms`` (non-decreasing across calls)."""
        x = self._next_noise() if self.kind != "none" else 1.0
        if self.fraction and self._is_slow(t_ms):
            x *= self.slow_factor
        return x

    def _is_slow(self, t_ms: float) -> bool:
        if self.episode_ms <= 0:
            if self._slow_i >= len(self._slow_draws):
                self._slow_draws = self.rng.random(DRAW_BLOCK).tolist()
                self._slow_i = 0
            u = self._slow_draws[self._slow_i]
            self._slow_i += 1
            return u < self.fraction
        while t_ms >= self.next_switch_ms:
            self.slow = not self.slow
            mean = self.episode_ms if self.slow else self.fast_mean_ms
            self.next_switch_ms += float(self.rng.exponential(mean))
        return self.slow

    def _next_noise(self) -> float:
        if self._noise_i >= len(self._noise):
            self._noise = sample_noise(self.rng, self.kind, self.cv, DRAW_BLOCK).tolist()
            self._noise_i = 0
        x = self._noise[self._noise_i]
        self._noise_i += 1
        return x


def sample_noise(rng: np.random.Generator, kind: str, cv: float, size: int) -> np.ndarray:
    """``size`` draws of X (mean 1, coefficient of variation ``cv``)."""
    if kind == "lognormal":
        sigma2 = math.log1p(cv * cv)
        return rng.lognormal(-sigma2 / 2.0, math.sqrt(sigma2), size)
    if kind == "gamma":
        return rng.gamma(1.0 / (cv * cv), cv * cv, size)
    return np.ones(size)

"""The slots' completion waves: b slots start together (a closed loop's cold start) and each
runs its requests back to back (N verify passes each, then the replacement's prefill), so
their completions come in waves that blur as the requests' lengths differ. Which laps of a
request follow other slots' admissions (whose prefills can convoy it) follows from the
completion times' distributions (:func:`lap_exposure`); continuous batching
(:mod:`wansim.analytical.batched`) and concurrent requests (:mod:`wansim.analytical.
concurrent`) both use it."""

from __future__ import annotations

import numpy as np

from wansim.numerics import normal_functions as nf

TAIL_SD = 10.0  # admissions per verdict: k up to mean + TAIL_SD sd (+ 10), at most b
MAX_WAVES = 64  # replacement waves followed one by one; later ones at the renewal rate
NEIGHBOUR_WAVES = 3  # waves r' within this of r overlap wave r (before they blur)
MAX_LAPS = 1 << 14  # requests (or refills) longer than this many laps: the renewal limit


def tractable(n_mean, n_var, gap_laps) -> bool:
    """Whether the waves are followed lap by lap (otherwise admissions per lap are at most
    b / MAX_LAPS: the renewal limit, :func:`renewal_exposure`, is as good)."""
    live_top = np.max(np.asarray(n_mean) + 8.0 * np.sqrt(np.maximum(np.asarray(n_var), 0.0)))
    return bool(live_top < MAX_LAPS and max(float(gap_laps), 0.0) < MAX_LAPS)


def renewal_exposure(mean_n: float, rounds: float, b: float) -> np.ndarray:
    """The slots at random phases: a continuing lap follows j ~ Binomial(b - 1, 1 / E[N])
    admissions, on the (1 - h) (R - b) / R of laps that continue and can be followed by one."""
    from scipy import stats

    h = 1.0 / max(float(mean_n), 1.0)
    b = float(b)
    if b <= 1 or rounds <= 1:
        return np.ones(1)
    lam = (b - 1.0) * h
    top = int(min(b - 1.0, J_CAP, np.ceil(lam + TAIL_SD * np.sqrt(lam) + 10.0)))
    out = stats.binom.pmf(np.arange(top + 1), b - 1.0, h) * (1.0 - h) * (1.0 - 1.0 / rounds)
    out[0] = max(1.0 - out[1:].sum(), 0.0)
    return out


J_CAP = 256  # others admitted at one verdict, followed one by one up to this (the rest lumped)
U_FINE = 1e-3  # admission probabilities below this are binned by decade, above by 1e-3


LATTICE_SD = (0.5, 0.75)  # a node's sd: below, on the lattice; above, the normal; blended in


def passes_pmf(w, n_mean, n_var) -> np.ndarray:
    """P(N = k), k = 0, 1, ..., of one request's verify passes (at least 1): the difficulty
    mixture, each node a normal discretised on the integers. A node of small spread (sd below
    1/2) sits on the three integers around its mean, keeping its mean and variance (or the two
    around it where the variance is below the least a lattice allows); between sd 1/2 and 3/4
    the two are blended linearly, so the pmf moves continuously from no spread to the
    discretised normal (hunt seed 8192: the laps' drift crossing sd 1/2 switched the convoys
    from none to half and lower latency lowered tokens/s by 7%; the discretised normal's
    centre cell at sd 1/2 is 0.68 against the lattice's 0.75)."""
    w, mu, var = (np.asarray(x, dtype=float) for x in (w, n_mean, n_var))
    sd = np.sqrt(np.maximum(var, 0.0))
    live = w > 0
    top = int(np.ceil(np.max(np.where(live, mu + 8.0 * sd, 1.0)))) + 2
    k = np.arange(top + 1, dtype=float)
    pmf = np.zeros(top + 1)
    low, high = LATTICE_SD
    for wq, m, s in zip(w[live], mu[live], sd[live], strict=True):
        m = max(m, 1.0)
        blend = min(max((s - low) / (high - low), 0.0), 1.0)
        if blend < 1.0:
            pmf += wq * (1.0 - blend) * _lattice(m, s, top + 1)
        if blend > 0.0:
            cell = nf.norm_cdf((k + 0.5 - m) / s) - nf.norm_cdf((k - 0.5 - m) / s)
            cell[0] = 0.0
            pmf += wq * blend * cell / cell.sum()
    return pmf / pmf.sum()


def _lattice(m: float, s: float, size: int) -> np.ndarray:
    """A spread of sd ``s`` < 3/4 about ``m`` >= 1 on the integers: the three around round(m)
    with mean m and variance s^2, or (a variance too small for them, or m below 3/2) the two
    around m with mean m."""
    out = np.zeros(size)
    k0 = int(np.rint(m))
    off = m - k0
    second = s * s + off * off  # E[(N - k0)^2]
    if k0 >= 2 and second >= abs(off):
        out[k0 - 1] = 0.5 * (second - off)
        out[k0] = 1.0 - second
        out[k0 + 1] = 0.5 * (second + off)
    else:
        lo = int(np.floor(m))
        out[lo] = 1.0 - (m - lo)
        out[lo + 1] = m - lo
    return out


def waves(pmf_n, gap_laps: float, rounds: float) -> tuple[np.ndarray, np.ndarray]:
    """(u(t), cont(t)) over laps t: the chance that a slot finishes a request at verdict t with
    a replacement to admit, and that a request of mine continues at t (weighted by the rounds
    a slot runs; one point).

    Each slot runs its requests back to back: N passes (``pmf_n``), then ``gap_laps`` laps of
    the replacement's prefill (rounded: the same for every slot), all slots starting
    together at lap 0 and independent in lap counts. The r-th completion of a slot falls at lap
    t with P(C_r = t) (FFT convolutions); a slot has a replacement to admit after its r-th
    request with probability clip(R/b - r, 0, 1) (the last wave admits nobody). A lap of my
    request follows a verdict t at which it continued, P(A_r < t < C_r) = F_A(t - 1) - F_C(t)
    (A_r its start); u(t) = sum_r P(slot admits after its r-th request at t). Rounds are followed to ``MAX_WAVES``; later ones
    repeat the last followed one (the end effect of the last wave dropped there)."""
    pmf_n = np.asarray(pmf_n, dtype=float)
    rounds = float(rounds)
    mine_rounds = int(min(np.ceil(rounds), MAX_WAVES))
    followed = mine_rounds + (NEIGHBOUR_WAVES if rounds > mine_rounds else 0)
    g_lo = int(np.rint(max(gap_laps, 0.0)))
    pmf_g = np.zeros(g_lo + 2)
    pmf_g[g_lo] = 1.0  # the same for every slot (a split would desynchronise them)
    size = 1 << int(np.ceil(np.log2(followed * (len(pmf_n) + g_lo + 1) + 2)))
    phi_n, phi_g = np.fft.rfft(pmf_n, size), np.fft.rfft(pmf_g, size)
    phi_a = np.ones_like(phi_n)
    u = np.zeros(size)
    cont = np.zeros(size)  # my continuing laps, weighted by the rounds I run
    last = np.zeros(size)
    for r in range(1, followed + 1):
        phi_c = phi_a * phi_n
        start = np.clip(np.fft.irfft(phi_a, size), 0.0, None)
        done = np.clip(np.fft.irfft(phi_c, size), 0.0, None)
        u += min(max(rounds - r, 0.0), 1.0) * done
        if r <= mine_rounds:
            going = np.zeros(size)
            going[1:] = np.cumsum(start)[:-1] - np.cumsum(done)[1:]
            going = np.clip(going, 0.0, None)
            cont += min(max(rounds - r + 1.0, 0.0), 1.0) * going
            last = going
        phi_a = phi_c * phi_g
    cont += max(rounds - mine_rounds, 0.0) * last
    return np.clip(u, 0.0, 1.0), cont


def lap_exposure(pmf_n, gap_laps: float, rounds: float, b: float) -> np.ndarray:
    """P(a lap follows a verdict at which j other slots finished and admitted a replacement),
    j = 0, 1, ...: over the laps at which a request continues (:func:`waves`), j ~
    Binomial(b - 1, u(t)), divided by all its laps (R/b E[N] per slot)."""
    pmf_n = np.asarray(pmf_n, dtype=float)
    mean_n = float(np.arange(len(pmf_n)) @ pmf_n)
    b = float(b)
    rounds = float(rounds)
    if b <= 1 or rounds <= 1:
        return np.ones(1)
    u, cont = waves(pmf_n, gap_laps, rounds)
    on = cont > 1e-15
    if not np.any(on):  # one pass per request: no lap follows another verdict
        return np.ones(1)
    u, cont = u[on], cont[on]
    # bin u (a binomial mixture over a narrow bin is the binomial at its weighted mean)
    key = np.where(
        u < U_FINE,
        np.floor(np.log10(np.maximum(u, 1e-300)) * 20.0) - 1e6,
        np.floor(u / U_FINE),
    )
    _, inverse = np.unique(key, return_inverse=True)
    weight = np.bincount(inverse, weights=cont)
    u_bin = np.bincount(inverse, weights=cont * u) / np.maximum(weight, 1e-300)
    lam = (b - 1.0) * u_bin
    top = int(min(b - 1.0, J_CAP, np.max(np.ceil(lam + TAIL_SD * np.sqrt(lam) + 10.0))))
    from scipy import stats

    j = np.arange(top + 1)
    probs = stats.binom.pmf(j[:, None], b - 1.0, u_bin[None, :])
    probs[-1] += np.clip(1.0 - probs.sum(axis=0), 0.0, None)  # the tail lumped at the cap
    out = probs @ weight / (rounds * mean_n)
    out[0] = max(1.0 - out[1:].sum(), 0.0)
    return out


def synchrony(pmf_n, gap_laps: float, rounds: float) -> float:
    """How much of another slot's admissions land on laps at which a request continues,
    relative to slots at random phases: sum_t cont(t) u(t) / (sum_t cont(t) x mean u), the
    mean u over the slot's run (R/b (E[N] + gap) laps). 0 when every request takes the same
    passes (the slots finish together and their replacements' prefills convoy nobody), near 1
    once the waves blur."""
    pmf_n = np.asarray(pmf_n, dtype=float)
    rounds = float(rounds)
    if rounds <= 1:
        return 0.0
    mean_n = float(np.arange(len(pmf_n)) @ pmf_n)
    u, cont = waves(pmf_n, gap_laps, rounds)
    mean_u = u.sum() / (rounds * (mean_n + max(gap_laps, 0.0)))
    total = cont.sum() * mean_u
    return float(np.clip(cont @ u / total, 0.0, 1.0)) if total > 0 else 0.0

"""The verifier at the last stage: how many tokens a verify pass carries and commits.

Policy: :func:`wansim.speculation.policy` (shared with the analytical engine) says how many
tokens a pass carries (K + 1 for a chain, N + 1 for a tree of N nodes, 1 without speculation)
and how the number of accepted drafts A is drawn: one uniform per pass against the request's
survival S_1..S_D (for a tree, S_d = P(accepted length >= d) over the request's tree; exact in
law, :func:`wansim.acceptance.trees.sample_survival`). The verifier rule enters through the
policy's acceptance (a profile's logit shift for greedy/typical).

Per-request difficulty: each request gets its own rates from the policy's ``request_rates``
(one draw per request from the difficulty stream; for a chain the same draw and rates as
``AcceptanceModel.request_rates``; a dynamic tree is shaped per request from them). The A of
each request are pre-drawn in vectorised blocks from the acceptance stream, 256 requests per
numpy call (about 1.25 x the passes the request is expected to need; a request that runs out
draws another block from its own stream: seed, request id, refill number), so a request's
acceptance sequence does not depend on timing (the async schedule relies on it: its valid blocks
consume the same sequence as a sync run's passes).

Commit: a pass commits min(A + 1, tokens the request still needs) -- the last pass is
truncated to what the request still needs, and the tokens verified beyond that are wasted.
"""

from __future__ import annotations

import numpy as np

from wansim import speculation
from wansim.acceptance.trees import sample_survival
from wansim.config.scenario import Scenario
from wansim.serving.workload import RequestPlan
from wansim.sim.messages import Pass
from wansim.sim.request import Request

CHUNK_REQUESTS = 256
MAX_BLOCK = 4096


class Verifier:
    """Draws A, commits tokens and counts what the metrics need (and, if asked, logs passes)."""

    def __init__(
        self,
        scenario: Scenario,
        rng_acceptance: np.random.Generator,
        rng_difficulty: np.random.Generator,
        log: list | None = None,
        plan: RequestPlan | None = None,
    ):
        self.policy = speculation.policy(scenario)
        self.rng = rng_acceptance
        n_requests = scenario.workload.requests
        rates = self.policy.request_rates(rng_difficulty, n_requests)
        # survival per request (a dynamic tree is built once per request here)
        self.survival = speculation.commit_survival(scenario, self.policy.survival(rates))
        decode = scenario.workload.output_tokens - 1
        if plan is not None:
            decode = plan.output_tokens - 1
            if len(plan.rows) > 1:
                self.survival = mixed_survival(scenario, plan, rng_difficulty)
        tau = 1.0 + self.survival.sum(axis=1)
        self.block = np.minimum(np.ceil(1.25 * decode / tau) + 8, MAX_BLOCK).astype(int)
        self.chunks: dict[int, list[list[int]]] = {}
        self.refills: dict[int, int] = {}
        self.log = log  # (rid, step, time_ms, n, accepted, remaining_before, committed)
        # lossless and greedy verification keep the target's output distribution; typical
        # acceptance (lossy) and activations below 16 bits on the wire do not
        self.target_exact = bool(speculation.target_exact(scenario))
        # totals over every verify pass of the run
        self.passes = 0
        self.tokens_verified = 0
        self.tokens_committed = 0

    def tokens_per_pass(self, request: Request) -> int:
        return self.policy.tokens_per_pass()

    def prepare(self, request: Request) -> None:
        """Hand the request its pre-drawn block of accepted counts (drawing its chunk once)."""
        c = request.rid // CHUNK_REQUESTS
        if c not in self.chunks:
            lo, hi = c * CHUNK_REQUESTS, (c + 1) * CHUNK_REQUESTS
            surv = self.survival[lo:hi]
            size = int(self.block[lo:hi].max()) if len(surv) else 0
            self.chunks[c] = _draw(self.rng, surv, size).tolist()
        request.accepted = self.chunks[c][request.rid - c * CHUNK_REQUESTS]
        request.accepted_i = 0

    def _refill(self, request: Request) -> None:
        """Another block for a request that ran out, from its own stream (seed, request id,
        refill number): its draws never depend on when other requests refill."""
        surv = self.survival[request.rid : request.rid + 1]
        size = int(self.block[request.rid])
        n = self.refills[request.rid] = self.refills.get(request.rid, 0) + 1
        seq = self.rng.bit_generator.seed_seq
        own = np.random.default_rng(
            np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, request.rid, n))
        )
        request.accepted = _draw(own, surv, size)[0].tolist()
        request.accepted_i = 0

    def verify(self, p: Pass, now_ms: float) -> int:
        """Verify pass ``p`` of its request: commit min(A + 1, remaining); returns that."""
        accepted, remaining, committed = self._commit(p.request, p.n)
        if self.log is not None:
            self.log.append((p.request.rid, p.step, now_ms, p.n, accepted, remaining, committed))
        return committed

    def verify_all(self, request: Request, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Every verify pass of ``n`` tokens a request needs, one after another (a lone
        request: the same draws, refills and totals as that many :meth:`verify` calls); returns
        the tokens each pass committed (what :meth:`verify` appends to ``lap_tokens``) and the
        accepted drafts A each pass drew (what its log keeps).

        Pass j commits min(A_j + 1, remaining): the passes run until the running sum of
        A_j + 1 first reaches the tokens needed, and that last pass commits what remains."""
        parts, drawn = [], []
        while request.committed < request.decode_tokens:
            if request.accepted_i >= len(request.accepted):
                self._refill(request)
            accepted = np.asarray(request.accepted[request.accepted_i :], dtype=np.int64)
            gains = accepted + 1
            need = request.decode_tokens - request.committed
            reached = np.cumsum(gains)
            m = int(np.searchsorted(reached, need))  # the first pass whose sum reaches need
            if m < len(gains):
                gains = gains[: m + 1]
                gains[m] = need - (int(reached[m - 1]) if m else 0)
            used, got = len(gains), int(gains.sum())
            parts.append(gains)
            drawn.append(accepted[:used])
            request.accepted_i += used
            request.committed += got
            request.passes += used
            self.passes += used
            self.tokens_verified += n * used
            self.tokens_committed += got
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(parts), np.concatenate(drawn)

    def verify_drawn(self, p: Pass, now_ms: float, accepted: int) -> int:
        """Verify pass ``p`` whose accepted drafts were drawn elsewhere (a tree round of the
        per-round hybrid, :mod:`wansim.speculation.hybrid_rounds`): the same commit and counts."""
        req = p.request
        remaining = req.decode_tokens - req.committed
        committed = accepted + 1 if accepted < remaining else remaining
        req.committed += committed
        req.lap_tokens.append(committed)
        req.passes += 1
        self.passes += 1
        self.tokens_verified += p.n
        self.tokens_committed += committed
        if self.log is not None:
            self.log.append((req.rid, p.step, now_ms, p.n, accepted, remaining, committed))
        return committed

    def _commit(self, req: Request, n: int) -> tuple[int, int, int]:
        """One verify pass of ``n`` tokens: (A drawn, tokens remaining before, committed)."""
        if req.accepted_i >= len(req.accepted):
            self._refill(req)
        accepted = req.accepted[req.accepted_i]
        req.accepted_i += 1
        remaining = req.decode_tokens - req.committed
        committed = accepted + 1 if accepted < remaining else remaining
        req.committed += committed
        req.lap_tokens.append(committed)
        req.passes += 1
        self.passes += 1
        self.tokens_verified += n
        self.tokens_committed += committed
        return accepted, remaining, committed


def mixed_survival(scenario: Scenario, plan: RequestPlan, rng: np.random.Generator) -> np.ndarray:
    """Survival per request when requests mix profile workload rows (a chain): each row's
    policy draws every request's difficulty from the difficulty stream in turn (rows in the
    mix's order), and request i keeps the draw of its own row."""
    import dataclasses

    acc = scenario.drafter.acceptance
    out = None
    for r, name in enumerate(plan.rows):
        sc = dataclasses.replace(
            scenario,
            drafter=dataclasses.replace(
                scenario.drafter, acceptance=dataclasses.replace(acc, workload=name)
            ),
        )
        pol = speculation.policy(sc)
        surv = pol.survival(pol.request_rates(rng, len(plan.row)))
        out = surv.copy() if out is None else out
        out[plan.row == r] = surv[plan.row == r]
    return out


def _draw(rng: np.random.Generator, surv: np.ndarray, size: int) -> np.ndarray:
    """Accepted drafts for ``size`` passes per row of survival (R, D) -> (R, size)."""
    if surv.shape[1] == 0:
        return np.zeros((surv.shape[0], size), dtype=np.int64)
    return sample_survival(rng, surv, size)

"""The verifier at the last stage: how many tokens a verify pass carries and commits.

Policy (the one place trees, hedges and async cancellation extend): :class:`ChainPolicy` says
how many tokens a pass carries (K + 1: the K drafts plus the position that yields the bonus or
correction token; 1 without speculation) and how the number of accepted drafts A is drawn
(one uniform per pass against the request's survival S_1..S_K, :func:`sample_accepted`).

Per-request difficulty: each request gets its own conditional rates from
``AcceptanceModel.request_rates`` (one draw per request from the difficulty stream). The A of
each request are pre-drawn in vectorised blocks from the acceptance stream, 256 requests per
numpy call (about 1.25 x the passes the request is expected to need; a request that runs out
draws another block of its own), so a request's acceptance sequence does not depend on timing.

Commit: a pass commits min(A + 1, tokens the request still needs) -- the last pass is
truncated to what the request still needs, and the tokens verified beyond that are wasted.
"""

from __future__ import annotations

import numpy as np

from wansim.acceptance.model import acceptance_model
from wansim.acceptance.sampler import sample_accepted
from wansim.scenario import Scenario
from wansim.sim.messages import Pass
from wansim.sim.request import Request

CHUNK_REQUESTS = 256
MAX_BLOCK = 4096


class ChainPolicy:
    """A chain of ``k`` drafts (k = 0: no speculation) verified in one pass."""

    def __init__(self, k: int):
        self.k = k

    def tokens_per_pass(self) -> int:
        return self.k + 1

    def survival(self, rates: np.ndarray) -> np.ndarray:
        """S_1..S_K per request row: P(A >= j)."""
        return np.cumprod(rates, axis=-1)

    def draw(self, rng: np.random.Generator, rates: np.ndarray, size: int) -> np.ndarray:
        """Accepted drafts for ``size`` passes per row of ``rates`` (R, k) -> (R, size)."""
        if self.k == 0:
            return np.zeros((rates.shape[0], size), dtype=np.int64)
        return sample_accepted(rng, rates, size)


class Verifier:
    """Draws A, commits tokens and counts what the metrics need (and, if asked, logs passes)."""

    def __init__(
        self,
        scenario: Scenario,
        rng_acceptance: np.random.Generator,
        rng_difficulty: np.random.Generator,
        log: list | None = None,
    ):
        k = scenario.k
        self.policy = ChainPolicy(k)
        self.rng = rng_acceptance
        n_requests = scenario.workload.requests
        if k > 0:
            model = acceptance_model(scenario.drafter.acceptance)
            self.rates = model.request_rates(rng_difficulty, n_requests, k)
        else:
            self.rates = np.zeros((n_requests, 0))
        decode = scenario.workload.output_tokens - 1
        tau = 1.0 + self.policy.survival(self.rates).sum(axis=1)
        self.block = np.minimum(np.ceil(1.25 * decode / tau) + 8, MAX_BLOCK).astype(int)
        self.chunks: dict[int, list[list[int]]] = {}
        self.log = log  # (rid, step, time_ms, n, accepted, remaining_before, committed)
        # lossless and greedy verification keep the target's output distribution; typical
        # acceptance (lossy) does not -- the acceptance profile already reflects the rule
        self.target_exact = scenario.speculation.verifier != "typical"
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
            rates = self.rates[lo:hi]
            size = int(self.block[lo:hi].max()) if len(rates) else 0
            self.chunks[c] = self.policy.draw(self.rng, rates, size).tolist()
        request.accepted = self.chunks[c][request.rid - c * CHUNK_REQUESTS]
        request.accepted_i = 0

    def _refill(self, request: Request) -> None:
        rates = self.rates[request.rid : request.rid + 1]
        size = int(self.block[request.rid])
        request.accepted = self.policy.draw(self.rng, rates, size)[0].tolist()
        request.accepted_i = 0

    def verify(self, p: Pass, now_ms: float) -> int:
        """Verify pass ``p`` of its request: commit min(A + 1, remaining); returns that."""
        req = p.request
        if req.accepted_i >= len(req.accepted):
            self._refill(req)
        accepted = req.accepted[req.accepted_i]
        req.accepted_i += 1
        remaining = req.decode_tokens - req.committed
        committed = accepted + 1 if accepted < remaining else remaining
        req.committed += committed
        req.passes += 1
        self.passes += 1
        self.tokens_verified += p.n
        self.tokens_committed += committed
        if self.log is not None:
            self.log.append((req.rid, p.step, now_ms, p.n, accepted, remaining, committed))
        return committed

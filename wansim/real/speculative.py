"""Drafting and verification: the rules that make speculative decoding lossless.

Drafter (a small LM at stage 0): ``K`` autoregressive steps from the committed tokens; at
temperature ``T > 0`` draft i is sampled from ``q_i = softmax(logits / T)``, at ``T = 0`` it is the
argmax. Its KV cache keeps the longest prefix it shares with the committed tokens (its own
rejected drafts are cropped away) and catches up on the rest in one forward.

Verification (at the last stage, on the target's logits for the ``K + 1`` positions of one pass):

- greedy: accept drafts while ``d_i == argmax p_i``; the next token is ``argmax p_{a+1}``. The
  output equals plain greedy decoding of the target.
- lossless (T > 0, Leviathan et al. / Chen et al.): accept ``d_i`` with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection sample from
  ``norm(max(0, p_i - q_i))``; if all ``K`` are accepted sample a bonus token from ``p_{K+1}``.
  Each committed token is then distributed exactly as the target's ``softmax(logits / T)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wansim.config.speculation import REAL_VERIFIERS
from wansim.real.errors import RealConfigError
from wansim.real.model import StageShard


def check_decoding(verifier: str, temperature: float, k: int) -> None:
    """Validate verifier / temperature / K together."""
    if verifier not in REAL_VERIFIERS:
        raise RealConfigError("verifier", f"must be one of {list(REAL_VERIFIERS)}", verifier)
    if not temperature >= 0:
        raise RealConfigError("temperature", "must be >= 0", temperature)
    if verifier == "lossless" and temperature <= 0:
        raise RealConfigError("temperature", "must be > 0 for the lossless verifier", temperature)
    if verifier == "greedy" and temperature != 0:
        raise RealConfigError("temperature", "must be 0 for the greedy verifier", temperature)
    if not 0 <= k <= 64:
        raise RealConfigError("k", "must be in 0..64", k)


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float64 (rows are positions)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def _sample(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=gen).item())


def draft_token(logits: torch.Tensor, temperature: float, gen: torch.Generator):
    """A drafter's next token from its logits: sampled from softmax(logits / T) with its
    distribution q (float32: exactly what goes on the wire) when T > 0, else the argmax
    (q None)."""
    if temperature > 0:
        q = probs(logits, temperature).float()
        return _sample(q, gen), q
    return int(logits.argmax()), None


@dataclass(frozen=True)
class Verdict:
    """``accepted`` drafts (0..K) and the token the target adds after them."""

    accepted: int
    next_token: int


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> Verdict:
    """Exact-match verification; ``logits`` has ``len(drafts) + 1`` rows."""
    target = logits.argmax(dim=-1).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return Verdict(a, int(target[a]))


def verify_lossless(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    temperature: float,
    gen: torch.Generator,
) -> Verdict:
    """Rejection sampling; ``q`` [K, vocab] are the distributions the drafts were drawn from."""
    p = probs(logits, temperature)
    k = len(drafts)
    if k and (q is None or q.shape[0] != k):
        raise ValueError(f"lossless verification of {k} drafts needs their {k} distributions")
    for i, d in enumerate(drafts):
        qi = q[i].double()
        pi = p[i]
        u = torch.rand((), generator=gen, dtype=torch.float64)
        if qi[d] > 0 and u * qi[d] < pi[d]:  # u < min(1, p/q) without dividing
            continue
        residual = torch.clamp(pi - qi, min=0)
        total = residual.sum()
        if total <= 0:  # p == q up to rounding: any rejection is then measure-zero; use p
            residual, total = pi, pi.sum()
        return Verdict(i, _sample(residual / total, gen))
    return Verdict(k, _sample(p[k], gen))


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    verifier: str,
    temperature: float,
    gen: torch.Generator,
) -> Verdict:
    if verifier == "greedy":
        return verify_greedy(logits, drafts)
    return verify_lossless(logits, drafts, q, temperature, gen)


class Drafter:
    """An autoregressive draft model (a whole small LM as one ``StageShard``)."""

    def __init__(self, model):
        self.shard = StageShard(model, 0, len(model.model.layers))
        self.cached: list[int] = []
        self._cached_by: dict[int, list[int]] = {}

    def reset(self) -> None:
        self.shard.reset()
        self.cached = []

    def select(self, request: int) -> None:
        """Draft for ``request`` (its own KV cache and cached tokens)."""
        if request == self.shard.request:
            return
        self._cached_by[self.shard.request] = self.cached
        self.cached = self._cached_by.pop(request, [])
        self.shard.select(request)

    @torch.no_grad()
    def prime(self, committed: list[int]) -> torch.Tensor:
        """Bring the cache to exactly ``committed`` (reusing the longest common prefix) and
        return the logits after its last token."""
        common = 0
        limit = min(len(self.cached), len(committed) - 1)
        while common < limit and self.cached[common] == committed[common]:
            common += 1
        feed = committed[common:]
        logits = self.shard.forward(torch.tensor(feed), common)[-1]
        self.cached = list(committed)
        return logits.cpu()

    @torch.no_grad()
    def draft(
        self, committed: list[int], k: int, temperature: float, gen: torch.Generator
    ) -> tuple[list[int], torch.Tensor | None]:
        """K draft tokens after ``committed`` and (T > 0) their distributions q [K, vocab]."""
        if k == 0:
            return [], None
        logits = self.prime(committed)
        drafts: list[int] = []
        qs = []
        for i in range(k):
            d, qi = draft_token(logits, temperature, gen)
            if qi is not None:
                qs.append(qi)
            drafts.append(d)
            if i < k - 1:
                logits = self.shard.forward(torch.tensor([d]), len(self.cached))[-1]
                self.cached.append(d)
        return drafts, (torch.stack(qs) if qs else None)

    @torch.no_grad()
    def draft_batch(
        self, items: list[tuple[int, list[int], torch.Generator]], k: int, temperature: float
    ) -> list[tuple[list[int], torch.Tensor | None]]:
        """:meth:`draft` for several requests at once, ``(request, committed, gen)`` each: one
        drafter forward per draft position over all of them (``StageShard.forward_batch``,
        each request on its own KV cache), as a batched drafter runs (the engines' one drafter
        pass per batch). Each request draws from its own ``gen`` in the same order as
        :meth:`draft`, so its drafts are those of drafting it alone."""
        if k == 0 or not items:
            return [([], None) for _ in items]
        if self.shard.request >= 0:  # every request's cached tokens in the dict from here on
            self._cached_by[self.shard.request] = self.cached
        self.cached = []
        blocks, ids, cached = [], [], []
        for request, committed, _ in items:
            have = self._cached_by.pop(request, [])
            common, limit = 0, min(len(have), len(committed) - 1)
            while common < limit and have[common] == committed[common]:
                common += 1
            blocks.append((request, common, len(committed) - common))
            ids += committed[common:]
            cached.append(list(committed))
        out = self.shard.forward_batch(torch.tensor(ids), blocks)
        ends = np.cumsum([n for _, _, n in blocks]) - 1
        logits = [out[int(e)].cpu() for e in ends]
        drafts: list[list[int]] = [[] for _ in items]
        qs: list[list[torch.Tensor]] = [[] for _ in items]
        for i in range(k):
            for j, (_, _, gen) in enumerate(items):
                d, qi = draft_token(logits[j], temperature, gen)
                drafts[j].append(d)
                if qi is not None:
                    qs[j].append(qi)
            if i < k - 1:
                step = [(r, len(cached[j]), 1) for j, (r, _, _) in enumerate(items)]
                out = self.shard.forward_batch(torch.tensor([d[-1] for d in drafts]), step)
                logits = [out[j].cpu() for j in range(len(items))]
                for j in range(len(items)):
                    cached[j].append(drafts[j][-1])
        for j, (request, _, _) in enumerate(items):
            self._cached_by[request] = cached[j]
        return [(drafts[j], torch.stack(qs[j]) if qs[j] else None) for j in range(len(items))]


@torch.no_grad()
def plain_decode(
    model, prompt: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> list[int]:
    """Reference: one token per forward of the whole (unsplit) target, with its KV cache."""
    shard = StageShard(model, 0, len(model.model.layers))
    gen = torch.Generator().manual_seed(seed)
    logits = shard.forward(torch.tensor(prompt), 0)[-1]
    out: list[int] = []
    pos = len(prompt)
    while len(out) < max_new_tokens:
        tok = int(logits.argmax()) if temperature == 0 else _sample(probs(logits, temperature), gen)
        out.append(tok)
        logits = shard.forward(torch.tensor([tok]), pos)[-1]
        pos += 1
    return out


def prompt_generators(seed: int, prompt_index: int) -> tuple[torch.Generator, torch.Generator]:
    """(drafter's, verifier's) random generators for one prompt of a job: a fixed derivation, so
    the pipeline and :func:`speculative_decode` draw the same numbers."""
    base = (seed * 1_000_003 + 2 * prompt_index) % (2**62)
    return torch.Generator().manual_seed(base), torch.Generator().manual_seed(base + 1)


def sample_first(logits: torch.Tensor, verifier: str, temperature: float, gen) -> int:
    """The token after the prompt (prefill pass): argmax, or a sample from p."""
    if verifier == "greedy":
        return int(logits.argmax())
    return _sample(probs(logits, temperature), gen)


@torch.no_grad()
def speculative_decode(
    target,
    drafter: Drafter | None,
    prompt: list[int],
    max_new_tokens: int,
    k: int,
    verifier: str = "greedy",
    temperature: float = 0.0,
    seed: int = 0,
    prompt_index: int = 0,
    shard=None,
) -> tuple[list[int], list[int]]:
    """In-process reference of the pipeline's algorithm: (new tokens, accepted per step).

    Same drafter, verification rules and random streams as the staged pipeline, with the whole
    target in one process; used by tests and to measure acceptance quickly. ``shard``: run the
    target through this object's ``forward(x, pos)`` instead (e.g. a
    :class:`wansim.real.wire_quality.WiredTarget` with compressed activations between stages).
    """
    check_decoding(verifier, temperature, k)
    shard = shard if shard is not None else StageShard(target, 0, len(target.model.layers))
    dgen, vgen = prompt_generators(seed, prompt_index)
    if drafter is not None:
        drafter.reset()
    logits = shard.forward(torch.tensor(prompt), 0)
    committed = list(prompt)
    committed.append(sample_first(logits[-1], verifier, temperature, vgen))
    accepted_trace: list[int] = []
    while len(committed) - len(prompt) < max_new_tokens:
        drafts, q = drafter.draft(committed, k, temperature, dgen) if k else ([], None)
        logits = shard.forward(torch.tensor([committed[-1], *drafts]), len(committed) - 1)
        v = verify(logits, drafts, q, verifier, temperature, vgen)
        committed.extend(drafts[: v.accepted])
        committed.append(v.next_token)
        accepted_trace.append(v.accepted)
    return committed[len(prompt) :][:max_new_tokens], accepted_trace

"""A pipeline stage: one long-lived SimPy process with a mailbox (a deque plus a wake event).

The stage takes the oldest pass from its mailbox (FIFO), or with ``schedule.batching:
continuous`` every pass waiting there as one batch of sum(n) tokens, and holds for ONE timeout
of ``stage_ms(n)`` (one process step per pass or batch, never per token). Then:

- a stage before the last sends the pass (or batch, as one message of header + sum(n)
  activations) on its forward hop;
- the last stage is where the verifier sits: a prefill pass yields the first output token
  (TTFT), a verify pass commits min(A + 1, remaining) tokens and closes a lap. A request with
  tokens left gets its next verify pass of K + 1 tokens, which rides the return hop to S0 (one
  message of ``return_bytes`` per request); a finished request leaves (no draft after the final
  verify) and frees its admission slot at that instant.

Drafting occupies the stage it runs on. ``placement: last_stage``: after the verdicts, one
drafter pass (``drafter_ms(K)``, block or autoregressive) drafts the continuing requests of the
batch, then the verdict+drafts leave. ``first_stage``: S0 drafts (one drafter pass per batch
holding verify passes) right before computing; drafting and compute then share one timeout.
At the last stage drafting is a second timeout after the verdicts, because the verdict instant
is observable: it closes the lap and, for a finishing request, admits the next one.
Stage busy time (compute + drafting, prefill included) is summed for utilisation.

With ``schedule.kind: async`` or ``drafter.overlap: true`` the stage calls the block schedule's
hooks (:mod:`wansim.sim.schedule`): before computing (drop cancelled blocks), after computing
(count the work, issue blocks at S0) and, at the last stage, for the verdicts.
"""

from __future__ import annotations

from collections import deque

import simpy
from simpy.events import Event, Timeout

from wansim.sim.link import Link, decode_share
from wansim.sim.messages import KIND_NAMES, PREFILL, VERIFY, Pass
from wansim.sim.request import RequestSource
from wansim.sim.verifier import Verifier


class Stage:
    """Stage ``index`` of ``n_stages``; wire it with ``link_out`` and ``source`` before running."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        n_stages: int,
        compute_ms,
        forward_bytes,
        return_bytes: float,
        *,
        batching: bool,
        draft_before_ms: float,
        draft_after_ms: float,
        draft_before_per_sequence_ms: float = 0.0,
        draft_after_per_sequence_ms: float = 0.0,
        mask_bytes_per_sequence: float = 0.0,
        verifier: Verifier,
        timeline: list | None = None,
        hooks=None,
    ):
        self.env = env
        self.index = index
        self.is_last = index == n_stages - 1
        self.compute_ms = compute_ms  # n tokens -> ms (memoised per stage: sizes repeat)
        self.forward_bytes = forward_bytes  # n tokens -> bytes of one forward message
        self.return_bytes = return_bytes
        self.batching = batching
        self.draft_before_ms = draft_before_ms  # S0 with placement first_stage
        self.draft_after_ms = draft_after_ms  # last stage with placement last_stage
        # trees (wansim.speculation): the drafter's width cost and the tree mask, per sequence
        self.draft_before_per_sequence_ms = draft_before_per_sequence_ms
        self.draft_after_per_sequence_ms = draft_after_per_sequence_ms
        self.mask_bytes_per_sequence = mask_bytes_per_sequence
        self.verifier = verifier
        self.timeline = timeline  # (stage, start, end, what, passes); labels made on export
        # the block schedule (async, overlapped drafter: wansim.sim.schedule), None for sync
        self.hooks = hooks
        self.mailbox: deque[Pass] = deque()
        self.wake: simpy.Event | None = None
        self.link_out: Link | None = None
        self.source: RequestSource | None = None
        self.busy_ms = 0.0
        self.passes = 0
        self.process = env.process(self.run())

    def receive(self, passes: list[Pass]) -> None:
        """Mailbox drop (a link delivery, or an admission into S0); wakes an idle stage."""
        self.mailbox.extend(passes)
        wake = self.wake
        if wake is not None:
            self.wake = None
            wake.succeed()

    def run(self):
        env = self.env
        mailbox = self.mailbox
        compute_ms = self.compute_ms
        compute_cache: dict[int, float] = {}
        draft_before = self.draft_before_ms
        before_per_seq = self.draft_before_per_sequence_ms
        timeline = self.timeline
        hooks = self.hooks
        while True:
            while not mailbox:  # (a cancellation may empty the mailbox before we wake)
                wake = self.wake = Event(env)
                yield wake
            if self.batching and len(mailbox) > 1:
                batch = list(mailbox)
                mailbox.clear()
                n = sum(p.n for p in batch)
            else:
                p = mailbox.popleft()
                batch = [p]
                n = p.n
            if hooks is not None:  # drop cancelled blocks before starting them
                batch = hooks.take(self.index, batch)
                if not batch:
                    continue
                n = sum(p.n for p in batch)
            start = env._now
            draft = draft_before if draft_before and any(p.kind == VERIFY for p in batch) else 0.0
            if before_per_seq:
                draft += before_per_seq * sum(p.kind == VERIFY for p in batch)
            compute = compute_cache.get(n)
            if compute is None:
                compute = compute_cache[n] = float(compute_ms(n))
            yield Timeout(env, draft + compute)
            self.busy_ms += draft + compute
            self.passes += 1
            if timeline is not None:
                if draft:
                    timeline.append((self.index, start, start + draft, "draft", batch))
                timeline.append((self.index, start + draft, env._now, _what(batch), batch))
            if hooks is not None:  # count the work; cancelled meanwhile: not forwarded
                batch = hooks.done(self.index, batch)
                if self.is_last:
                    hooks.verdicts(self, batch)
                    continue
                if not batch:
                    continue
                n = sum(p.n for p in batch)
            if not self.is_last:
                share = 1.0 if batch[0].kind == VERIFY and len(batch) == 1 else decode_share(batch)
                size = self.forward_bytes(n)
                if self.mask_bytes_per_sequence:
                    size += self.mask_bytes_per_sequence * sum(p.kind == VERIFY for p in batch)
                self.link_out.send(batch, size, share)
                continue
            following = self._verdicts(batch)
            if not following:
                continue
            if self.draft_after_ms or self.draft_after_per_sequence_ms:
                start = env._now
                draft = self.draft_after_ms + self.draft_after_per_sequence_ms * len(following)
                yield Timeout(env, draft)
                self.busy_ms += draft
                if timeline is not None:
                    timeline.append((self.index, start, env._now, "draft", following))
            self.link_out.send(following, self.return_bytes * len(following), 1.0)

    def _verdicts(self, batch: list[Pass]) -> list[Pass]:
        """Last stage: first tokens and verdicts; returns the next passes of unfinished requests."""
        now = self.env._now
        verifier = self.verifier
        following = []
        for p in batch:
            req = p.request
            if p.kind == PREFILL:
                req.first_token_ms = now
            else:
                verifier.verify(p, now)
                req.laps_ms.append(now - req.last_verify_ms)
            req.last_verify_ms = now
            if req.committed >= req.decode_tokens:
                self.source.finished(req)
            else:
                following.append(Pass(req, VERIFY, p.step + 1, verifier.tokens_per_pass(req)))
        return following


def _what(batch: list[Pass]) -> str:
    """prefill | verify | mixed (a continuous batch holding both)."""
    if len(batch) == 1:
        return KIND_NAMES[batch[0].kind]
    kinds = {p.kind for p in batch}
    return "mixed" if len(kinds) > 1 else KIND_NAMES[kinds.pop()]

"""Async in-pipe speculation (and the overlapped drafter): block issuing, bets and cancellation.

Used when ``schedule.kind: async`` or ``drafter.overlap: true`` (the plain sync schedule never
touches this module). It hooks into the stages (:meth:`Scheduler.take`, :meth:`Scheduler.done`,
:meth:`Scheduler.verdicts`) and receives what the links deliver (:meth:`Scheduler.deliver`).

Blocks. A request's verify passes are :class:`Block` s: K + 1 tokens, a ``step`` (the position
of the block in the request's sequence of verified blocks, 1, 2, ...) and an ``epoch``. A block
is *valid* while its epoch equals the request's; every rejection that invalidates later blocks
increments the epoch, and a block of an older epoch is *stale* (cancelled).

The bet. A block drafted before the verdict of the block before it is drafted from that block's
K drafts plus the drafter's own guess of the token after them (the position that yields the
bonus token in a sync run), and the guess is verified as draft K + 1 of the earlier block: with
lossless verification it is accepted with the conditional rate p_{K+1} of that position, and
the earlier block commits K + 1 tokens either way (K drafts and the accepted guess, or K drafts
and the bonus), exactly as in a sync run. So the bet on block j wins when block j accepts all K
drafts *and* the guess: with probability S_K p_{K+1}. A lost bet (fewer than K accepted, or a
rejected guess) cancels every later block of the request; drafting restarts from the committed
token. p_{K+1} is the request's own rate at position K + 1 (same difficulty draw as its other
rates); beyond the measured positions the last measured rate is held (an assumption).

Losslessness, precisely: the verifier consumes one acceptance draw per *valid* verified block,
in step order, from the same pre-drawn per-request sequence as the sync schedule, and commits
min(A + 1, remaining). Hence for the same seed every request's sequence of (step, A, committed)
- and so its committed tokens, verify passes and tau - equals the sync run's; only timing and
wasted work differ. The bet outcomes come from a separate per-request stream (seed, request id),
so they never shift the acceptance draws.

Async (``schedule.kind: async``, drafter on S0). S0 keeps up to B = ``max_inflight_blocks``
blocks of a request in the pipe (issued, verdict not yet back at S0). When S0 finishes a valid
block it creates the request's next block at the back of its mailbox if the window has room and
the blocks in flight cannot already finish the request (committed + (K + 1) x in flight < M:
S0 never bets past the request's end, so a request never finishes with blocks in flight behind
it). Without overlap S0 drafts the block when it serves it (drafting and compute share S0, as in
sync). The last stage verifies a block and sends a verdict (``return_bytes``) to S0 - except
for the request's final block; S0 frees the slot and issues again. On a lost bet the last stage
increments the epoch (it drops stale blocks of that request without computing them from then
on); when the verdict reaches S0, S0 drops the request's block waiting in its mailbox, creates
the restart block, and - if a stale block already left S0 and there are stages between S0 and
the last - sends a cancellation message (``payload.cancel_bytes``) down the forward hops
S0 -> S1 -> ... -> S(P-2). Links are FIFO, so a cancellation never overtakes the stale blocks
sent before it: it reaches stage i after them and removes those still waiting in stage i's
mailbox; a stage that learns of a cancellation while computing a stale block finishes it (work
in progress is never aborted) and does not forward it.

Overlapped drafter (``drafter.overlap: true``, either schedule; the max(.) law). The drafter is
its own device beside its stage (S0 for first_stage, the last stage for last_stage): drafting
does not occupy the stage. The device serves requests FIFO, one drafter pass per block (per
batch of the requests waiting, with ``schedule.batching: continuous``, as a stage would). As soon as a block is released into the pipe the drafter drafts the
request's next block from it (the same bet as above) and holds it; the held block is released
when the window opens (sync: at the verdict, when the bet won) - so consecutive won steps cost
max(draft, lap) instead of draft + lap. A lost bet discards the held block (drafter work
wasted, no pipe work) and the drafter drafts from the correction; a draft in progress is never
aborted. first_stage: released blocks enter S0's mailbox (S0 computes only); last_stage: they
ride the return hop as the verdict + drafts message.

Per-round hybrid (``schedule.hybrid_confident_fraction`` p; the rule and its model decisions:
:mod:`wansim.speculation.hybrid_rounds`). Wherever drafting restarts from a verified token with nothing
of the request in flight (after the prefill, a lost bet or a tree round's verdict) S0 draws the
next round's kind from the request's own stream (seed, request id, 1): confident (probability
p) rounds issue chain blocks as above until a bet is lost; the others are one
:class:`TreeBlock` (the tree ``speculation.tree``: N + 1 tokens, S0's tree drafting cost, the
mask on the forward hops, the tree's verdict on the return hop) whose accepted length is drawn
from the tree's survival for the request (stream: seed, request id, 2), and nothing else of the
request is issued until its verdict. Bets are counted for chain blocks only.

Wasted work is counted in stage-tokens: a stale block of n tokens computed by s stages wastes
s x n (``cancelled_stage_tokens``); a block dropped before any stage started it wastes none.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from wansim.acceptance.trees import sample_survival
from wansim.sim.messages import VERIFY, Pass
from wansim.speculation.block_schedule import flushes
from wansim.speculation.hybrid_rounds import confident, round_draws

QUEUED = object()  # RequestState.drafting while the request waits for the drafter device
VERDICT = 2  # control messages: ``kind`` values after PREFILL, VERIFY
CANCEL = 3
BET_DRAWS = 256


class Block(Pass):
    """A verify pass of the block schedule: a ``step`` and an ``epoch``; ``computed`` counts
    the stages that computed it (for wasted work); ``bet``: drafted while an earlier block of
    the request was in flight (from its drafts and the guess: one more drafter pass,
    :func:`wansim.speculation.block_schedule.bet_draft_ms`)."""

    __slots__ = ("bet", "computed", "epoch")

    def __init__(self, request, step: int, n: int, epoch: int, bet: bool = False):
        super().__init__(request, VERIFY, step, n)
        self.epoch = epoch
        self.computed = 0
        self.bet = bet


class TreeBlock(Block):
    """A tree round's verify pass (per-round hybrid): N + 1 tokens, one round alone."""

    __slots__ = ()
    tree = True


class Verdict:
    """Last stage -> S0: the verdict of block ``step`` (``won``: the bet on it won; ``tree``:
    a tree round's verdict)."""

    __slots__ = ("committed", "epoch", "gen", "request", "step", "tree", "won")
    kind = VERDICT
    n = 0

    def __init__(self, request, step: int, committed: int, won: bool, epoch: int, tree=False):
        self.request = request
        self.gen = request.gen  # lost with the ring in a failure (wansim.sim.faults)
        self.step = step
        self.committed = committed
        self.won = won
        self.epoch = epoch
        self.tree = tree

    def label(self) -> str:
        return f"r{self.request.rid} verdict {self.step}"


class Cancel:
    """S0 -> S1 -> ... -> S(P-2): drop the request's blocks of epochs before ``epoch``."""

    __slots__ = ("epoch", "gen", "request")
    kind = CANCEL
    n = 0

    def __init__(self, request, epoch: int):
        self.request = request
        self.gen = request.gen
        self.epoch = epoch

    def label(self) -> str:
        return f"r{self.request.rid} cancel before epoch {self.epoch}"


CHAIN_ROUND = 1  # RequestState.round values (per-round hybrid)
TREE_ROUND = 2


@dataclasses.dataclass(frozen=True)
class TreeRounds:
    """The per-round hybrid's tree rounds: ``p`` (confident fraction), the tree's tokens per
    pass, its accepted-length survival per request (commit rule applied), its verdict's bytes,
    and its depth and nodes (S0's drafting cost, the mask)."""

    p: float
    tokens: int
    survival: np.ndarray
    return_bytes: float
    depth: int
    nodes: int


class RequestState:
    """One request's block bookkeeping (truth at the last stage, knowledge at the drafter)."""

    __slots__ = (
        "bet_i",
        "bet_rng",
        "bets",
        "committed_known",
        "down",
        "drafting",
        "epoch",
        "forwarded_step",
        "held",
        "inflight",
        "known_epoch",
        "next_step",
        "p_guess",
        "pending",
        "round",
        "round_draws",
        "round_rng",
        "tree_draws",
        "tree_rng",
    )

    def __init__(self, p_guess: float, bet_rng: np.random.Generator):
        self.epoch = 0  # the truth (the last stage decides)
        self.known_epoch = 0  # what the drafter's side (S0 or the last stage) knows
        self.committed_known = 0
        self.inflight = 0  # blocks released into the pipe, verdict not yet known
        self.next_step = 1
        self.pending = None  # async without overlap: the block waiting in S0's mailbox
        self.held = None  # overlap: the block drafted ahead, waiting for the window
        self.drafting = None  # overlap: the block on the drafter device
        self.forwarded_step = 0  # the last step S0 forwarded in the known epoch
        self.down = False  # lost in a failure: nothing issued until its re-prefill's verdict
        self.p_guess = p_guess
        self.bet_rng = bet_rng
        self.bets: list[float] = []
        self.bet_i = 0
        self.round = None  # hybrid: the round in progress (None: the next issue draws one)
        self.round_draws: list[float] = []
        self.round_rng = None
        self.tree_draws: list[int] = []
        self.tree_rng = None


class Scheduler:
    """The block schedule of one run (module docstring)."""

    __slots__ = (
        "batching",
        "bet_draft_ms",
        "bet_seed",
        "bets_lost",
        "bets_won",
        "cancel_bytes",
        "cancel_messages",
        "cancelled_blocks",
        "cancelled_stage_tokens",
        "confident_rounds",
        "draft_ms",
        "draft_queue",
        "drafter_busy",
        "drafter_busy_ms",
        "drafter_passes",
        "drafter_wasted_blocks",
        "dropped_unstarted",
        "env",
        "faults",
        "first_stage",
        "flush",
        "full",
        "k",
        "last",
        "n_stages",
        "outbox",
        "overlap",
        "p_guess",
        "stage_epochs",
        "stages",
        "states",
        "tokens",
        "tree_round_count",
        "tree_rounds",
        "verifier",
        "window",
    )

    def __init__(
        self,
        env,
        scenario,
        verifier,
        stages,
        *,
        p_guess: np.ndarray,
        bet_seed: np.random.SeedSequence,
        draft_ms: float,
        bet_draft_ms: float,
        cancel_bytes: float,
        tree_rounds: TreeRounds | None = None,
        faults: bool = False,
    ):
        self.env = env
        self.faults = faults  # failures renew requests' generations (wansim.sim.faults)
        self.verifier = verifier
        self.stages = stages
        self.n_stages = len(stages)
        self.last = self.n_stages - 1
        self.window = int(scenario.schedule.max_inflight_blocks)
        self.overlap = bool(scenario.drafter.overlap)
        self.first_stage = scenario.drafter.placement == "first_stage"
        self.k = int(scenario.k)
        self.tokens = self.k + 1
        # flush_on_full_acceptance: the verifier draws committed - 1 (0 or K - 1: commit
        # survival), the bet wins on K - 1; stale blocks go on to the last stage, no Cancel
        self.flush = flushes(scenario)
        self.full = self.k - 1 if self.flush else self.k
        self.draft_ms = float(draft_ms)
        self.bet_draft_ms = float(bet_draft_ms)  # a block drafted on a bet (the guess first)
        self.cancel_bytes = float(cancel_bytes)
        self.p_guess = np.asarray(p_guess, dtype=float)
        if self.flush:  # no guess: the bet is the K drafts alone (wansim.acceptance.bet)
            self.p_guess = np.ones_like(self.p_guess)
        self.bet_seed = bet_seed
        self.states: dict[int, RequestState] = {}
        # what intermediate stages have learned from cancellation messages: rid -> epoch
        self.stage_epochs: list[dict[int, int]] = [{} for _ in stages]
        self.batching = scenario.schedule.batching == "continuous"
        self.draft_queue: deque = deque()
        self.outbox: list[Block] = []  # blocks released in this instant (see _flush)
        self.drafter_busy = False
        # totals
        self.cancelled_blocks = 0
        self.cancelled_stage_tokens = 0
        self.dropped_unstarted = 0  # cancelled blocks no stage had started
        self.cancel_messages = 0
        self.bets_won = 0
        self.bets_lost = 0
        self.drafter_busy_ms = 0.0
        self.drafter_passes = 0
        self.drafter_wasted_blocks = 0  # drafted ahead, then discarded by a lost bet
        self.tree_rounds = tree_rounds  # the per-round hybrid, None when off
        self.confident_rounds = 0
        self.tree_round_count = 0

    # ------------------------------------------------------------------------- requests
    def prepare(self, req) -> None:
        ss = np.random.SeedSequence(
            entropy=self.bet_seed.entropy, spawn_key=(*self.bet_seed.spawn_key, req.rid)
        )
        p = float(self.p_guess[req.rid]) if self.k else 0.0
        st = self.states[req.rid] = RequestState(p, np.random.default_rng(ss))
        if self.tree_rounds is not None:
            key = (*self.bet_seed.spawn_key, req.rid)
            st.round_rng = np.random.default_rng(
                np.random.SeedSequence(self.bet_seed.entropy, spawn_key=(*key, 1))
            )
            st.tree_rng = np.random.default_rng(
                np.random.SeedSequence(self.bet_seed.entropy, spawn_key=(*key, 2))
            )

    def _next_round(self, st: RequestState) -> int:
        """Draw the kind of the round that starts now (wansim.speculation.hybrid_rounds.confident)."""
        if not st.round_draws:
            st.round_draws = round_draws(st.round_rng, BET_DRAWS)[::-1]
        u = st.round_draws.pop()
        return CHAIN_ROUND if confident(u, self.tree_rounds.p) else TREE_ROUND

    def _tree_accepted(self, st: RequestState, rid: int) -> int:
        """The accepted length of the request's next tree round (its own stream)."""
        if not st.tree_draws:
            surv = self.tree_rounds.survival[rid : rid + 1]
            st.tree_draws = sample_survival(st.tree_rng, surv, BET_DRAWS)[0].tolist()[::-1]
        return int(st.tree_draws.pop())

    def _bet(self, st: RequestState, accepted: int) -> bool:
        """Did the bet on the block just verified win (all K drafts and the guess accepted)?
        One uniform per verified block from the request's own stream."""
        if st.bet_i >= len(st.bets):
            st.bets = st.bet_rng.random(BET_DRAWS).tolist()
            st.bet_i = 0
        u = st.bets[st.bet_i]
        st.bet_i += 1
        return accepted == self.full and u < st.p_guess

    def _room(self, st: RequestState, req) -> bool:
        """Could the request still need a block beyond those already drafted or in flight?"""
        ahead = st.inflight + (st.pending is not None) + (st.held is not None)
        ahead += st.drafting is not None
        return st.committed_known + self.tokens * ahead < req.decode_tokens

    # ------------------------------------------------------------------------- link deliveries
    def deliver(self, index: int):
        """The delivery callback of the link into stage ``index``."""
        stage = self.stages[index]
        receive = stage.receive

        def deliver(message: list) -> None:
            if self.faults and not all(m.gen == m.request.gen for m in message):
                message = [m for m in message if m.gen == m.request.gen]  # lost in a failure
                if not message:
                    return
            head = message[0]
            if head.kind == VERDICT:
                for v in message:
                    self._verdict_at_drafter(v)
                self._flush()
            elif head.kind == CANCEL:
                self._cancel_at(index, head)
            else:
                receive(message)

        return deliver

    # ------------------------------------------------------------------------- stage hooks
    def _stale_at(self, index: int, block: Block) -> bool:
        if index == self.last:  # (flush: computed, then dropped at the verdict)
            return not self.flush and block.epoch < self.states[block.request.rid].epoch
        if index == 0 and self.first_stage:
            return block.epoch < self.states[block.request.rid].known_epoch
        return block.epoch < self.stage_epochs[index].get(block.request.rid, 0)

    def _cancelled(self, block: Block) -> None:
        self.cancelled_blocks += 1
        self.cancelled_stage_tokens += block.computed * block.n
        if block.computed == 0:
            self.dropped_unstarted += 1

    def take(self, index: int, batch: list) -> list:
        """A stage is about to compute ``batch``: drop the blocks it knows are cancelled."""
        if len(batch) == 1 and index != 0:  # the common case, without building lists
            p = batch[0]
            if p.kind != VERIFY or not self._stale_at(index, p):
                return batch
            self._cancelled(p)
            return []
        keep = []
        for p in batch:
            if p.kind != VERIFY:
                keep.append(p)
                continue
            if index == 0:
                st = self.states[p.request.rid]
                if st.pending is p:
                    st.pending = None
            if self._stale_at(index, p):
                self._cancelled(p)
                continue
            keep.append(p)
        return keep

    def done(self, index: int, batch: list) -> list:
        """A stage computed ``batch``: count the work, drop what it learned is cancelled in the
        meantime (not forwarded), and at S0 issue the requests' next blocks."""
        if len(batch) == 1 and index != 0:  # the common case, without building lists
            p = batch[0]
            if p.kind != VERIFY:
                return batch
            p.computed += 1
            if index == self.last or not self._stale_at(index, p):
                return batch
            self._cancelled(p)
            return []
        keep = []
        issue = []
        for p in batch:
            if p.kind != VERIFY:
                keep.append(p)
                continue
            p.computed += 1
            if index != self.last and self._stale_at(index, p):
                self._cancelled(p)
                continue
            keep.append(p)
            if index == 0 and self.first_stage and p.gen == p.request.gen:
                st = self.states[p.request.rid]
                st.forwarded_step = p.step
                issue.append(p.request)
        for req in issue:
            self._issue(req)
        self._flush()
        return keep

    # ------------------------------------------------------------------------- last stage
    def verdicts(self, stage, batch: list) -> None:
        """The last stage verifies ``batch`` (first tokens and blocks) and answers."""
        now = self.env._now
        verifier = self.verifier
        source = stage.source
        answers = []
        for p in batch:
            req = p.request
            if p.gen != req.gen:  # lost in a failure while computed (wansim.sim.faults)
                continue
            st = self.states[req.rid]
            if p.kind != VERIFY:  # prefill: the first token (a re-prefill keeps both clocks)
                if req.first_token_ms != req.first_token_ms:
                    req.first_token_ms = now
                    req.last_verify_ms = now
                st.down = False
                if req.committed >= req.decode_tokens:
                    source.finished(req)
                elif self.first_stage:
                    answers.append(Verdict(req, 0, 0, True, st.epoch))
                else:
                    self._restart(req, st)
                continue
            if p.epoch < st.epoch:  # cancelled by a verdict earlier in this batch
                self._cancelled(p)
                continue
            if p.tree:  # a tree round: its own accepted length, no bet; the round ends
                committed = verifier.verify_drawn(p, now, self._tree_accepted(st, req.rid))
                req.laps_ms.append(now - req.last_verify_ms)
                req.last_verify_ms = now
                if req.committed >= req.decode_tokens:
                    source.finished(req)
                    continue
                answers.append(Verdict(req, p.step, committed, False, st.epoch, True))
                continue
            committed = verifier.verify(p, now)
            req.laps_ms.append(now - req.last_verify_ms)
            req.last_verify_ms = now
            won = self._bet(st, req.accepted[req.accepted_i - 1])
            if won:
                self.bets_won += 1
            else:
                self.bets_lost += 1
                st.epoch += 1
            if req.committed >= req.decode_tokens:
                source.finished(req)
                continue
            if self.first_stage:
                answers.append(Verdict(req, p.step, committed, won, st.epoch))
            else:  # the drafter is here (last_stage + overlap): it hears the verdict now
                self._verdict_known(req, st, p.step, committed, won, st.epoch)
        if answers:
            size = stage.return_bytes * len(answers)
            if self.tree_rounds is not None:
                tree = self.tree_rounds.return_bytes
                size = sum(tree if a.tree else stage.return_bytes for a in answers)
            stage.link_out.send(answers, size, 1.0)
        self._flush()

    # ------------------------------------------------------------------------- the drafter side
    def _verdict_at_drafter(self, v: Verdict) -> None:
        """A verdict reaches S0 (first_stage)."""
        req = v.request
        st = self.states[req.rid]
        if v.step == 0:  # after prefill: the first block
            self._issue(req)
            return
        self._verdict_known(req, st, v.step, v.committed, v.won, v.epoch)

    def _verdict_known(self, req, st: RequestState, step, committed, won, epoch) -> None:
        st.committed_known += committed
        st.inflight -= 1
        if not won:
            self._lost(req, st, step, epoch)
        self._issue(req)

    def _lost(self, req, st: RequestState, step: int, epoch: int) -> None:
        """The bet on block ``step`` lost: every later block of the request is cancelled."""
        st.known_epoch = epoch
        st.inflight = 0
        st.next_step = step + 1
        st.round = None  # (hybrid) the next issue starts a new round
        if st.pending is not None:  # waiting in S0's mailbox, not started
            self.stages[0].mailbox.remove(st.pending)
            self._cancelled(st.pending)
            st.pending = None
        if st.held is not None:  # drafted ahead, never released: drafter work only
            self.drafter_wasted_blocks += 1
            st.held = None
        if self.first_stage:
            # S0 also holds any other stale block of the request that waits in its mailbox
            mailbox = self.stages[0].mailbox
            stale = [p for p in mailbox if p.kind == VERIFY and p.request is req]
            for p in stale:
                mailbox.remove(p)
                self._cancelled(p)
            if st.forwarded_step > step and self.n_stages > 2 and not self.flush:
                self.cancel_messages += 1
                self.stages[0].link_out.send([Cancel(req, epoch)], self.cancel_bytes, 1.0)
            st.forwarded_step = step

    def _cancel_at(self, index: int, c: Cancel) -> None:
        """A cancellation reaches intermediate stage ``index``: drop, remember, pass it on."""
        rid = c.request.rid
        known = self.stage_epochs[index]
        if c.epoch > known.get(rid, 0):
            known[rid] = c.epoch
        stage = self.stages[index]
        mailbox = stage.mailbox
        stale = [
            p for p in mailbox if p.kind == VERIFY and p.request is c.request and p.epoch < c.epoch
        ]
        for p in stale:
            mailbox.remove(p)
            self._cancelled(p)
        if index + 1 < self.last:
            self.cancel_messages += 1
            stage.link_out.send([c], self.cancel_bytes, 1.0)

    def lost_in_failure(self, req) -> None:
        """A failure lost everything of the request in the ring (:mod:`wansim.sim.faults`: its
        generation is renewed, its passes and messages are dropped where next handled): it
        issues nothing until its re-prefill's first token (failover) or at all (fail). A new
        epoch discards what the drafter device is drafting for it; no bet or acceptance draw
        is consumed, so its committed sequence is unchanged."""
        st = self.states[req.rid]
        st.down = True
        st.committed_known = req.committed  # what the re-prefill carries
        st.epoch += 1
        st.known_epoch = st.epoch
        st.inflight = 0
        st.pending = None  # (the failure emptied S0's mailbox of it)
        if st.held is not None:
            self.drafter_wasted_blocks += 1
            st.held = None
        st.forwarded_step = 0
        st.round = None

    def _issue(self, req) -> None:
        """Put the request's next block on its way if the window and the request allow."""
        st = self.states[req.rid]
        if req.finish_ms == req.finish_ms or st.down:  # finished, or waiting for a re-prefill
            return
        if self.overlap:
            self._release(req, st)
            self._draft(req, st)
            return
        if st.pending is not None or st.inflight >= self.window or not self._room(st, req):
            return
        if self.tree_rounds is not None:
            if st.round is None:  # a round starts: nothing of the request is in flight
                st.round = self._next_round(st)
                if st.round == TREE_ROUND:
                    self.tree_round_count += 1
                    tokens = self.tree_rounds.tokens
                    block = TreeBlock(req, st.next_step, tokens, st.known_epoch)
                    st.next_step += 1
                    st.inflight += 1
                    st.pending = block
                    self.stages[0].receive([block])
                    return
                self.confident_rounds += 1
            elif st.round == TREE_ROUND:  # one tree pass per round: wait for its verdict
                return
        block = Block(req, st.next_step, self.tokens, st.known_epoch, st.inflight > 0)
        st.next_step += 1
        st.inflight += 1
        st.pending = block
        self.stages[0].receive([block])

    def _restart(self, req, st: RequestState) -> None:
        """last_stage + overlap after prefill: draft the first block."""
        self._draft(req, st)

    # overlap: the drafter device ------------------------------------------------------------
    def _draft(self, req, st: RequestState) -> None:
        """Queue the request's next block for the drafter device (one ahead at most)."""
        if st.drafting is not None or st.held is not None or st.down or not self._room(st, req):
            return
        st.drafting = QUEUED
        self.draft_queue.append(req)
        if not self.drafter_busy:  # start at the end of this instant: requests whose verdicts
            self.drafter_busy = True  # arrive together are drafted together
            self.env.call(0, self._start_pass)

    def _start_pass(self, _event=None) -> None:
        self.drafter_busy = False
        self._draft_pass()

    def _draft_pass(self) -> None:
        """The drafter device starts a pass: every queued request with continuous batching
        (one drafter pass drafts the batch, as at a stage), else the oldest one. The blocks
        are made now, from what the drafter knows now."""
        queue = self.draft_queue
        take = len(queue) if self.batching else 1
        blocks = []
        for _ in range(take):
            req = queue.popleft()
            st = self.states[req.rid]
            st.drafting = None
            if st.held is not None or st.down or not self._room(st, req):
                continue
            block = Block(req, st.next_step, self.tokens, st.known_epoch, st.inflight > 0)
            st.next_step += 1
            st.drafting = block
            blocks.append(block)
        if not blocks:
            if queue:
                self._draft_pass()
            return
        self.drafter_busy = True
        ms = self.bet_draft_ms if any(b.bet for b in blocks) else self.draft_ms
        self.drafter_busy_ms += ms
        self.drafter_passes += 1
        self.env.call(ms, lambda _e: self._drafted_pass(blocks))

    def _drafted_pass(self, blocks: list) -> None:
        self.drafter_busy = False
        for block in blocks:
            self._drafted(block)
        self._flush()
        if self.draft_queue and not self.drafter_busy:
            self._draft_pass()

    def _drafted(self, block: Block) -> None:
        req = block.request
        st = self.states[req.rid]
        st.drafting = None
        if block.epoch < st.known_epoch:  # a lost bet while it was drafted: discard
            self.drafter_wasted_blocks += 1
            self._draft(req, st)
            return
        st.held = block
        self._release(req, st)

    def _release(self, req, st: RequestState) -> None:
        """Send the held block into the pipe when the window has room; then draft ahead."""
        block = st.held
        if block is None or st.inflight >= self.window or st.down:
            return
        st.held = None
        st.inflight += 1
        self.outbox.append(block)
        self._draft(req, st)

    def _flush(self) -> None:
        """Released blocks leave together (one message, as a stage's batch would)."""
        if not self.outbox:
            return
        blocks, self.outbox = self.outbox, []
        if self.first_stage:
            self.stages[0].receive(blocks)
        else:
            last = self.stages[self.last]
            last.link_out.send(blocks, last.return_bytes * len(blocks), 1.0)


def guess_rates(policy, rng_difficulty: np.random.Generator, n_requests: int) -> np.ndarray:
    """p_{K+1} of every request: its rate at the position after the K drafts, from the same
    difficulty draw the verifier makes (pass a copy of the difficulty stream in the state the
    verifier receives it). Beyond the measured positions the last measured rate is held."""
    from wansim.acceptance.bet import guess_acceptance

    acc = policy.acceptance
    k = policy.depth
    if acc is None or k == 0:
        return np.zeros(n_requests)
    rates = guess_acceptance(acc).request_rates(rng_difficulty, n_requests, k + 1)
    return np.asarray(rates[:, k, 0], dtype=float)

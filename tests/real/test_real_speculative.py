"""Verification rules and KV rollback, in process (fast): losslessness, greedy equality."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from real_helpers import CTX, check_first_two, chi2_pvalue, target_first_two  # noqa: E402

from wansim.real.config import split_layers  # noqa: E402
from wansim.real.model import StageShard  # noqa: E402
from wansim.real.speculative import (  # noqa: E402
    Drafter,
    plain_decode,
    prompt_generators,
    speculative_decode,
    verify,
    verify_lossless,
)

pytestmark = pytest.mark.real


def test_verify_lossless_reproduces_target_on_synthetic_distributions():
    """Two drafts from q, verified against p: committed token 1 ~ p_1, token 2 | token 1 ~ p_2."""
    gen = torch.Generator().manual_seed(0)
    rng = torch.Generator().manual_seed(1)
    logits = torch.tensor(
        [[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 0.3, 1.5, -0.5, 0.2], [1.0, 1.0, 0.0, 0.0, 0.0]]
    )
    p = torch.softmax(logits.double(), -1)
    q = torch.softmax(torch.tensor([[0.0, 2.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 2.0, 0.0]]), -1)
    first = np.zeros(5)
    second_given_0 = np.zeros(5)  # token 2 when token 1 == 0 and draft 1 was accepted
    n = 8000
    for _ in range(n):
        d = [int(torch.multinomial(q[i], 1, generator=rng)) for i in range(2)]
        v = verify_lossless(logits, d, q, 1.0, gen)
        committed = [*d[: v.accepted], v.next_token]
        first[committed[0]] += 1
        if len(committed) >= 2 and committed[0] == 0:
            second_given_0[committed[1]] += 1
    assert chi2_pvalue(first, p[0].numpy()) > 1e-3
    assert chi2_pvalue(second_given_0, p[1].numpy()) > 1e-3
    # power check: the drafter's own distribution is rejected by the same test
    assert chi2_pvalue(first, q[0].double().numpy()) < 1e-6


def test_greedy_verifier_accepts_matching_prefix():
    logits = torch.full((4, 6), -5.0)
    for i, t in enumerate([3, 1, 4, 2]):
        logits[i, t] = 5.0
    g = torch.Generator()
    assert verify(logits, [3, 1, 0], None, "greedy", 0.0, g).__dict__ == {
        "accepted": 2,
        "next_token": 4,
    }
    assert verify(logits, [3, 1, 4], None, "greedy", 0.0, g).__dict__ == {
        "accepted": 3,
        "next_token": 2,
    }
    assert verify(logits, [0, 1, 4], None, "greedy", 0.0, g).__dict__ == {
        "accepted": 0,
        "next_token": 3,
    }


@pytest.fixture(scope="module")
def models(tiny_models):
    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    return load_lm(target_dir), load_lm(drafter_dir, field="drafter_dir")


def test_kv_rollback_matches_fresh_computation(tiny_models):
    """Stages that ran rejected positions and cropped them give the logits of a clean run."""
    target_dir, _, load_lm = tiny_models
    ids = torch.tensor(list(b"def rollback(self, n):\n    return self.cache[:n]\n"))
    full = load_lm(target_dir)
    with torch.no_grad():
        ref = full(input_ids=ids[None]).logits[0]
    shards = [StageShard(load_lm(target_dir), lo, hi) for lo, hi in split_layers(6, 3)]

    def run(x, pos):
        for s in shards:
            x = s.forward(x, pos)
        return x

    run(ids[:30], 0)
    run(torch.tensor([7, 7, 7, 7, 7]), 30)  # 5 "drafts", all rejected
    assert [s.cache_len for s in shards] == [35, 35, 35]
    run(torch.tensor([9, 9]), 31)  # rolls back 4 of them, writes 2 more wrong ones
    assert [s.cache_len for s in shards] == [33, 33, 33]
    out = run(ids[30:], 30)  # rollback to 30, then the true continuation
    assert [s.cache_len for s in shards] == [len(ids)] * 3
    torch.testing.assert_close(out, ref[30:], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="KV cache holds"):
        shards[0].forward(ids[:2], len(ids) + 3)


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_greedy_speculative_equals_plain_greedy(models, code_prompts, noise):
    target, drafter_model = models
    if noise:
        import copy

        from wansim.real.model import add_weight_noise

        drafter_model = copy.deepcopy(drafter_model)
        add_weight_noise(drafter_model, noise, seed=1)
    drafter = Drafter(drafter_model)
    accepted_all = []
    for prompt in code_prompts:
        ref = plain_decode(target, list(prompt.tokens), 40)
        out, accepted = speculative_decode(target, drafter, list(prompt.tokens), 40, k=4)
        assert out == ref
        accepted_all += accepted
    mean = np.mean(accepted_all) / 4
    assert 0.05 < mean < 0.98  # a real drafter: neither always right nor always wrong


@pytest.mark.parametrize("n", [pytest.param(600), pytest.param(5000, marks=pytest.mark.slow)])
def test_lossless_first_step_matches_target_distribution(models, n):
    """Chi-square: tokens committed after a fixed context by lossless speculative sampling
    (K=3, T=1; both come out of verify passes) follow the target's own distribution: the first
    committed token's marginal and the joint of the first two."""
    target, drafter_model = models
    p1, p2, q1 = target_first_two(target, drafter_model)
    shard = StageShard(target, 0, 6)
    drafter = Drafter(drafter_model)
    shard.forward(torch.tensor(CTX[:-1]), 0)
    first = np.zeros(256)
    joint = np.zeros((256, 256))
    for s in range(n):
        dgen, vgen = prompt_generators(s, 0)
        committed = list(CTX)
        while len(committed) < len(CTX) + 2:
            drafts, q = drafter.draft(committed, 3, 1.0, dgen)
            logits = shard.forward(torch.tensor([committed[-1], *drafts]), len(committed) - 1)
            v = verify(logits, drafts, q, "lossless", 1.0, vgen)
            committed += [*drafts[: v.accepted], v.next_token]
        t1, t2 = committed[len(CTX)], committed[len(CTX) + 1]
        first[t1] += 1
        joint[t1, t2] += 1
    check_first_two(first, joint, p1, p2, q1)

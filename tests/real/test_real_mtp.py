"""The MTP-like head at the last stage: greedy equality, losslessness, acceptance, recording,
bad options and deterministic training (the committed head in ``models/tiny-mtp``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from real_helpers import CTX, chi2_pvalue  # noqa: E402

from wansim.real.config import DecodeSpec, PipelineSpec  # noqa: E402
from wansim.real.errors import RealConfigError  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402
from wansim.real.speculative import plain_decode, prompt_generators, verify  # noqa: E402

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "tiny-target"
MTP = ROOT / "models" / "tiny-mtp"
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"


@pytest.fixture(scope="module")
def local():
    from wansim.real.model import load_lm
    from wansim.real.mtp import load_mtp

    assert (MTP / "mtp.safetensors").is_file(), f"missing checkpoint {MTP}"
    torch.set_num_threads(1)
    target = load_lm(TARGET)
    return target, load_mtp(MTP, target)


def mtp_spec(stages: int, **kw) -> PipelineSpec:
    return PipelineSpec(
        target_dir=str(TARGET), stages=stages, drafter_kind="mtp", mtp_dir=str(MTP), **kw
    )


@pytest.mark.parametrize("stages", [2, 3])
def test_mtp_pipeline_greedy_equals_plain_greedy(stages, local, code_prompts, tmp_path):
    """Drafts made at the last stage ride the verdict back; stage 0 drafts nothing. Greedy
    output equals plain greedy decoding; the timing records say where drafting happened."""
    target, _ = local
    prompts = code_prompts[:2]
    with Pipeline(mtp_spec(stages), tmp_path) as pipe:
        res = pipe.generate(prompts, DecodeSpec(k=4, max_new_tokens=32), name="greedy")
    for p in prompts:
        assert res.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 32)
    acc = res.trace["accepted"].to_numpy()
    assert 0 < acc.mean() < 4  # a real head: sometimes right, sometimes wrong
    last = stages - 1
    assert (res.steps["draft_stage"] == last).all()
    assert (res.steps["draft_ms"] > 0).all()  # the last stage's draft time, joined per step
    raw = {i: pd.read_csv(tmp_path / "raw" / f"stage{i}.csv") for i in range(stages)}
    assert (raw[last]["draft_ms"] > 0).all()  # every verify (and prefill) pass drafted
    assert (raw[0]["draft_ms"] == 0).all()  # stage 0 drafted nothing
    ct = res.compute_table
    assert (ct[ct["stage"] == "drafter"]["median_ms"] > 0).all()
    # return hop: verdict (56 + 8 bytes) + 4 draft ids (56 + 16 bytes) per pass
    assert res.links.loc[last, "bytes_per_pass_mean"] == pytest.approx(2 * 56 + 8 + 16)
    assert res.summary["meta"]["drafter_placement"] == "last_stage"
    util = res.summary["stage_utilization"]
    assert len(util) == stages and all(u > 0 for u in util)


def test_mtp_lossless_pipeline_equals_reference_and_trace_is_a_profile(
    local, code_prompts, tmp_path, run_cli
):
    """Same algorithm and random streams as :func:`mtp_speculative_decode` (whose distribution
    is checked below): the staged run draws the same tokens. Its trace fits a profile that
    ``wansim run`` accepts with ``drafter.placement: last_stage``."""
    from wansim.real.mtp import mtp_speculative_decode

    target, head = local
    decode = DecodeSpec(k=3, verifier="lossless", temperature=1.0, max_new_tokens=24, seed=11)
    with Pipeline(mtp_spec(2), tmp_path) as pipe:
        res = pipe.generate(code_prompts, decode, name="lossless")
    for j, p in enumerate(code_prompts):
        ref, accepted = mtp_speculative_decode(
            target, head, list(p.tokens), 24, 3, "lossless", 1.0, seed=11, prompt_index=j
        )
        assert res.outputs[p.prompt_id] == ref
        assert res.trace[res.trace["prompt_id"] == p.prompt_id]["accepted"].tolist() == accepted
    # the return hop carries the drafts' distributions too: 3 x 256 float32
    assert res.links.loc[1, "bytes_per_pass_mean"] > 3 * 256 * 4
    fitted = tmp_path / "fitted.yaml"
    code, _, err = run_cli("traces", "fit", res.paths["trace"], "--out", fitted)
    assert code == 0, err
    for profile in (fitted, res.paths["profile"]):
        code, out, err = run_cli(
            "run",
            REFERENCE,
            "--engine", "analytical",
            "--json",
            "--set", f"drafter.acceptance.profile={profile}",
            "--set", "drafter.acceptance.workload=code",
            "--set", "drafter.placement=last_stage",
            "--set", "drafter.kind=mtp",
            "--set", "speculation.k=3",
            "--set", "speculation.verifier=lossless",
        )  # fmt: skip
        assert code == 0, err
        tau = json.loads(out)["metrics"]["tau"]
        assert 1.0 < tau <= 4.0


def _first_two_with_head(target, head):
    """Exact p(t1 | ctx), p(t2 | ctx, t1) and the head's q(t2 | ctx, t1) for every t1."""
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([CTX]))
        p1 = torch.softmax(target.lm_head(out.last_hidden_state[0, -1]).double(), -1)
        batch = torch.tensor([[*CTX, t] for t in range(256)])
        p2 = torch.softmax(target(input_ids=batch).logits[:, -1].double(), -1)
        h = out.last_hidden_state[0, -1].expand(256, -1)
        g = head.head(h, head.embed(torch.arange(256)))
        q2 = torch.softmax(head.logits(g).double(), -1)
    return p1.numpy(), p2.numpy(), q2.numpy()


@pytest.mark.parametrize("n", [pytest.param(800), pytest.param(6000, marks=pytest.mark.slow)])
def test_mtp_lossless_first_steps_match_target_distribution(local, n):
    """Chi-square: t1 (prefill) and t2 (the first verify pass, K=3 head drafts at T=1) follow the
    target's joint distribution p(t1) p(t2 | t1), not the head's p(t1) q(t2 | t1)."""
    from wansim.real.model import StageShard

    target, head = local
    p1, p2, q2 = _first_two_with_head(target, head)
    shard = StageShard(target, 0, len(target.model.layers))
    shard.forward(torch.tensor(CTX), 0)
    h_ctx = shard.hidden[-1].clone()
    logits_ctx = torch.from_numpy(np.log(p1))
    joint = np.zeros((256, 256))
    for s in range(n):
        dgen, vgen = prompt_generators(s, 0)
        t1 = int(torch.multinomial(torch.softmax(logits_ctx, -1), 1, generator=vgen))
        drafts, q = head.draft(h_ctx, t1, 3, 1.0, dgen)
        logits = shard.forward(torch.tensor([t1, *drafts]), len(CTX))
        v = verify(logits, drafts, q, "lossless", 1.0, vgen)
        t2 = drafts[0] if v.accepted >= 1 else v.next_token
        joint[t1, t2] += 1
    target_joint = p1[:, None] * p2
    assert chi2_pvalue(joint.sum(axis=1), p1) > 1e-3
    assert chi2_pvalue(joint.sum(axis=0), target_joint.sum(axis=0)) > 1e-3
    assert chi2_pvalue(joint.ravel(), target_joint.ravel()) > 1e-3
    if n >= 5000:  # power: the same test tells the head's own distribution apart
        assert chi2_pvalue(joint.ravel(), (p1[:, None] * q2).ravel()) < 1e-6


def test_mtp_acceptance_of_committed_head_is_sane(local, code_prompts):
    """Greedy and T=1 acceptance of the committed head, measured here: a working head is
    neither always wrong nor always right; greedy speculative output equals plain greedy."""
    from wansim.real.mtp import mtp_speculative_decode

    target, head = local
    for verifier, temp in (("greedy", 0.0), ("lossless", 1.0)):
        accepted = []
        for j, p in enumerate(code_prompts):
            out, acc = mtp_speculative_decode(
                target, head, list(p.tokens), 40, 4, verifier, temp, seed=0, prompt_index=j
            )
            if verifier == "greedy":
                assert out == plain_decode(target, list(p.tokens), 40)
            accepted += acc
        rate = np.sum(accepted) / (4 * len(accepted))
        assert 0.05 < rate < 0.95, (verifier, rate)


def test_mtp_bad_options_one_line_errors(tmp_path):
    t = str(TARGET)
    cases = [
        (
            {"drafter_kind": "eagle"},
            r"^drafter_kind: must be one of \['draft_model', 'mtp'\], got 'eagle'$",
        ),
        ({"drafter_kind": "mtp"}, r"^mtp_dir: is needed when drafter_kind is 'mtp', got null$"),
        (
            {"drafter_kind": "mtp", "mtp_dir": "/nope"},
            r"^mtp_dir: must be an existing local MTP head directory, got '/nope'$",
        ),
        (
            {"drafter_kind": "mtp", "mtp_dir": str(tmp_path)},
            r"^mtp_dir: has no mtp_config.json \(not an MTP head checkpoint\), got '",
        ),
        ({"mtp_dir": str(MTP)}, r"^mtp_dir: is only used when drafter_kind is 'mtp', got '"),
        (
            {"drafter_kind": "mtp", "mtp_dir": str(MTP), "drafter_dir": t},
            r"^drafter_dir: must be None when drafter_kind is 'mtp' \(the head drafts at the "
            r"last stage\), got '",
        ),
    ]
    for kw, pattern in cases:
        with pytest.raises(RealConfigError, match=pattern):
            PipelineSpec(target_dir=t, **kw)
    from wansim.real.mtp import load_head

    with pytest.raises(
        RealConfigError, match=r"^mtp_dir: head hidden size must equal the target's 64, got 128$"
    ):
        load_head(MTP, hidden_size=64)


@pytest.mark.parametrize("cmd", ["acceptance", "run", "speed"])
def test_mtp_cli_bad_input_exit_2(capsys, cmd):
    from wansim.real.__main__ import main

    assert main([cmd, "--mtp", "/nope"]) == 2
    line = "error: mtp_dir: must be an existing local MTP head directory, got '/nope'"
    assert capsys.readouterr().err.strip() == line


def test_mtp_training_is_deterministic(local):
    """Two short runs with the same seed give bit-identical heads; another seed does not."""
    from wansim.real.model import load_lm
    from wansim.real.train_mtp import MTPTrainSpec, train_head

    target = load_lm(TARGET)
    text = torch.frombuffer(bytearray(CTX * 200), dtype=torch.uint8).long()
    spec = MTPTrainSpec(steps=3, batch_size=4, seq_len=32, depth=3, warmup_steps=1)

    def run(seed):
        head, info = train_head(target, text, text[:2000], spec, seed=seed)
        assert info["steps_done"] == 3
        return head.state_dict()

    a, b, c = run(0), run(0), run(1)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)

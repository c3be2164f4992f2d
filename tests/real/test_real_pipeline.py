"""The staged pipeline: real processes, real frames over loopback TCP through relay processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from wansim.real.config import DecodeSpec, PipelineSpec  # noqa: E402
from wansim.real.errors import PipelineError, RealConfigError  # noqa: E402
from wansim.real.link import LinkSpec  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402
from wansim.real.speculative import Drafter, plain_decode, speculative_decode  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def pipe2(tiny_dirs, tmp_path_factory):
    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=2)
    with Pipeline(spec, tmp_path_factory.mktemp("pipe2")) as pipe:
        yield pipe


@pytest.fixture(scope="module")
def local(tiny_models):
    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    return load_lm(target_dir), load_lm(drafter_dir, field="drafter_dir")


def test_greedy_pipeline_equals_plain_greedy(pipe2, local, code_prompts):
    target, _ = local
    res = pipe2.generate(code_prompts, DecodeSpec(k=4, max_new_tokens=32), name="greedy")
    for p in code_prompts:
        assert res.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 32)
    # the recorded trace is a real one: the drafter is sometimes right, sometimes wrong
    acc = res.trace["accepted"].to_numpy()
    assert 0 < acc.mean() < 4
    assert res.summary["tau"] == pytest.approx(1 + acc.mean())


def test_lossless_pipeline_equals_reference_sampler(pipe2, local, code_prompts):
    """Same algorithm and random streams as the in-process sampler (whose distribution is
    checked by chi-square in test_speculative): the staged run draws the same tokens."""
    target, drafter_model = local
    decode = DecodeSpec(k=3, verifier="lossless", temperature=1.0, max_new_tokens=24, seed=11)
    res = pipe2.generate(code_prompts, decode, name="lossless")
    drafter = Drafter(drafter_model)
    for j, p in enumerate(code_prompts):
        ref, accepted = speculative_decode(
            target,
            drafter,
            list(p.tokens),
            24,
            k=3,
            verifier="lossless",
            temperature=1.0,
            seed=11,
            prompt_index=j,
        )
        assert res.outputs[p.prompt_id] == ref
        steps = res.trace[res.trace["prompt_id"] == p.prompt_id]["accepted"].tolist()
        assert steps == accepted


def test_recording_files(pipe2, code_prompts):
    from wansim.acceptance.profile import load_profile
    from wansim.acceptance.trace import read_trace

    res = pipe2.generate(code_prompts[:2], DecodeSpec(k=2, max_new_tokens=16), name="rec")
    frame, meta = read_trace(res.paths["trace"])
    assert list(frame.columns[:5]) == ["workload", "prompt_id", "step", "k", "accepted"]
    assert meta["stages"] == "2" and meta["verifier"] == "greedy" and meta["k"] == "2"
    assert len(frame) == res.summary["steps"]
    prof = load_profile(res.paths["profile"])
    assert "code" in prof.workloads and len(prof.workloads["code"].per_position) == 2
    ct = res.compute_table
    assert {"0", "1", "drafter"} <= set(ct["stage"])
    assert set(ct[ct["stage"] == "1"]["n_tokens"]) >= {3}  # K + 1 tokens per verify pass
    assert (ct["median_ms"] > 0).all()
    links = res.links
    assert list(links["hop"]) == [0, 1] and links["return_hop"].tolist() == [False, True]
    # fp32 activations: 3 tokens x 128 x 4 bytes + headers on the forward hop
    assert links.loc[0, "bytes_per_pass_mean"] > 3 * 512
    s = res.summary
    # tokens/s = committed tokens / each prompt's first start to last verdict; stage 0's
    # bookkeeping between steps (which a loaded machine can stretch) only adds time, so the
    # rate is at most tau / mean lap
    steps = res.steps
    decode_s = sum(
        (g["verdict_ns"].max() - g["start_ns"].min()) / 1e9
        for _, g in steps.groupby("prompt_index")
    )
    assert s["tokens_per_s"] == pytest.approx(steps["new_tokens"].sum() / decode_s, rel=1e-12)
    assert s["tokens_per_s"] <= s["tau"] / (s["lap_ms_mean"] / 1e3) * (1 + 1e-9)
    summary = json.loads(Path(res.paths["summary"]).read_text())
    assert summary["steps"] == s["steps"]
    # every stage pass logs its thread's CPU time over the compute: positive, and no more than
    # the compute's wall time (the kernel counts CPU time in ticks of its scheduler clock, at
    # worst a jiffy late)
    from wansim.real.recording import read_raw

    raw = read_raw(pipe2.raw_dir, 2)
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    for i in (0, 1):
        rows = raw[f"stage{i}"]
        cpu, wall = rows["compute_cpu_ms"].to_numpy(float), rows["compute_ms"].to_numpy(float)
        assert len(rows) and (cpu > 0).all()
        assert (cpu <= wall + tick_ms).all(), (cpu - wall).max()
        # and over the whole pass here (decode, compute, outputs, send): at least the
        # compute's, at most the time from the frame's receipt (stage 0: the compute's start)
        # to its send
        whole = rows["pass_cpu_ms"].to_numpy(float)
        held = (rows["sent_ns"] - rows["recv_ns"]).to_numpy(float) / 1e6
        assert (whole >= cpu - 1e-3).all() and (whole <= held + tick_ms).all()
        assert whole.mean() > cpu.mean()  # decoding, encoding and sending take CPU too


def test_no_speculation_k0(pipe2, local, code_prompts):
    target, _ = local
    p = code_prompts[0]
    res = pipe2.generate([p], DecodeSpec(k=0, max_new_tokens=12), name="k0")
    assert res.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 12)
    assert res.summary["tau"] == 1.0


def test_three_stages_latency_and_quantized_wire(tiny_dirs, local, code_prompts, tmp_path):
    """P=3 with 4 ms links and 8-bit activations: every lap pays three link delays; bytes shrink."""
    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=3,
        links=(LinkSpec(latency_ms=4.0),),
        activation_bits=8,
    )
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(code_prompts[:2], DecodeSpec(k=3, max_new_tokens=24), name="p3")
    assert res.summary["lap_ms_p50"] >= 12.0
    links = res.links
    assert np.allclose(links["scheduled_ms_mean"], 4.0, atol=0.01)
    # never early (how late is the machine's load: benchmarks/bench_link_accuracy.py)
    assert (links["error_ms_p50"] > -0.05).all()
    assert (links["achieved_ms_p50"] >= 4.0).all()
    # 8-bit: 4 tokens x (128 + 2 scale) bytes + headers, vs 4 x 512 at fp32
    assert links.loc[0, "bytes_per_pass_mean"] < 4 * 512
    target, _ = local
    ref = plain_decode(target, list(code_prompts[0].tokens), 24)
    out = res.outputs[code_prompts[0].prompt_id]
    assert len(out) == 24 and sum(a == b for a, b in zip(out, ref, strict=True)) >= 6


def test_dead_stage_is_named_and_trace_kept(tiny_dirs, code_prompts, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=2,
        fail_stage_after_passes=(1, 4),
        stall_timeout_s=20,
    )
    with Pipeline(spec, tmp_path) as pipe, pytest.raises(PipelineError) as err:
        pipe.generate(code_prompts[:1], DecodeSpec(k=2, max_new_tokens=40), name="dead")
    assert err.value.stage == 1
    assert "stage 1 died" in str(err.value) and "hop 0 (stage 0 -> stage 1)" in str(err.value)
    trace = tmp_path / "dead" / "trace.csv"
    assert trace.is_file()
    rows = [line for line in trace.read_text().splitlines() if line and not line.startswith("#")]
    assert len(rows) == 1 + 3  # header + the 3 steps that completed before the crash


def test_stalled_link_is_named(tiny_dirs, code_prompts, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    links = (LinkSpec(), LinkSpec(stall_after_frames=3))
    # the timeout is what is tested; 6 s: far above a pass's time even on a loaded machine
    spec = PipelineSpec(
        target_dir=target_dir, drafter_dir=drafter_dir, stages=2, links=links, stall_timeout_s=6
    )
    with Pipeline(spec, tmp_path) as pipe, pytest.raises(PipelineError) as err:
        pipe.generate(code_prompts[:1], DecodeSpec(k=2, max_new_tokens=40), name="stall")
    msg = str(err.value)
    assert "no verdict for pass 3" in msg and "hop 1 (stage 1 -> stage 0)" in msg
    assert "stalled link" in msg and err.value.hop == 1


def test_malformed_frame_is_named(tiny_dirs, code_prompts, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    links = (LinkSpec(corrupt_frame=5), LinkSpec())
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=2, links=links)
    with Pipeline(spec, tmp_path) as pipe, pytest.raises(PipelineError) as err:
        pipe.generate(code_prompts[:1], DecodeSpec(k=2, max_new_tokens=40), name="bad")
    msg = str(err.value)
    assert "stage 1: malformed frame on hop 0 (stage 0 -> stage 1): header checksum" in msg
    assert err.value.stage == 1


def test_bad_input_one_line_errors(tiny_dirs, tmp_path):
    target_dir, drafter_dir = tiny_dirs
    with pytest.raises(
        RealConfigError,
        match=r"^target_dir: must be an existing local checkpoint directory, got '/nope'$",
    ):
        PipelineSpec(target_dir="/nope")
    with pytest.raises(RealConfigError, match=r"^drafter_dir: has no config.json"):
        PipelineSpec(target_dir=target_dir, drafter_dir=str(tmp_path))
    with pytest.raises(RealConfigError, match=r"^stages: must be an integer >= 2, got 1$"):
        PipelineSpec(target_dir=target_dir, stages=1)
    with pytest.raises(
        RealConfigError, match=r"^activation_bits: must be one of \[32, 16, 8, 4, 3\], got 2$"
    ):
        PipelineSpec(target_dir=target_dir, activation_bits=2)
    with pytest.raises(
        RealConfigError, match=r"^temperature: must be > 0 for the lossless verifier, got 0$"
    ):
        DecodeSpec(verifier="lossless")
    with pytest.raises(RealConfigError, match=r"^stages: must be <= the target's 6 layers, got 7$"):
        Pipeline(PipelineSpec(target_dir=target_dir, stages=7))
    with pytest.raises(RealConfigError, match=r"^drafter_noise: must be >= 0, got -0.1$"):
        PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, drafter_noise=-0.1)


@pytest.mark.slow
def test_lossless_pipeline_distribution_chi_square(pipe2, local):
    """Through the staged pipeline: after the prefill samples t1 ~ p(. | ctx), the first verify
    pass (K=3, T=1) commits t2; the joint (t1, t2) must follow the target's distribution."""
    from real_helpers import CTX, chi2_pvalue, target_first_two

    from wansim.real.config import Prompt

    target, drafter_model = local
    p1, p2, _ = target_first_two(target, drafter_model)
    n = 1500
    prompts = [Prompt("chi2", j, tuple(CTX)) for j in range(n)]
    res = pipe2.generate(
        prompts, DecodeSpec(k=3, verifier="lossless", temperature=1.0, max_new_tokens=2, seed=5)
    )
    joint = np.zeros((256, 256))
    for out in res.outputs.values():
        joint[out[0], out[1]] += 1
    assert chi2_pvalue(joint.sum(axis=1), p1) > 1e-3
    assert chi2_pvalue(joint.sum(axis=0), (p1[:, None] * p2).sum(axis=0)) > 1e-3
    assert chi2_pvalue(joint.ravel(), (p1[:, None] * p2).ravel()) > 1e-3


def test_heterogeneous_hops(tiny_dirs, code_prompts, tmp_path):
    """Per-hop links in the real path: each hop keeps its own latency, bandwidth and jitter, and
    draws the DES's streams for its own hop of the ring."""
    target_dir, drafter_dir = tiny_dirs
    links = (
        LinkSpec(latency_ms=2.0, bandwidth_mbps=200.0),
        LinkSpec(latency_ms=6.0, jitter_kind="lognormal", jitter_std_ms=1.0, seed=3),
        LinkSpec(latency_ms=10.0, bandwidth_mbps=50.0),
    )
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=3, links=links)
    assert [(h.hop, h.ring_stages) for h in spec.hop_links()] == [(0, 3), (1, 3), (2, 3)]
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(code_prompts[:1], DecodeSpec(k=3, max_new_tokens=16), name="het")
    sched = res.links["scheduled_ms_mean"].to_numpy()
    # hop 0: 2 ms + serialisation at 200 Mbit/s; hop 1: 6 ms + lognormal jitter of mean 1 ms;
    # return hop: 10 ms + a 64-byte verdict frame at 50 Mbit/s (0.01 ms)
    assert 2.0 < sched[0] < 2.5
    assert 6.0 < sched[1] < 9.0
    assert sched[2] == pytest.approx(10.0 + 64 * 8 / 50e3, abs=0.01)
    assert res.summary["lap_ms_p50"] >= 18.0

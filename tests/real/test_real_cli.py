"""``python -m wansim.real``: bad input is one line and exit code 2."""

from __future__ import annotations

import pytest

from wansim.real.__main__ import main

pytestmark = pytest.mark.real


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["run", "--target", "/nope"],
            "error: target_dir: must be an existing local checkpoint directory, got '/nope'",
        ),
        (["run", "--bits", "5"], "error: activation_bits: must be one of [32, 16, 8, 4, 3], got 5"),
        (["run", "--stages", "1"], "error: stages: must be an integer >= 2, got 1"),
        (
            ["run", "--verifier", "typical"],
            "error: verifier: must be one of ['greedy', 'lossless'], got 'typical'",
        ),
        (
            ["run", "--workload", "code", "--prompt-tokens", "0"],
            "error: prompt_tokens: must be in 1..4096, got 0",
        ),
        (["run", "--device", "tpu"], "error: device: must be cpu, cuda or cuda:N, got 'tpu'"),
        (
            ["run", "--tree", "static:300,2"],
            "error: tree.branching: makes 900 draft nodes; at most 256 fit one pass, got [300, 2]",
        ),
        (
            ["run", "--tree", "static:2,2", "--max-new-tokens", "1983"],
            "error: tree.depth: prompt (64) + max_new_tokens (1983) + drafts per pass (2) + 1 ="
            " 2050 positions exceed target_dir's max_position_embeddings 2048, got 2",
        ),
        (
            ["run", "--tree", "dynamic:8:3", "--verifier", "lossless", "--temperature", "1"],
            "error: tree.kind: dynamic trees need the greedy verifier (a shape chosen from the"
            " drafted tokens would bias rejection sampling); use static or sequoia, got 'dynamic'",
        ),
        (
            [
                "run",
                "--concurrency",
                "64",
                "--prompts",
                "64",
                "--max-new-tokens",
                "1000",
                "--kv-capacity-tokens",
                "20000",
            ],
            "error: concurrency: 64 request(s) in flight x (prompt 64 + max_new_tokens 1000 + 4"
            " drafted + 1) = 68416 KV positions exceed kv_capacity_tokens 20000; at most 18 fit,"
            " got 64",
        ),
        (
            [
                "run",
                "--batching",
                "continuous",
                "--concurrency",
                "8",
                "--micro-batches",
                "2",
                "--prompts",
                "8",
                "--kv-capacity-tokens",
                "1000",
            ],
            "error: concurrency: 8 request(s) in flight x (prompt 64 + max_new_tokens 64 + 4"
            " drafted + 1) = 1064 KV positions exceed kv_capacity_tokens 1000; at most 7 fit,"
            " got 8",
        ),
        (
            ["run", "--tree", "static:16,8", "--kv-capacity-tokens", "200"],
            "error: tree.budget: 1 request(s) in flight x (prompt 64 + max_new_tokens 64 + 144"
            " drafted + 1) = 273 KV positions exceed kv_capacity_tokens 200, got 144",
        ),
        (
            ["run", "--batching", "continuous", "--tree", "static:2"],
            "error: batching: continuous batches chains with the sync schedule (no tree, no"
            " async), got 'continuous'",
        ),
        (
            ["run", "--kv-capacity-tokens", "0"],
            "error: kv_capacity_tokens: must be an integer >= 1, got 0",
        ),
        (["corun", "--rounds", "0"], "error: rounds: must be >= 1, got 0"),
        (
            ["corun", "--latency-ms", "-1"],
            "error: link.latency_ms: must be a finite number >= 0, got -1",
        ),
    ],
)
def test_bad_input_exit_2(capsys, argv, line, monkeypatch):
    """One line, exit 2, and no stage process was started for any of them."""
    from wansim.real import runner

    def no_start(self):
        raise AssertionError("a stage process was started for bad input")

    monkeypatch.setattr(runner.Pipeline, "start", no_start)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == line


def test_cuda_without_a_gpu_is_one_line_before_any_process(capsys, monkeypatch):
    """``--device cuda`` where torch sees no GPU: exit 2, one line, no stage process started."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from wansim.real import runner

    started = []
    monkeypatch.setattr(runner, "_context", lambda: started.append(1))
    assert main(["run", "--device", "cuda", "--prompts", "1", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: device: needs a CUDA GPU, but torch ") and "\n" not in err
    assert not started

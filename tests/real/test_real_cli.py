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
    ],
)
def test_bad_input_exit_2(capsys, argv, line):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == line

"""``python -m wansim.real corun`` (:func:`wansim.real.experiments.corun_cost`): a stage's pass
alone and beside another pipeline's stages on the host's cores."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from wansim.real.errors import RealConfigError
from wansim.real.experiments import corun_cost


def test_corun_rows_alone_and_beside(tiny_dirs, code_prompts, tmp_path):
    """One row per round, condition and stage of A, the conditions alternating by round; every
    pass's CPU time at most its wall time; beside B the host counts B's processes under their
    own roles, alone it does not (they idle)."""
    target, drafter = tiny_dirs
    rows = corun_cost(
        target, drafter, code_prompts[:2], k=2, max_new_tokens=12, rounds=2, run_dir=tmp_path
    )
    assert [(r["round"], r["condition"], r["stage"]) for r in rows] == [
        (0, "alone", 0),
        (0, "alone", 1),
        (0, "beside", 0),
        (0, "beside", 1),
        (1, "beside", 0),
        (1, "beside", 1),
        (1, "alone", 0),
        (1, "alone", 1),
    ]
    for r in rows:
        assert r["passes"] > 0 and r["tokens_per_s"] > 0
        assert 0 < r["cpu_ms_median"] <= r["wall_ms_median"] + 0.011  # ticks of 4 decimals
        assert r["cpu_ms_mean"] <= r["wall_ms_mean"] + 1e-3  # (two clocks, 4 decimals)
    for r in rows:
        roles = (r["host_cpu"] or {}).get("own_cores_by_role")
        if roles is None:  # no /proc here
            continue
        assert {"stage", "link", "coordinator", "beside_stage", "beside_link"} <= set(roles)
        if r["condition"] == "beside":
            assert roles["beside_stage"] > 0
    with pytest.raises(RealConfigError, match="rounds"):
        corun_cost(target, drafter, code_prompts[:1], rounds=0)


def test_corun_at_a_latency_holds_every_frame_for_it(tiny_dirs, code_prompts, tmp_path):
    """``latency_ms`` reaches both pipelines' links: every frame of A's and B's relays is due
    that long after it arrived (the relays' own records)."""
    import csv

    target, drafter = tiny_dirs
    rows = corun_cost(
        target,
        drafter,
        code_prompts[:1],
        k=2,
        max_new_tokens=6,
        rounds=1,
        run_dir=tmp_path,
        latency_ms=3.0,
    )
    assert {r["condition"] for r in rows} == {"alone", "beside"}
    records = sorted(tmp_path.glob("*/raw/link[0-9].csv"))
    assert {p.relative_to(tmp_path).parts[0] for p in records} == {"a", "b"}
    for path in records:
        with open(path) as fh:
            due = [
                (int(r["scheduled_ns"]) - int(r["arrival_ns"])) / 1e6 for r in csv.DictReader(fh)
            ]
        assert due and min(due) >= 3.0 - 1e-6, path

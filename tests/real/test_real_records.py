"""The real path's record schema is torch-free and keeps the CSV columns calibration reads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from wansim.real.records import CANCEL_COLUMNS, STAGE_COLUMNS, STEP_COLUMNS, RecordLog, StepRow


def test_columns_are_the_logs_columns():
    assert STAGE_COLUMNS[:4] == ("job", "pass", "n_tokens", "pos")
    assert STEP_COLUMNS[:8] == (
        "job", "workload", "prompt_id", "prompt_index", "step", "pass", "k", "accepted",
    )  # fmt: skip
    assert STEP_COLUMNS[-3:] == ("nodes", "accepted_ranks", "walk_children")
    assert CANCEL_COLUMNS == ("job", "prompt_index", "pass", "n_tokens", "after_pass", "cancel_ns")


def test_record_log_writes_and_checks_types(tmp_path):
    import pandas as pd

    from wansim.real.records import CancelRow

    log = RecordLog(tmp_path / "steps.csv", StepRow)
    row = StepRow(
        0, "code", 3, 0, 0, 5, 4, 2, 3, 10, 1, 2, 3, 4, "0.1", "0.2", "0.3", 5, 0, 4, "", ""
    )
    log.write(row)
    frame = pd.read_csv(tmp_path / "steps.csv")
    assert list(frame.columns) == list(STEP_COLUMNS) and int(frame.loc[0, "pass"]) == 5
    with pytest.raises(TypeError, match="CancelRow written to a StepRow log"):
        log.write(CancelRow(0, 0, 1, 4, 0, 0))


def test_records_and_recording_do_not_import_torch():
    code = "import sys, wansim.real.records, wansim.real.recording; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

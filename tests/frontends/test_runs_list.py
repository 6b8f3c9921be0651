"""`scaletrain runs` in an 80-column terminal (an SSH session): no line runs past the width, and no number is cut."""

from __future__ import annotations

from pathlib import Path

from scaletrain.engine.launch.registry import RunRow
from scaletrain.tui.cli.runs import HEAD, row_cells, table_lines

GiB, MiB = 1 << 30, 1 << 20
ROWS = [RunRow(path=Path("/home/someone/runs/20261201-003325-qwen2.5-7b-lora-8xh100-zero3"), launched="",
               state="interrupted", step=23800, total_steps=100000, loss=0.35081, peak_bytes=int(71.43 * GiB),
               peak_kind="allocated", planned_bytes=int(74.9 * GiB), nodes=2, devices_per_node=8, exit_code=130),
        RunRow(path=Path("/tmp/r"), launched="", state="finished", step=200, total_steps=200, loss=1.0461,
               peak_bytes=int(470.38 * MiB), peak_kind="host RSS", planned_bytes=int(14.23 * MiB), nodes=1,
               devices_per_node=2, on_cpu=True)]


def test_at_80_columns_each_folder_takes_a_line_of_its_own_and_nothing_is_cut():
    table = [HEAD, *(row_cells(r) for r in ROWS)]
    lines = table_lines(table, 80)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[2] == "  " + str(ROWS[0].path) and lines[4] == "  /tmp/r"
    assert "23800/100000" in lines[1] and "71.4 GiB / 74.9 GiB" in lines[1] and "2×8 GPU" in lines[1]
    assert "470 MiB RSS / 14.2 MiB" in lines[3] and "1×2 CPU" in lines[3]


def test_a_wide_terminal_keeps_one_line_a_run_with_its_folder_last():
    lines = table_lines([HEAD, *(row_cells(r) for r in ROWS)], 200)
    assert len(lines) == 3 and lines[0].endswith("FOLDER") and lines[1].endswith(str(ROWS[0].path))

"""Issue 22 (disk): the plan says how much disk the run needs, and a launch into a filesystem without room for it
is refused in one line before any rank starts (a real 1 MiB tmpfs where the test may mount one, else the one
place that reads free space — engine/run/disk.free_bytes — reports 1 MiB)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from scaletrain.engine.run import disk
from scaletrain.tui.cli.main import main

SMALL = 1 << 20


@pytest.fixture
def small_fs(tmp_path, monkeypatch):
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(d)],
                                            capture_output=True).returncode == 0:
        yield d
        subprocess.run(["umount", str(d)], capture_output=True)
        return
    monkeypatch.setattr(disk, "free_bytes", lambda path: SMALL)
    yield d


def test_the_plan_counts_the_checkpoints_kept_and_the_logs(capsys):
    assert main(["plan", "--preset", "cpu-tiny", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["disk"]
    assert d["checkpoints_kept"] == 4                      # 200 steps, a checkpoint every 50
    assert d["total_bytes"] == 4 * d["checkpoint_bytes"] + d["export_bytes"] + d["logs_bytes"] and d["export_bytes"] > 0
    assert main(["plan", "--preset", "cpu-tiny", "--set", "train.keep_checkpoints=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disk"]["checkpoints_kept"] == 2   # the newest before the prune


def test_a_launch_without_room_is_refused_before_any_rank_starts(small_fs, capsys):
    run = small_fs / "run"
    # the dry run writes the folder and already says the disk is short (exit 3: the plan does not fit)
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(run)]) == 3
    assert "does not fit: needs" in capsys.readouterr().out
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["launch", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "free on its filesystem but the run needs" in err and "keep_checkpoints" in err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before        # no status, lock or log written


def test_a_failed_export_is_diagnosed_with_the_host_ram_it_needs(tmp_path, capsys):
    """The run trained; rank 0's export at the end failed: the doctor says the checkpoint is intact and how to
    export it again, with the host RAM the plan says the export holds."""
    log = tmp_path / "rank-0.log"
    log.write_text("[0]:scaletrain: done, 4 steps\n[0]:scaletrain: warning: the export of step 4 failed ([enforce "
                   "fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory); run `scaletrain export "
                   "RUN` to write it\n")
    plan = tmp_path / "plan.json"
    assert main(["plan", "--preset", "cpu-tiny", "--json"]) == 0
    plan.write_text(capsys.readouterr().out)
    need = json.loads(plan.read_text())["disk"]["export_host_bytes"]
    assert main(["diagnose", str(log), "--plan", str(plan), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "export_failed" and "checkpoint is intact" in d["summary"]
    titles = [r["title"] for r in d["remedies"]]
    assert titles[0] == "export it again: scaletrain export RUN_DIR --step 4"
    from scaletrain.engine.units import fmt_bytes
    assert f"{fmt_bytes(need)} of free host RAM" in titles[1]

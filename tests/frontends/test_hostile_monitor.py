"""Issue 23's last bad inputs that are not one-line refusals (those are cases in test_hostile_input.py): what the
headless monitor must still accept, how short an unknown key's line is, and a failed status that ends the watch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaletrain.engine.run.metrics import StepMetrics
from scaletrain.tui.cli.main import main

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    good = tmp_path_factory.mktemp("hostile-monitor") / "good"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(good)]) == 0
    return {"good": str(good)}


def test_a_monitor_skips_junk_lines_among_step_records(sandbox, tmp_path, capsys):
    """Not an error: lines that are not step records ([1,2], null, a string, a torn line) beside real ones are
    skipped (a metrics file with no step record at all is refused under --once: the cases above)."""
    d = tmp_path / "run"
    shutil.copytree(sandbox["good"], d)
    good = StepMetrics(step=3, total_steps=10, epoch=0.3, loss=2.5, lr=1e-4, tokens_per_second=900.0,
                       step_seconds=1.2, world_size=1, time=time.time()).to_json()
    (d / "metrics.jsonl").write_text('[1,2]\nnull\n"s"\n{"step": "x"}\n' + json.dumps(good) +
                                     '\n{"step": 1e999}\n{"step": 1, "tot')
    capsys.readouterr()
    assert main(["monitor", str(d), "--headless", "--once"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and f"step {good['step']}/" in out and not err


def test_unknown_keys_name_the_nearest_not_every_key(sandbox, capsys):
    """An unknown --set key gets a short line with the nearest spellings, not the 600-character list of all."""
    assert main(["plan", "--preset", "cpu-tiny", "--set", "micro_bach=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "micro_batch" in err and len(err) < 160 and "tokens_per_sample" not in err


def test_a_failed_status_without_exit_code_ends_the_headless_monitor(sandbox, tmp_path):
    """status.json saying "failed" with no exit code (and no rank log to diagnose): the headless monitor reports
    the failure and exits non-zero instead of waiting for ever."""
    d = tmp_path / "run"
    shutil.copytree(sandbox["good"], d)
    (d / "status.json").write_text('{"state": "failed"}')
    r = subprocess.run([*CLI, "monitor", str(d), "--headless", "--interval", "0.2"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "run failed" in r.stdout and "Traceback" not in r.stdout + r.stderr

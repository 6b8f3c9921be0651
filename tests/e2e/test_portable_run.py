"""A run folder travels: written here, moved to another path, it runs with `bash launch.sh` (its own folder and the
`scaletrain` on PATH or $SCALETRAIN_VENV found at run time) and with `scaletrain launch NEWDIR`; nothing of the
old path or of this machine's Python is baked into the scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.tui.cli.main import main

from test_train_cpu import RUN_LIMIT_SECONDS, deadline_tick


def _write(tmp_path: Path, name: str, *sets: str, flags: tuple[str, ...] = ()) -> Path:
    d = tmp_path / "written" / name
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d), "--set", "max_steps=3",
                 "--set", "train.save_checkpoints=false", *(x for s in sets for x in ("--set", s)), *flags]) == 0
    return d


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SCALETRAIN_VENV"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parents[2] / "src"),
                                                    env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _built_ops() -> dict[str, int]:
    """The torch extensions built in this environment's folder (TORCH_EXTENSIONS_DIR, which the Makefile sets),
    by path, with their modification times."""
    from torch.utils.cpp_extension import _get_build_directory

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path(_get_build_directory("x", verbose=False)).parent)
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*.so")}


def test_scripts_hold_no_absolute_path_of_the_run_or_of_this_python(tmp_path):
    d = _write(tmp_path, "r", "strategy=zero2", "nodes=2", flags=("--main-process-ip", "127.0.0.1"))
    for script in ("launch.sh", "sbatch.sh"):
        text = (d / script).read_text()
        subprocess.run(["bash", "-n", str(d / script)], check=True)
        assert str(d) not in text and sys.executable not in text, script
        assert '"$RUN_DIR"/ds_config.json' in text and "SCALETRAIN_VENV" in text
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(tmp_path / "x")]) == 0


def test_launch_sh_without_a_python_says_so_in_one_line(tmp_path):
    d = _write(tmp_path, "r")
    env = _env(PATH="/usr/bin:/bin", SCALETRAIN_VENV=str(tmp_path / "no-venv"))
    r = subprocess.run(["bash", str(d / "launch.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no Python with scaletrain" in r.stderr and "SCALETRAIN_VENV" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["venv-variable", "scaletrain-on-path"])
def test_a_moved_run_folder_trains_with_bash_launch_sh(tmp_path, how):
    """ZeRO-2 (the accelerate YAML names ds_config.json by its old absolute path; launch.sh passes the new one)."""
    old = _write(tmp_path, "r", "strategy=zero2")
    new = tmp_path / "elsewhere" / "moved run"
    new.parent.mkdir()
    shutil.move(str(old), str(new))
    assert not old.exists()
    bin_dir = Path(sys.executable).parent
    env = (_env(SCALETRAIN_VENV=sys.prefix, PATH="/usr/bin:/bin") if how == "venv-variable"
           else _env(PATH=f"{bin_dir}{os.pathsep}/usr/bin:/bin"))
    assert (bin_dir / "scaletrain").exists()
    built = _built_ops()
    r = subprocess.run(["bash", str(new / "launch.sh")], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=RUN_LIMIT_SECONDS)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    # DeepSpeed's CPU op is loaded as built, not built again by another ninja than the venv's (the system's, first
    # on this PATH: a minute of g++ each time the two alternate)
    assert _built_ops() == built
    series = read_metrics(new / "metrics.jsonl")
    assert [s.step for s in series] == [1, 2, 3] and all(s.world_size == 2 for s in series)
    assert (new / "logs" / "elastic").is_dir() and not old.exists()


@pytest.mark.slow
def test_a_moved_run_folder_trains_with_scaletrain_launch(tmp_path):
    old = _write(tmp_path, "r")
    new = tmp_path / "moved"
    shutil.move(str(old), str(new))
    result = launch(new, on_tick=deadline_tick())
    assert result.ok, RunDir(new).logs
    assert [s.step for s in read_metrics(new / "metrics.jsonl")] == [1, 2, 3]
    assert not old.exists()

"""Issue 29, builds 4 and 5: OS errors are answers, and values are checked once, at entry.

Every case: one line "scaletrain: error: …" of at most 500 characters naming what was wrong (and, for paths, the
path and what to do), exit 2, nothing written, nothing left running. They run in-process with SCALETRAIN_DEBUG=1,
so an exception that still reaches the catch-all fails the test with its traceback instead of becoming a line.
The full disk is a real one: a 64 KiB tmpfs mounted here when the tests run as root, else RLIMIT_FSIZE in a
subprocess (the kernel refuses the write past the limit with EFBIG).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from scaletrain.tui.cli.main import main

TINY = "scaletrain/tiny-qwen2"
LONG = "n" * 300                         # NAME_MAX is 255 on every Linux filesystem
PLAN = ["plan", "--model", TINY, "--gpus", "2xCPU"]


def _tree(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p)] = p.lstat().st_mtime_ns
    return out


def _one_line(argv: list[str], root: Path, capsys, needle: str) -> str:
    before = _tree(root)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip("\n").split("\n")
    assert code == 2, (argv[:5], code, err[-1000:])
    assert len(lines) == 1 and lines[0].startswith("scaletrain: error: "), (argv[:5], err[-1000:])
    assert len(lines[0]) <= 500 and lines[0].isprintable(), lines[0]
    assert needle in lines[0], (needle, lines[0])
    assert _tree(root) == before, f"{argv[:5]} wrote something"
    assert not [p for p in psutil.Process().children(recursive=True)
                if "--serve" not in " ".join(p.cmdline())], "a child is left"
    return lines[0]


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return tmp_path


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("entry") / "run"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return d


# ---- build 4: the operating system's refusals ----------------------------------------------------------------
def test_path_problems_are_one_line_naming_the_path(env, good_run, capsys):
    loop = str(env / "loop")
    dry = ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir"]
    cases = [
        (["launch", loop], "points back at itself"),
        (["launch", loop + "/run"], "points back at itself"),
        (["monitor", loop, "--headless", "--once"], "points back at itself"),
        (["export", loop], "points back at itself"),
        (["diagnose", loop], "loop"),
        ([*dry, loop], "points back at itself"),
        ([*dry, loop + "/r"], "points back at itself"),
        ([*dry, str(env / LONG)], "longer than the filesystem allows"),
        (["launch", str(env / LONG)], LONG[:20]),
        (["export", str(env / LONG)], LONG[:20]),
        (["monitor", str(env / LONG), "--headless", "--once"], LONG[:20]),
    ]
    for argv, needle in cases:
        _one_line(argv, env, capsys, needle)
    line = _one_line([*dry, str(env / ("x" * 2000) / LONG)], env, capsys, "…")          # the path cut to fit
    assert len(line) <= 500


# ---- export: needs a trained checkpoint ---------------------------------------------------------------------------
@pytest.fixture()
def trained(ddp_run) -> Path:
    """The shared 2-rank DDP run (tests/conftest.py): checkpoints to export, its own export at the last step."""
    return ddp_run.ok().path


def _mount_tmpfs(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.slow
def test_export_where_nothing_can_be_written_is_one_line(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")
    ro = tmp_path / "ro"
    if _mount_tmpfs(ro, "ro,size=64k"):
        try:
            _one_line(["export", str(trained), "--out", str(ro / "out")], trained, capsys, "read-only")
        finally:
            _umount(ro)
    else:
        ro.chmod(0o555)
        _one_line(["export", str(trained), "--out", str(ro / "out")], trained, capsys, "Permission denied")
    _one_line(["export", str(trained), "--out", str(tmp_path / LONG)], trained, capsys, "longer than the filesystem")
    (tmp_path / "afile").write_text("x")
    _one_line(["export", str(trained), "--out", str(tmp_path / "afile" / "out")], trained, capsys, "afile")


@pytest.mark.slow
def test_run_export_being_a_file_is_one_line(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    shutil.rmtree(run / "export")                   # the shared run exported its last step: no folder there now
    (run / "export").write_text("not a folder\n")
    _one_line(["export", str(run)], run, capsys, "export")


@pytest.mark.slow
def test_export_onto_a_full_disk_is_the_disk_full_line(trained, tmp_path, monkeypatch, capsys):
    """A 64 KiB tmpfs (root) holds no model: ENOSPC inside safetensors (SafetensorError, no OSError) or in
    transformers' own writes is the disk-full line, and the partial export is removed."""
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")
    full = tmp_path / "full"
    if _mount_tmpfs(full, "size=64k"):
        try:
            line = _one_line(["export", str(trained), "--out", str(full / "out")], trained, capsys, "disk is full")
            assert "free some space" in line and list(full.iterdir()) == []
        finally:
            _umount(full)
        return
    # not root: the file-size limit in a subprocess (SIGXFSZ ignored, so the write fails with EFBIG)
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536)); "
            "from scaletrain.tui.cli.main import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "export", str(trained), "--out", str(full / "out")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "File too large" in r.stderr, r.stderr[-2000:]
    _ = (resource, signal)


# ---- build 5: values checked at entry ---------------------------------------------------------------------------
def test_values_are_refused_at_entry(env, good_run, capsys):
    dry = ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(env / "r")]
    cases = [
        ([*dry, "--set", f"train.seed={2**64}"], "2**64-1"),
        (["--preset", "cpu-tiny-dpo", "--headless", "--dry-run", "--run-dir", str(env / "r"), "--set",
          f"train.seed={2**32}"], "2**32-1"),
        ([*PLAN, "--method", "qlora", "--base-bits", "16"], "4 or 8 bits"),
        ([*PLAN, "--data-columns", "prompt=a,prompt=b"], "mapped twice"),
        ([*PLAN, "--data-columns", "foo"], "give NAME=COLUMN"),
        ([*PLAN, "--data-columns", "question=prompt"], "give NAME=COLUMN"),
        (["plan", "--model", TINY, "--gpus", "2xCPU\u202e"], "control or direction character"),
        (["plan", "--model", TINY, "--gpus", "2x\x1b]0;pwned\x07CPU"], "control or direction character"),
        ([*PLAN, "--method", "lora", "--lora-targets", "q_proj,\u202ev_proj"], "--lora-targets"),
        (["monitor", str(good_run), "--headless", "--once", "--interval", "1e309"], "--interval"),
        (["monitor", str(good_run), "--headless", "--once", "--interval", "nan"], "--interval"),
        (["monitor", str(good_run), "--headless", "--once", "--interval", "inf"], "--interval"),
    ]
    for argv, needle in cases:
        line = _one_line(argv, env, capsys, needle)
        assert "\x1b" not in line and "\u202e" not in line


def test_seed_at_the_top_of_the_range_is_accepted(env, capsys):
    run = env / "r"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(run), "--set",
                 f"train.seed={2**64 - 1}"]) == 0
    assert json.loads((run / "plan.json").read_text())["train"]["seed"] == 2**64 - 1


@pytest.mark.parametrize("budget", ["-1", "nan", "inf", "0"])
def test_validate_budget_is_refused_before_any_folder_is_made(budget, env, capsys):
    tmp = Path(tempfile.gettempdir())
    before = {p.name for p in tmp.glob("scaletrain-validate-*")}
    _one_line(["validate", "--preset", "cpu-tiny", "--budget-seconds", budget], env, capsys, "--budget-seconds")
    assert {p.name for p in tmp.glob("scaletrain-validate-*")} == before


def test_diagnose_prints_a_logs_terminal_escapes_escaped(env, capsys):
    log = env / "rank0.log"
    log.write_text("step 1\n\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;title\x07\x1b[2J\x1b[H\u202e"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b]52;c;eA==\x07\n")
    capsys.readouterr()
    assert main(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert all(c.isprintable() for line in out.splitlines() for c in line)
    assert "cuda_oom" in out and "\\x1b]52" in out            # the evidence is still there, shown escaped

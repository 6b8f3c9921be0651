"""Issue 29, build item 3: every read is bounded. A FIFO (no writer: opening it for reading would wait for ever) in
place of each file the tool reads is one line and a non-zero exit, never a wait; whole-file reads are capped; a huge
log is diagnosed in time linear in what the signatures need; status.json parsing is total on any JSON.

CLI cases run as real subprocesses with a timeout (a hang fails the test instead of stalling it); the fileio
helpers are also timed in-process against a one-second bound."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from scaletrain.engine.catalog.architectures import catalog_entry
from scaletrain.engine.doctor.logs import HEAD_BYTES, TAIL_BYTES, read_lines
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import open_regular, read_bytes_bounded, read_text_bounded
from scaletrain.engine.launch.status import RunStatus, read_status
from scaletrain.tui.cli.main import main

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
TINY = "scaletrain/tiny-qwen2"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "logs"
OOM_LOG = FIXTURES / "torch2x_oom_gpu3.log"
CLI_TIMEOUT_S = 60          # a hang is caught here; the refusal itself takes the CLI's start-up time


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink() if not path.is_dir() else shutil.rmtree(path)
    os.mkfifo(path)
    return path


def _cli(argv: list[str], cwd: Path, stdin: str = "") -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "SCALETRAIN_DEBUG"}
    t = time.monotonic()
    r = subprocess.run([*CLI, *argv], input=stdin, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=cwd,
                       env=env)
    return r, time.monotonic() - t


def _one_line(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    assert len(lines[0]) <= 500 and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not psutil.Process().children(recursive=True)
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run directory (cpu-tiny, --dry-run) to copy and break."""
    root = tmp_path_factory.mktemp("bounded")
    d = root / "good"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return d


def _copy(run_dir: Path, tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(run_dir, d)
    return d


# ---- the helpers, in-process, against the one-second bound ----------------------------------------------------------
def _within_a_second(fn, *args) -> BaseException | None:
    """Run fn(*args) in a thread; it must end (with a refusal) within 1 s. A thread stuck in open() is freed by
    opening the FIFO for writing, so a failing test does not hang the suite."""
    out: list[BaseException | None] = []

    def call() -> None:
        try:
            fn(*args)
            out.append(None)
        except BaseException as e:         # noqa: BLE001 — the refusal is what is looked at
            out.append(e)

    th = threading.Thread(target=call, daemon=True)
    t = time.monotonic()
    th.start()
    th.join(1.0)
    elapsed = time.monotonic() - t
    if th.is_alive():
        fd = os.open(args[0], os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        th.join(5)
        pytest.fail(f"{fn.__name__} waited on a FIFO ({elapsed:.1f} s)")
    return out[0]


@pytest.mark.parametrize("reader", [open_regular, lambda p: read_text_bounded(p, 1 << 20, "file"),
                                    lambda p: read_bytes_bounded(p, 1 << 20, "file"), read_lines, read_status])
def test_no_helper_waits_on_a_fifo(tmp_path, reader):
    fifo = _fifo(tmp_path / "rank-0.log")
    e = _within_a_second(reader, fifo)
    if reader is read_status:                       # status: an "unknown" record with the reason, not a raise
        assert e is None and read_status(fifo).state == "unknown" and "FIFO" in read_status(fifo).reason
    else:
        assert isinstance(e, ScaletrainError) and "FIFO" in str(e) and "regular file" in str(e)


def test_whole_file_reads_are_capped(tmp_path):
    big = tmp_path / "plan.json"
    big.write_bytes(b" " * 5000)
    with pytest.raises(ScaletrainError, match="5,000 bytes, more than the 4,096"):
        read_text_bounded(big, 4096, "plan.json")
    assert read_text_bounded(big, 5000, "plan.json") == " " * 5000


def test_a_folder_socket_or_device_is_refused_too(tmp_path):
    import socket

    sock_path = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        for p, kind in ((tmp_path, "a folder"), (sock_path, "a socket"), (Path("/dev/null"), "a character device")):
            with pytest.raises(ScaletrainError, match=kind):
                read_text_bounded(p, 1 << 20, "file")
    finally:
        s.close()


# ---- each file the CLI reads, as a FIFO -----------------------------------------------------------------------------
def test_plan_data_fifo(tmp_path):
    fifo = _fifo(tmp_path / "data.jsonl")
    r, _ = _cli(["plan", "--model", TINY, "--gpus", "2xCPU", "--data", str(fifo)], tmp_path)
    _one_line(r, "FIFO", "data.jsonl")
    folder = tmp_path / "data-folder"
    _fifo(folder / "part-0.jsonl")                  # a folder's data files are its regular files only
    r, _ = _cli(["plan", "--model", TINY, "--gpus", "2xCPU", "--data", str(folder)], tmp_path)
    _one_line(r, "holds no data files")


def test_model_config_json_fifo(tmp_path):
    fifo = _fifo(tmp_path / "m" / "config.json")
    for spec in (str(fifo.parent), str(fifo)):
        r, _ = _cli(["plan", "--model", spec, "--gpus", "2xCPU"], tmp_path)
        _one_line(r, "FIFO")


def test_weights_tokenizer_config_fifo(tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalog_entry(TINY)["config"]))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    _fifo(folder / "tokenizer_config.json")
    r, _ = _cli(["--preset", "cpu-tiny", "--weights", str(folder), "--headless", "--dry-run", "--run-dir",
                 str(tmp_path / "out")], tmp_path)
    _one_line(r, "FIFO", "tokenizer_config.json")
    assert not (tmp_path / "out").exists()


def test_preset_file_fifo(tmp_path):
    fifo = _fifo(tmp_path / "mine.yaml")
    r, _ = _cli(["--preset", str(fifo), "--headless", "--dry-run", "--run-dir", str(tmp_path / "out")], tmp_path)
    _one_line(r, "FIFO")


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_diagnose_fifo_log_and_fifo_rank_log_in_a_run(tmp_path, run_dir):
    fifo = _fifo(tmp_path / "train.log")
    r, _ = _cli(["diagnose", str(fifo)], tmp_path)
    _one_line(r, "FIFO", "train.log")
    d = _copy(run_dir, tmp_path, "run")
    _fifo(d / "logs" / "rank-0.log")
    r, _ = _cli(["diagnose", str(d)], tmp_path)
    _one_line(r, "FIFO", "rank-0.log")
    r, _ = _cli(["diagnose", str(OOM_LOG), "--plan", str(_fifo(tmp_path / "p.json"))], tmp_path)
    _one_line(r, "FIFO")


def test_diagnose_of_a_run_never_launched_says_so(tmp_path, run_dir):
    """A written run directory with no log yet: it said "diagnose needs at least one log file (or a run
    directory)", given a run directory."""
    d = _copy(run_dir, tmp_path, "run")
    r, _ = _cli(["diagnose", str(d)], tmp_path)
    line = _one_line(r, "has no logs yet", "not been launched", f"scaletrain launch {d}")
    assert "needs at least one log file" not in line


def test_diagnose_fifo_metrics_in_a_run(tmp_path, run_dir):
    d = _copy(run_dir, tmp_path, "run")
    shutil.copy(OOM_LOG, d / "logs" / "rank-3.log")
    _fifo(d / "metrics.jsonl")
    r, _ = _cli(["diagnose", str(d)], tmp_path)
    _one_line(r, "FIFO", "metrics.jsonl")


@pytest.mark.parametrize("name", ["status.json", "plan.json"])
def test_monitor_once_with_a_fifo_status_or_plan(tmp_path, run_dir, name):
    d = _copy(run_dir, tmp_path, "run")
    _fifo(d / name)
    r, _ = _cli(["monitor", "--headless", "--once", str(d)], tmp_path)
    _one_line(r, "FIFO", name)


def test_monitor_waiting_for_a_run_refuses_a_fifo_plan(tmp_path, run_dir):
    """Without --once the monitor waits for a run directory being written; a FIFO plan.json is not being written."""
    d = _copy(run_dir, tmp_path, "run")
    _fifo(d / "plan.json")
    r, _ = _cli(["monitor", "--headless", str(d)], tmp_path)
    _one_line(r, "FIFO", "plan.json")


def test_monitor_once_with_fifo_metrics_and_rank_log_does_not_wait(tmp_path, run_dir):
    d = _copy(run_dir, tmp_path, "run")
    _fifo(d / "metrics.jsonl")
    _fifo(d / "logs" / "rank-0.log")
    r, elapsed = _cli(["monitor", "--headless", "--once", str(d)], tmp_path)
    assert "Traceback" not in r.stderr and r.returncode in (0, 2), r.stderr


def test_launch_with_a_fifo_plan_or_accelerate_config(tmp_path, run_dir):
    for name in ("plan.json", "accelerate_config.yaml"):
        d = _copy(run_dir, tmp_path, f"run-{name}")
        _fifo(d / name)
        r, _ = _cli(["launch", str(d)], tmp_path)
        _one_line(r, "FIFO", name)
        assert not (d / "status.json").exists()


def test_plain_wizard_dataset_answer_that_is_a_fifo_is_refused_and_asked_again(tmp_path):
    fifo = _fifo(tmp_path / "data.jsonl")
    run = tmp_path / "run"
    answers = ["", "Qwen/Qwen2.5-7B-Instruct", "", "lora", "8", "", "", "", "128", "", str(fifo), "1000", "2", "",
               "2e-4@8", "y", str(run)]
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "--plain", "--gpus", "4xH200"],
                       input="\n".join(answers) + "\n", capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "FIFO" in r.stdout and "✗" in r.stdout
    assert json.loads((run / "plan.json").read_text())["request"]["dataset_size"] == 1000


# ---- status.json: total on any JSON ---------------------------------------------------------------------------------
JUNK = ["x", 1.5, None, [1], {"a": 1}, True, "²", 10**30, -1]


@pytest.mark.parametrize("junk", JUNK)
def test_status_parsing_is_total(junk):
    d = {k: junk for k in ("started", "argv", "machine_rank", "num_machines", "local_ranks", "pids", "rank_pids",
                           "tracked_pids", "ended", "exit_code", "launcher_exit_code", "first_failing_rank",
                           "failing_rank_exit_code", "host", "launcher_start", "reason", "disk_free_bytes",
                           "oom_kills")}
    d.update(state="failed", exit_codes={"0": junk, str(junk): 1, "1": 137})
    st = RunStatus.from_json(d)
    assert st.state == "failed" and st.over
    assert st.exit_codes.get(1) == 137 and all(isinstance(v, int) for v in st.exit_codes.values())
    json.dumps(st.to_json())


def test_headless_monitor_ends_on_a_failed_status_with_junk_exit_codes(tmp_path, run_dir):
    d = _copy(run_dir, tmp_path, "run")
    (d / "status.json").write_text(json.dumps({"state": "failed", "exit_code": "one", "exit_codes": {"0": "x",
                                                                                                    "1": [2]},
                                               "first_failing_rank": "zero", "ended": "2026-11-26T10:00:00"}))
    shutil.copy(OOM_LOG, d / "logs" / "rank-0.log")
    r, _ = _cli(["monitor", "--headless", "--interval", "0.2", str(d)], tmp_path)
    assert r.returncode == 1 and "run failed" in r.stdout and "cuda_oom" in r.stdout, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr


# ---- diagnose of large logs: linear, only what the signatures need --------------------------------------------------
LARGE_BYTES = 64 << 20
LARGE_LIMIT_S = 20.0


def _large(path: Path, line: bytes, newline_every: int | None) -> Path:
    unit = line if newline_every is None else (line.rstrip(b"\n") + b"\n")
    block = (unit * ((8 << 20) // len(unit) + 1))[:8 << 20]
    if newline_every is not None:
        block = block[:block.rfind(b"\n") + 1]
    with path.open("wb") as f:
        left = LARGE_BYTES
        while left > 0:
            f.write(block[:left])
            left -= len(block)
        f.write(b"\n" + OOM_LOG.read_bytes())
    return path


@pytest.mark.long
@pytest.mark.parametrize("kind", ["single_line", "many_lines"])
def test_diagnose_of_a_large_log_is_fast_and_finds_the_failure(tmp_path, kind):
    text = b"tensor([[0.1234, -0.5678]], grad_fn=<AddBackward0>) aaaa.bbbb.cccc Error xxxxxxxx "
    if kind == "many_lines":
        text = b"[rank0]: 2026-11-22 00:20:47,081 step 12 loss 1.92 lr 1e-4 tokens/s 12345.6 mem 71.2 GiB\n"
    log = _large(tmp_path / f"{kind}.log", text, None if kind == "single_line" else 1)
    r, elapsed = _cli(["diagnose", str(log)], tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.startswith("cuda_oom gpu 3:"), r.stdout[:500]
    assert elapsed < LARGE_LIMIT_S, f"{kind}: {elapsed:.1f} s"
    assert max(len(x) for x in r.stdout.splitlines()) < 20_000          # a giant line is cut, not echoed whole


def test_a_large_logs_line_numbers_and_launch_marks_are_the_files(tmp_path):
    """The head and tail windows keep the file's own line numbers; a relaunch mark in the unread middle makes the
    head history (an earlier launch's failure is not this one's)."""
    filler = b"x" * 99 + b"\n"
    n_mid = (HEAD_BYTES + TAIL_BYTES) // len(filler) + 1000
    log = tmp_path / "rank-0.log"
    with log.open("wb") as f:
        f.write(b"RuntimeError: an earlier launch's failure\n")
        f.write(filler * (n_mid // 2))
        f.write(b"==> scaletrain launch 2026-11-26 10:00:00 <==\n")
        f.write(filler * (n_mid // 2))
        f.write(b"the last line\n")
    lines = read_lines(log)
    total = 1 + 2 * (n_mid // 2) + 1 + 1
    assert lines[-1].text == "the last line" and lines[-1].number == total
    assert all("earlier launch" not in ln.text for ln in lines)
    assert lines[0].number > 2 + n_mid // 2 - TAIL_BYTES // len(filler) - 2

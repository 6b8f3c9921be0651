"""Issue 30.1: weights and data from the hub, as users expect. A local server speaking the hub's protocol
(tests/e2e/hub_server.py, HF_ENDPOINT) serves a tiny random-init model saved by transformers with the project's byte
tokenizer, and a JSONL dataset; the real huggingface_hub client downloads them. Every CLI call is a subprocess with
an empty HF cache of its own (huggingface_hub reads HF_ENDPOINT and HF_HOME once, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import Hub

SRC = Path(__file__).resolve().parents[2] / "src"
SHORT = ["--set", "train.max_steps=3", "--set", "train.save_checkpoints=false"]
CLI_TIMEOUT_SECONDS = 420


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """cpu-tiny's architecture (scaletrain/tiny-qwen2) saved by transformers, with the byte tokenizer a random-init run
    exports (trainer/byte_tokenizer.py): what a user's small model repo holds."""
    import torch

    from scaletrain.engine.catalog.architectures import catalog_entry
    from scaletrain.trainer.byte_tokenizer import byte_tokenizer_fast
    from scaletrain.trainer.model import random_init

    folder = tmp_path_factory.mktemp("tiny-model")
    cfg = dict(catalog_entry("scaletrain/tiny-qwen2")["config"])
    torch.manual_seed(0)
    random_init(cfg, "sdpa").save_pretrained(folder)
    byte_tokenizer_fast(int(cfg["vocab_size"])).save_pretrained(folder)
    return folder


def _records(n: int, split: str) -> bytes:
    return "".join(json.dumps({"prompt": f"{split} question {i}: what is {i} plus {i}?",
                               "completion": f"It is {2 * i}. " * 3}) + "\n" for i in range(n)).encode()


@pytest.fixture
def hub(tiny_folder):
    h = Hub()
    extra = {"README.md": b"# tiny\n", "consolidated.safetensors": b"\0" * 4096}     # not what the run loads
    files = {p.name: p.read_bytes() for p in tiny_folder.iterdir() if p.is_file()}
    h.add("models", "org/tiny", {**files, **extra})
    h.add("models", "org/gated", files, gated=True, granted=("hf_granted",))
    h.add("models", "org/private", files, private=True, granted=("hf_granted",))
    h.add("models", "org/notok", {n: b for n, b in files.items() if n in ("config.json", "model.safetensors",
                                                                          "generation_config.json")})
    h.add("datasets", "org/chat", {"data/train.jsonl": _records(80, "train"), "data/test.jsonl": _records(20, "test"),
                                   "README.md": b"# chat\n"})
    h.start()
    yield h
    h.stop()


def _env(tmp_path: Path, hub: Hub, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    env.update(PYTHONPATH=str(SRC), HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.endpoint, **extra)
    return env


def _cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaletrain.tui.cli.main", *argv], env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT_SECONDS)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:], proc.stdout[-2000:])
    return lines[0]


def _cached(tmp_path: Path, kind: str, repo: str) -> set[str]:
    snaps = tmp_path / "hf" / "hub" / f"{kind}--{repo.replace('/', '--')}" / "snapshots"
    return {p.relative_to(s).as_posix() for s in snaps.glob("*") for p in s.rglob("*") if p.is_file()}


def _gets(hub: Hub, fragment: str) -> list[str]:
    return [path for method, path in hub.requests if method == "GET" and "/resolve/" in path and fragment in path]


# ---- weights ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_hub_weights_are_downloaded_once_before_the_ranks_and_trained(hub, tiny_folder, tmp_path):
    from scaletrain.engine.units import fmt_bytes

    run = tmp_path / "run"
    proc = _cli(["--preset", "cpu-tiny", "--model", "org/tiny", "--weights", "org/tiny", "--headless",
                 "--run-dir", str(run), *SHORT], _env(tmp_path, hub), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    needed = {p.name for p in tiny_folder.iterdir() if p.is_file()}
    size = sum((tiny_folder / n).stat().st_size for n in needed - {"config.json"})   # config.json came at plan time
    out = " ".join(proc.stdout.split())
    assert f"downloads {fmt_bytes(size)} at launch" in out, out        # the plan said it, from the hub's metadata
    assert "downloaded" in out and "of org/tiny into" in out
    assert _cached(tmp_path, "models", "org/tiny") == needed           # not README.md, not consolidated.safetensors
    assert len(_gets(hub, "model.safetensors")) == 1                    # once per node, not once per rank
    doc = json.loads((run / "plan.json").read_text())
    assert doc["train"]["model_source"] == "org/tiny"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert "scaletrain: org/tiny (full, ddp, fp32) on 2 process(es)" in (run / "logs" / "rank-0.log").read_text()
    # the ranks asked the hub nothing (HF_HUB_OFFLINE=1 after the launcher's download): one HEAD of the weights
    assert len([p for m, p in hub.requests if m == "HEAD" and p.endswith("/model.safetensors")]) == 1


@pytest.mark.long
def test_plan_counts_the_download_and_honours_hf_token(hub, tiny_folder, tmp_path):
    files = {p.name: p.stat().st_size for p in tiny_folder.iterdir() if p.is_file()}
    base = ["plan", "--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU", "--json"]
    proc = _cli([*base, "--weights", "org/private"], _env(tmp_path, hub, HF_TOKEN="hf_granted"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    w = json.loads(proc.stdout)["weights"]
    assert w["download"]["bytes"] == w["download"]["missing_bytes"] == sum(files.values())
    assert w["download"]["files"] == len(files) and w["note"].startswith("downloads ")
    assert _cached(tmp_path, "models", "org/private") == set()           # the plan downloads nothing
    proc = _cli([*base, "--weights", "org/private"], _env(tmp_path, hub), tmp_path)       # no token
    w = json.loads(proc.stdout)["weights"]
    assert "download" not in w and "private and HF_TOKEN gives no access" in w["note"]
    proc = _cli([*base, "--weights", "org/gated"], _env(tmp_path, hub), tmp_path)
    assert "is gated on the hub" in json.loads(proc.stdout)["weights"]["note"]


def test_offline_keeps_todays_note(hub, tmp_path):
    proc = _cli(["plan", "--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU", "--weights", "org/tiny", "--json"],
                _env(tmp_path, hub, HF_HUB_OFFLINE="1"), tmp_path)
    note = json.loads(proc.stdout)["weights"]["note"]
    assert "not in the HF cache" in note and "here the hub is off (HF_HUB_OFFLINE is set)" in note
    assert "a launch where the hub answers downloads them first" in note and "huggingface-cli download org/tiny" in note
    assert not hub.requests


@pytest.mark.parametrize("repo,token,needle", [
    ("org/gated", None, "model org/gated is gated on the hub: accept its terms at"),
    ("org/gated", "hf_not_granted", "model org/gated is gated on the hub"),
    ("org/missing", None, "model org/missing is not on the hub, or it is private"),
])
def test_a_refused_repo_is_one_line_before_any_rank(hub, tmp_path, repo, token, needle):
    run = tmp_path / "run"
    env = _env(tmp_path, hub, **({"HF_TOKEN": token} if token else {}))
    proc = _cli(["--preset", "cpu-tiny", "--model", "scaletrain/tiny-qwen2", "--weights", repo, "--headless",
                 "--run-dir", str(run), *SHORT], env, tmp_path)
    assert needle in _one_line(proc)
    assert not (run / "logs" / "rank-0.log").exists() and not (run / "metrics.jsonl").exists()
    assert not _gets(hub, repo)                                         # not one file of it was served


def test_a_gated_model_is_one_line_at_plan_time_too(hub, tmp_path):
    proc = _cli(["--preset", "cpu-tiny", "--model", "org/gated", "--weights", "org/gated", "--headless",
                 "--run-dir", str(tmp_path / "run"), *SHORT], _env(tmp_path, hub), tmp_path)
    line = _one_line(proc)
    assert "unknown model 'org/gated'" in line and "model org/gated is gated on the hub" in line
    assert not (tmp_path / "run").exists()


def test_offline_an_uncached_hub_model_is_todays_line_before_any_rank(hub, tmp_path):
    run = tmp_path / "run"
    proc = _cli(["--preset", "cpu-tiny", "--weights", "org/tiny", "--headless", "--run-dir", str(run), *SHORT],
                _env(tmp_path, hub, HF_HUB_OFFLINE="1"), tmp_path)
    line = _one_line(proc)
    assert "the weights of org/tiny are not in the HF cache" in line and "huggingface-cli download org/tiny" in line
    assert not (run / "logs" / "rank-0.log").exists() and not hub.requests


@pytest.mark.long
def test_a_weights_repo_without_a_tokenizer_is_refused_before_any_rank(hub, tmp_path):
    run = tmp_path / "run"
    proc = _cli(["--preset", "cpu-tiny", "--model", "scaletrain/tiny-qwen2", "--weights", "org/notok", "--headless",
                 "--run-dir", str(run), *SHORT], _env(tmp_path, hub), tmp_path)
    line = _one_line(proc)
    assert "the tokenizer of org/notok is empty" in line and "probe sentence encodes to 0 tokens" in line
    assert not (run / "logs" / "rank-0.log").exists()
    assert "model.safetensors" in _cached(tmp_path, "models", "org/notok")    # the weights came; the run did not


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_a_download_cut_off_midway_resumes_where_it_stopped(hub, tmp_path):
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE      # the client keeps whole chunks of a cut transfer

    weights = os.urandom(2 * DOWNLOAD_CHUNK_SIZE + 12345)
    hub.add("models", "org/big", {"config.json": b"{}", "model.safetensors": weights},
            drop_at={"model.safetensors": DOWNLOAD_CHUNK_SIZE + 1000})
    code = ("from scaletrain.engine.request.hub_files import download, hub_files; "
            "print(download(hub_files('org/big'), progress=False))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, hub), cwd=tmp_path, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_SECONDS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (Path(proc.stdout.strip()) / "model.safetensors").read_bytes() == weights
    assert [r for p, r in hub.ranges if p.endswith("/model.safetensors")] == [f"bytes={DOWNLOAD_CHUNK_SIZE}-"]


# ---- data ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_hub_dataset_is_downloaded_and_trained_on(hub, tmp_path):
    run = tmp_path / "run"
    proc = _cli(["--preset", "cpu-tiny", "--data", "org/chat", "--headless", "--run-dir", str(run), *SHORT],
                _env(tmp_path, hub), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert _cached(tmp_path, "datasets", "org/chat") == {"data/train.jsonl"}      # the train split only
    doc = json.loads((run / "plan.json").read_text())
    assert doc["train"]["dataset"] == "org/chat"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    log = (run / "logs" / "rank-0.log").read_text()
    assert "80 records" in log, log[-2000:]                               # the trainer read the 80 train records


def test_a_missing_dataset_is_one_line(hub, tmp_path):
    proc = _cli(["plan", "--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU", "--data", "org/nodata"],
                _env(tmp_path, hub), tmp_path)
    assert "dataset org/nodata is not on the hub" in _one_line(proc)


# ---- the tokenizer check, on transformers' own empty tokenizer ---------------------------------------------------
def test_an_empty_tokenizer_is_an_error_and_a_real_one_passes(tiny_folder, tmp_path):
    from transformers import AutoTokenizer

    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.trainer.tokenizer_check import load_checked, tokenizer_problem

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_folder / name).read_bytes())
    empty = AutoTokenizer.from_pretrained(str(bare), trust_remote_code=False)     # transformers 5: no error here
    assert "is empty" in (tokenizer_problem(empty, "bare") or "")
    with pytest.raises(ScaletrainError, match="is empty"):
        load_checked(str(bare))
    assert tokenizer_problem(AutoTokenizer.from_pretrained(str(tiny_folder)), "tiny") is None

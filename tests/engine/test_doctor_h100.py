"""The doctor on the real failure output of the first H100 session (tests/fixtures/logs/h100/, copied unchanged
from ../shared/measurements/h100-2026-11-23/logs/): two CUDA OOMs, a full disk, and the trainer's own one-line
refusals (QLoRA from random init at that commit; a dataset too small for one step, as the headless view printed
it, wrapped at 80 columns)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scaletrain.engine.doctor.diagnosis import diagnose, diagnose_paths
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.launch.relaunch import likely_resumes
from scaletrain.engine.run.writers import write_run_dir
from scaletrain.tui.cli.main import main

H100 = Path(__file__).parents[1] / "fixtures" / "logs" / "h100"
CASES = [
    ("cuda-oom-eager-attention-single-process.log", "cuda_oom", None),
    ("cuda-oom-zero2-optimizer-step-rank0.log", "cuda_oom", 0),
    ("disk-full-checkpoint-save.log", "disk_full", None),
    ("qlora-random-init-refused.log", "config_error", None),
    ("dataset-too-small-headless-output.txt", "config_error", None),
]


@pytest.mark.parametrize("name,kind,rank", CASES, ids=[c[0] for c in CASES])
def test_diagnose_json_names_each_shared_log(name, kind, rank, capsys):
    assert main(["diagnose", str(H100 / name), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["kind"], out["rank"]) == (kind, rank), out["summary"]
    text = (H100 / name).read_text().splitlines()
    assert out["evidence"] and all(line in text for line in out["evidence"])      # quoted, never paraphrased


def test_every_shared_log_is_a_case():
    assert {c[0] for c in CASES} == {p.name for p in H100.iterdir()}


def test_the_trainers_own_line_is_the_evidence_and_the_message():
    d = diagnose([H100 / "qlora-random-init-refused.log"])
    assert d.evidence == ("scaletrain: error: a quantized base needs pretrained weights: set the train option "
                          "model_source to a local path or HF cache id (random-init builds full-precision weights)",)
    assert d.summary.endswith("(random-init builds full-precision weights)")
    assert d.remedies == ()                  # the line says what to change; no config rewrite is offered
    # a terminal wrapped the line at 80 columns: the continuation is part of it, the traceback after it is not
    wrapped = diagnose([H100 / "dataset-too-small-headless-output.txt"])
    assert wrapped.evidence[0].startswith("scaletrain: error: the dataset gives 31 blocks of 2048 tokens")
    assert len(wrapped.evidence) == 3 and wrapped.evidence[-1] == "the batch or the sequence length"
    assert ("needs micro batch 4 × accumulation 8 × 1 processes = 32; add data, or lower the batch or the "
            "sequence length") in wrapped.summary


def test_disk_full_names_the_save_and_offers_disk_remedies_that_change_no_memory(tmp_path):
    alone = diagnose([H100 / "disk-full-checkpoint-save.log"])
    assert alone.kind == "disk_full" and "while saving a checkpoint" in alone.summary
    assert "save_file" in alone.evidence[0]                  # the frame that wrote
    # with the run directory, the remedies are train options a relaunch can apply (and resume from)
    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", precision="fp32", strategy="ddp", micro_batch=2,
                      grad_accum=2, grad_ckpt=False, offload="none", seq_len=64)
    run = write_run_dir(make_plan(req), req, TrainOptions(checkpoint_every=50), tmp_path / "run")
    shutil.copy(H100 / "disk-full-checkpoint-save.log", run.rank_log(0))
    d = diagnose_paths([run.path])
    changes = [r.changes for r in d.remedies]
    assert {"train.keep_checkpoints": 1} in changes and {"train.checkpoint_every": 500} in changes
    assert {"train.save_checkpoints": False} in changes
    assert not d.remedies[0].applicable and "disk" in d.remedies[0].title
    for r in d.remedies:                                      # a disk problem: no memory or time is promised
        assert r.predicted_per_gpu_bytes is None and r.predicted_step_seconds is None and r.fits is None
        assert all(k.startswith("train.") for k in r.changes)
        assert likely_resumes(r.changes)


@pytest.mark.parametrize("line,path", [
    ("OSError: [Errno 28] No space left on device: '/data/run/checkpoints/step-50/optimizer.bin'",
     "/data/run/checkpoints/step-50/optimizer.bin"),
    ("RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 1234 vs 5678 (errno 28)", None),
])
def test_disk_full_in_other_wordings(tmp_path, line, path):
    log = tmp_path / "rank-0.log"
    log.write_text("Traceback (most recent call last):\n  File \"/x/torch/serialization.py\", line 9, in save\n"
                   f"{line}\n")
    d = diagnose([log], with_remedies=False)
    assert d.kind == "disk_full" and d.rank == 0 and d.details.get("path") == path
    assert d.details["while_saving"]

"""A plan.json changed by hand, then launched: the batch the trainer would run must be the one the plan's memory and
time were predicted for. Found in a walk: micro_batch raised from 4 to 7 in a cpu-tiny run's plan.json trained 28
samples per step against the 16 its numbers were for, without a word, and num_processes 2 -> 3 in its
accelerate_config.yaml trained 3 ranks. Launch now refuses both in one line before any process starts
(PlanDocument.check_batch, configs.check_planned); every bundled preset's own plan.json still launches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaletrain.engine.request.presets import list_presets
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.tui.cli.main import main

EDITS = {
    "micro_batch alone": ({"batch": {"micro_batch": 7}}, "micro 7 × accum 2 × 2 processes = 28 samples per step, "
                                                          "but it records an effective batch of 16"),
    "the split, effective batch kept": ({"batch": {"micro_batch": 8, "grad_accum": 1}},
                                        "its batch has micro_batch 8, but it was planned with micro_batch 4"),
    "GPUs per node": ({"hardware": {"gpus_per_node": 4}}, "its hardware is 1 node × 4, but its batch is split over 2"),
    "sequence length": ({"batch": {"seq_len": 64}}, "its batch is 64 tokens per sample, its training section 128"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("edited") / "run"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return d


@pytest.mark.parametrize("edit", list(EDITS))
def test_launch_refuses_a_plan_whose_batch_was_changed_by_hand(edit, written, tmp_path, capsys):
    import shutil

    changes, said = EDITS[edit]
    run = tmp_path / "run"
    shutil.copytree(written, run)
    plan = json.loads((run / "plan.json").read_text())
    for section, values in changes.items():
        plan[section].update(values)
    (run / "plan.json").write_text(json.dumps(plan))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["launch", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not add up" in err and said in err, err
    assert "scaletrain launch DIR --set KEY=VALUE" in err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before        # nothing started, nothing written


CONFIG_EDITS = {"num_processes: 2": ("num_processes: 3", "has num_processes 3 but its plan.json was made with 2"),
                "num_machines: 1": ("num_machines: 2", "has num_machines 2 but its plan.json was made with 1"),
                "mixed_precision: 'no'": ("mixed_precision: bf16", "has mixed_precision 'bf16' but its plan.json was "
                                                                   "made with 'no'")}
DS_EDITS = {
    "ZeRO stage": ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage 3 but its plan.json was made with 2"),
    "bf16": ({"bf16": {"enabled": True}}, "bf16.enabled True but its plan.json was made with False"),
    "offload": ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
                "zero_optimization.offload_optimizer.device 'cpu' but its plan.json was made with it absent"),
    "not JSON": (None, "ds_config.json cannot be read as JSON (JSONDecodeError)"),
}


@pytest.mark.parametrize("line", list(CONFIG_EDITS))
def test_launch_refuses_an_accelerate_config_that_starts_another_run(line, written, tmp_path, capsys):
    import shutil

    edited, said = CONFIG_EDITS[line]
    run = tmp_path / "run"
    shutil.copytree(written, run)
    cfg = (run / "accelerate_config.yaml").read_text()
    assert line in cfg
    (run / "accelerate_config.yaml").write_text(cfg.replace(line, edited))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["launch", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "(edited by hand?)" in err, err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


@pytest.fixture(scope="module")
def written_zero2(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("edited") / "run"
    assert main(["--preset", "cpu-tiny", "--strategy", "zero2", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return d


def _merge(d: dict, changes: dict) -> None:
    for k, v in changes.items():
        _merge(d.setdefault(k, {}), v) if isinstance(v, dict) else d.__setitem__(k, v)


@pytest.mark.parametrize("edit", [*DS_EDITS, "a tuning key"])
def test_launch_refuses_a_deepspeed_config_that_trains_another_run(edit, written_zero2, tmp_path, capsys):
    """ZeRO stage 2 -> 3 by hand failed in the ranks (a meta tensor copied); bf16 in an fp32 plan trained bf16. A
    bucket size is the user's to tune: that edit is not refused (the check passes; nothing is launched here)."""
    import shutil

    from scaletrain.engine.run.configs import check_planned
    from scaletrain.engine.run.layout import RunDir

    run = tmp_path / "run"
    shutil.copytree(written_zero2, run)
    ds = json.loads((run / "ds_config.json").read_text())
    if edit == "a tuning key":
        _merge(ds, {"zero_optimization": {"reduce_bucket_size": 5, "offload_param": {"device": "none"}}})
        (run / "ds_config.json").write_text(json.dumps(ds))
        doc = read_plan_document(run / "plan.json")
        check_planned(RunDir(run), {"num_processes": 2, "num_machines": 1}, doc.replan()[1], doc.train)
        return
    changes, said = DS_EDITS[edit]
    if changes is None:
        (run / "ds_config.json").write_text("{")
    else:
        _merge(ds, changes)
        (run / "ds_config.json").write_text(json.dumps(ds))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["launch", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


@pytest.mark.parametrize("name", sorted(p.name for p in list_presets()))
def test_every_bundled_presets_plan_adds_up(name, tmp_path, capsys):
    """No false refusal: each preset's run directory, as the headless path writes it, passes both checks (two
    nodes, DeepSpeed's config file, QLoRA among them)."""
    import yaml

    from scaletrain.engine.run.configs import check_planned
    from scaletrain.engine.run.layout import RunDir

    run = tmp_path / "run"
    assert main(["--preset", name, "--headless", "--dry-run", "--run-dir", str(run)]) in (0, 3)
    capsys.readouterr()
    doc = read_plan_document(run / "plan.json")
    doc.check_batch()
    written = yaml.safe_load((run / "accelerate_config.yaml").read_text())
    check_planned(RunDir(run), written, doc.replan()[1], doc.train)


@pytest.mark.parametrize("extra,said", [
    (["--set", "strategy=zero2", "--resume"], "cannot resume step-4 after this change: strategy changes the "
                                              "checkpoint's format or the data; launch without --resume to start over"),
    (["--set", "gpus=4xCPU"], "changing gpus changes the hardware; plan a new run directory for it"),
    (["--set", "micro_batsh=2"], "--set micro_batsh: unknown key; did you mean micro_batch?"),
    (["--set", "train.lr=x"], "--set: train.lr: Input should be a valid number"),
    (["--set", "micro_batch=2", "--script", "train.py"], "--set re-plans the bundled trainer's run; a --script run "
                                                         "takes its own arguments"),
    (["--set", "micro_batch=2", "--machine-rank", "1"], "--set rewrites the run directory on the head node"),
])
def test_launch_set_refuses_in_one_line_and_changes_nothing(extra, said, written, tmp_path, capsys):
    """`launch RUN --set KEY=VALUE` (the way to change a written run; tests/e2e/test_run_lifecycle.py runs it): what
    it refuses, before any file is rewritten. The run here has a complete checkpoint at step 4."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(written, run)
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    (run / "checkpoints" / "step-4" / "trainer_state.json").write_text(json.dumps({"step": 4, "files": {}}))
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["launch", str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before

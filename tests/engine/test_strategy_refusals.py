"""Issue 29: what launch refuses, plan refuses. TRL's trainers (reward/dpo/grpo) under --strategy fsdp on a CPU host
would train DDP (accelerate drops its FSDP plugin there): `plan`, `--dry-run`, `--plain` and the wizard's plan give
the line launch gives (engine/model/setup.check_objective_strategy, also called by engine/run/configs.check_strategy),
exit 2, nothing written; the same objectives with ddp, and sft with fsdp, still plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.main import main

LINE = ("--objective {obj} runs TRL's trainer, whose accelerate drops FSDP on a CPU host and would train DDP instead; "
        "use --strategy ddp or zero3 on CPU")
PRESETS = {"reward": "cpu-tiny-reward", "dpo": "cpu-tiny-dpo", "grpo": "cpu-tiny-grpo"}


def _launch_line(obj: str, tmp_path) -> str:
    """What launch's preflight says for this objective (engine/run/configs.check_strategy on a CPU host)."""
    from scaletrain.engine.run.configs import check_strategy

    with pytest.raises(ScaletrainError) as e:
        check_strategy(tmp_path / "accelerate_config.yaml", "FSDP", "fsdp", 2, obj, True)
    return str(e.value)


@pytest.mark.parametrize("obj", ["reward", "dpo", "grpo"])
def test_plan_and_dry_run_refuse_trl_objectives_under_fsdp_on_cpu_with_launchs_line(obj, tmp_path, capsys):
    expected = _launch_line(obj, tmp_path)
    assert expected == LINE.format(obj=obj)
    for args in (["plan", "--preset", PRESETS[obj], "--strategy", "fsdp"],
                 ["plan", "--preset", "cpu-tiny", "--objective", obj, "--strategy", "fsdp",
                  *{"dpo": ["--ref-model", "same"], "grpo": ["--completion-len", "64"]}.get(obj, [])],
                 ["--preset", PRESETS[obj], "--strategy", "fsdp", "--headless", "--dry-run", "--run-dir",
                  str(tmp_path / "run")]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err == f"scaletrain: error: {expected}\n", (args, err)
    assert not (tmp_path / "run").exists()
    assert main(["plan", "--preset", PRESETS[obj], "--strategy", "ddp"]) == 0      # the remedy the line names plans
    assert main(["plan", "--preset", "cpu-tiny", "--strategy", "fsdp"]) == 0      # sft: the trainer's own FSDP
    capsys.readouterr()


def test_a_free_strategy_never_picks_fsdp_for_a_trl_objective_on_cpu(capsys):
    import json

    assert main(["plan", "--preset", "cpu-tiny-dpo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["strategy"] != "fsdp"


def test_a_gpu_plan_may_keep_fsdp_for_trl_objectives(capsys):
    """On GPUs accelerate's FSDP plugin serves TRL: not refused."""
    assert main(["plan", "--gpus", "2xH100-SXM", "--model", "scaletrain/tiny-qwen2", "--objective", "dpo",
                 "--ref-model", "same", "--strategy", "fsdp", "--effective-batch", "8"]) == 0
    capsys.readouterr()


def test_plain_refuses_the_objective_at_its_question_and_asks_again(tmp_path):
    answers = ["", "", "", "",        # GPUs (2xCPU), model, weights, method: the preset's
               "dpo", "sft",          # dpo under fsdp on CPU: the line, asked again; sft
               "", "8", "", "", "", "", "", "y", str(tmp_path / "run"), "n"]   # ..., write, where, launch: no
    res = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "--plain", "--preset", "cpu-tiny-dpo",
                          "--strategy", "fsdp"], input="\n".join(answers) + "\n", capture_output=True, text=True,
                         timeout=120, check=False)
    assert f"  ✗ {LINE.format(obj='dpo')}\n" in res.stdout, res.stdout[-2000:]
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    written = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert written["training"]["objective"] == "sft"    # (a changed objective clears the plan step's pins: state.py)


def test_the_wizard_plan_refuses_it_and_writes_nothing(tmp_path):
    from scaletrain.tui.cli.parser import build_parser
    from scaletrain.tui.wizard.state import plan_for, state_from_args

    state = state_from_args(build_parser().parse_args(["--preset", "cpu-tiny-grpo", "--strategy", "fsdp"]))
    with pytest.raises(ScaletrainError) as e:
        plan_for(state, None)
    assert str(e.value) == LINE.format(obj="grpo")
    assert not any(tmp_path.iterdir())

"""Issue 29, build item 1: nothing from a model folder runs. A folder whose config.json and tokenizer_config.json
name custom code (`auto_map`) with a `.py` that writes a marker file when it is imported: `plan --data`, the
headless `--dry-run`, `launch` of a run whose plan.json was edited to point at it, `export` and the wizard's weights
field each refuse it in one line (exit 2), with `y` piped to stdin (transformers' "run the custom code? [y/N]"
would take it), and the marker is never written. Real subprocesses of the CLI, real transformers: the check must
come before anything loads the folder, and the children must get no stdin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from scaletrain.engine.catalog.architectures import catalog_entry
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.remote_code import known_model_types, remote_code_problem

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
TINY = "scaletrain/tiny-qwen2"
EVIL_PY = """import pathlib
pathlib.Path({marker!r}).write_text("the model folder's code ran")
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


class EvilConfig(Qwen2Config):
    model_type = "evilqwen"


class EvilModel(Qwen2ForCausalLM):
    config_class = EvilConfig


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _evil_folder(root: Path, marker: Path, *, in_config: bool = True, in_tokenizer: bool = True,
                 own_type: bool = True) -> Path:
    """tiny-qwen2's config (the planned architecture, so only the custom code is wrong) with weights, a real byte
    tokenizer, and auto_map entries pointing at evil.py."""
    folder = root / "evil-model"
    folder.mkdir(parents=True)
    cfg = dict(catalog_entry(TINY)["config"])
    if in_config:        # a model_type of its own: transformers has no local class, so only evil.py can build it
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
        cfg["model_type"] = "evilqwen" if own_type else cfg["model_type"]
    (folder / "config.json").write_text(json.dumps(cfg))
    tok = {"tokenizer_class": "EvilTokenizer" if in_tokenizer else "PreTrainedTokenizerFast",
           "eos_token": "<eos>", "model_max_length": 2048}
    if in_tokenizer:
        tok["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    (folder / "evil.py").write_text(EVIL_PY.format(marker=str(marker)))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)        # weight files: the folder is a checkpoint
    return folder


def _cli(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_MODULES_CACHE": str(cwd / "hf-modules"), "HF_HUB_OFFLINE": "1"}
    env.pop("SCALETRAIN_DEBUG", None)
    return subprocess.run([*CLI, *argv], input="y\ny\ny\n", capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def _one_line_exit_2(r: subprocess.CompletedProcess, marker: Path) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert len(lines) == 1 and len(lines[0]) <= 500, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not marker.exists(), "the folder's code ran"
    assert not psutil.Process().children(recursive=True), "a child outlived the command"
    return lines[0]


@pytest.fixture
def evil(tmp_path):
    marker = tmp_path / "MARKER"
    folder = _evil_folder(tmp_path, marker)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i} " * 8}) + "\n" for i in range(16)))
    return {"root": tmp_path, "marker": marker, "folder": folder, "data": data}


def test_plan_with_data_refuses_custom_code_before_the_profile_loads_the_tokenizer(evil):
    r = _cli(["plan", "--model", TINY, "--gpus", "2xCPU", "--weights", str(evil["folder"]), "--data",
              str(evil["data"])], evil["root"])
    line = _one_line_exit_2(r, evil["marker"])
    assert "auto_map" in line and "custom code" in line and str(evil["folder"]) in line


def test_headless_dry_run_refuses_custom_code_with_and_without_data(evil):
    out = evil["root"] / "run"
    for extra in ([], ["--data", str(evil["data"])]):
        r = _cli(["--preset", "cpu-tiny", "--weights", str(evil["folder"]), *extra, "--headless", "--dry-run",
                  "--run-dir", str(out)], evil["root"])
        assert "custom code" in _one_line_exit_2(r, evil["marker"])
        assert not out.exists(), "a refused --dry-run wrote the run directory"


@pytest.mark.long
def test_launch_and_export_recheck_weights_edited_into_plan_json(evil):
    run = evil["root"] / "run"
    r = _cli(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(run)], evil["root"])
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((run / "plan.json").read_text())
    doc["train"]["model_source"] = str(evil["folder"])            # edited after it was written
    (run / "plan.json").write_text(json.dumps(doc))
    before = sorted(p.name for p in run.iterdir())
    for argv in (["launch", str(run)], ["export", str(run)]):
        line = _one_line_exit_2(_cli(argv, evil["root"]), evil["marker"])
        assert "auto_map" in line and "plan.json" in line, line
    assert sorted(p.name for p in run.iterdir()) == before        # no status, no logs, no lock left behind


def test_the_trainer_itself_refuses_the_edited_plan(evil):
    """The ranks read plan.json again (trainer/config.read_run_config): a plan edited between the launcher's check
    and a rank's start is refused there too."""
    from scaletrain.trainer.config import read_run_config

    run = evil["root"] / "run"
    r = _cli(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(run)], evil["root"])
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((run / "plan.json").read_text())
    doc["train"]["model_source"] = str(evil["folder"])
    (run / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(ScaletrainError, match="custom code"):
        read_run_config(run)
    assert not evil["marker"].exists()


def test_the_wizards_weights_field_refuses_custom_code(evil):
    from scaletrain.tui.wizard.sources import parse_weights

    with pytest.raises(ScaletrainError, match="auto_map"):
        parse_weights(str(evil["folder"]))
    assert not evil["marker"].exists()


def test_auto_map_in_either_file_alone_is_refused_and_a_clean_folder_passes(tmp_path):
    marker = tmp_path / "MARKER"
    only_tok = _evil_folder(tmp_path / "a", marker, in_config=False)
    only_cfg = _evil_folder(tmp_path / "b", marker, in_tokenizer=False)
    clean = _evil_folder(tmp_path / "c", marker, in_config=False, in_tokenizer=False)
    assert "tokenizer_config.json names custom code" in remote_code_problem(str(only_tok))
    assert "config.json names custom code" in remote_code_problem(str(only_cfg))
    assert remote_code_problem(str(clean)) is None


def test_an_architecture_transformers_does_not_know_is_refused_as_weights(tmp_path):
    folder = tmp_path / "foobar"
    folder.mkdir()
    cfg = dict(catalog_entry(TINY)["config"], model_type="foobarnet")
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    assert known_model_types() is not None and "qwen2" in known_model_types()
    assert "foobarnet" in remote_code_problem(str(folder))


def test_plan_still_counts_a_custom_code_model_from_its_config_json(evil):
    """Planning reads config.json as data: the plan is made and its weights line says they cannot be used."""
    folder = _evil_folder(evil["root"] / "qwen2-type", evil["marker"], own_type=False)
    r = _cli(["plan", "--model", str(folder), "--gpus", "2xCPU"], evil["root"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "custom code" in r.stdout and "Traceback" not in r.stderr
    assert not evil["marker"].exists()


def test_known_model_types_match_what_transformers_itself_maps():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert known_model_types() == frozenset(CONFIG_MAPPING_NAMES)


def test_every_child_the_tool_starts_gets_no_stdin():
    """Source check over src/: every subprocess call names its stdin (DEVNULL, or a pipe it writes with input=)."""
    import re

    src = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
    calls = []
    for p in src.rglob("*.py"):
        text = p.read_text()
        for m in re.finditer(r"subprocess\.(run|Popen|call|check_call|check_output)\(", text):
            depth, i = 0, m.end() - 1
            while True:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            calls.append((p.name, text[m.start():i + 1]))
    assert len(calls) >= 3
    for name, call in calls:
        assert "stdin=" in call or "input=" in call, f"{name}: {call[:200]}"


def test_plain_wizard_refuses_custom_code_weights_and_asks_again(evil):
    """`--plain`: the weights answer naming custom code is refused (✗, the engine's line) and asked again; the
    typed `y` lines that follow are answers to the wizard's questions, never to transformers."""
    run = evil["root"] / "run"
    answers = ["", "Qwen/Qwen2.5-7B-Instruct", str(evil["folder"]), "", "lora", "8", "", "", "", "128", "",
               "1000", "2", "", "2e-4@8", "y", str(run)]
    env = {**os.environ, "HF_MODULES_CACHE": str(evil["root"] / "hf-modules")}
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "--plain", "--gpus", "4xH200"],
                       input="\n".join(answers) + "\n", capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "✗ --weights" in r.stdout and "custom code" in r.stdout
    assert json.loads((run / "plan.json").read_text())["train"]["model_source"] == "Qwen/Qwen2.5-7B-Instruct"
    assert not evil["marker"].exists()

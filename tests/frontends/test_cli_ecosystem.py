"""The CLI as its ecosystem expects (issue 31, item 7, and the CLI part of item 3): every flag says what it does and
its default, a short usage with examples, `plan --keys`, `scaletrain env`, completion scripts that a real bash (and
zsh, fish where installed) runs, exit 3 when the plan does not fit (host RAM named), the alternatives aligned."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.engine.catalog.architectures import catalog_ids
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.devices.detect import host_memory_bytes
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.presets import split_override_key
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.environment import NOT_INSTALLED, PACKAGES, package_version
from scaletrain.engine.run.resources import resource_verdict
from scaletrain.tui.cli.main import main
from scaletrain.tui.cli.parser import build_parser

SRC = str(Path(__file__).resolve().parents[2] / "src")
LLAMA_70B_ON_4090 = ["--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xRTX4090", "--method", "full"]


def _parsers(p: argparse.ArgumentParser, name: str = "scaletrain"):
    yield name, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub_name, sub in a.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_flag_of_every_command_has_help_and_a_stated_default():
    seen = 0
    missing = []
    for name, p in _parsers(build_parser()):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            seen += 1
            where = f"{name} {'/'.join(a.option_strings) or a.dest}"
            if not (a.help or "").strip():
                missing.append(f"{where}: no help")
            elif a.option_strings and "(default: " not in a.help:
                missing.append(f"{where}: no default stated")
    assert not missing, "\n".join(missing)
    assert seen > 150          # the plan options on four commands, plus every command's own


def test_help_has_a_short_usage_grouped_plan_options_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    usage = out.split("\n\n")[0]
    assert usage.count("\n") <= 3 and "[plan options]" in usage and "--micro-batch" not in usage
    for title in ("plan options: hardware", "plan options: batch and data", "examples:", "exit codes:"):
        assert title in out
    assert "3 the plan does not fit" in out
    assert "--host-ram GIB" in out and "--micro-batch B" in out


def test_every_help_fits_an_80_column_terminal_and_its_examples_parse(capsys, monkeypatch):
    """An SSH session's 80 columns: no line of any command's --help runs past them (the top help's examples and
    usage ran to 94, `completion --help` to 176), and each example command is one the parser takes."""
    import shlex

    from scaletrain.tui.cli.parser import COMMANDS, EXAMPLES

    monkeypatch.setenv("COLUMNS", "80")
    for argv in ([], *([c.name] for c in COMMANDS)):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*argv, "--help"])
        long = [ln for ln in capsys.readouterr().out.splitlines() if len(ln) > 80]
        assert not long, (argv, long)
    parsed: list[list[str]] = []
    continued = False
    for ln in (x.strip() for x in EXAMPLES.split("\n\n")[0].splitlines()[1:]):
        if continued:
            parsed[-1] += shlex.split(ln.rstrip("\\"))
        elif ln.startswith("scaletrain"):
            parsed.append(shlex.split(ln.rstrip("\\"))[1:])
        continued = ln.endswith("\\")
    assert len(parsed) >= 7 and parsed[1][-2:] == ["--seq-len", "2048"], parsed
    for argv in parsed:
        build_parser().parse_args(argv)


def test_plan_keys_lists_every_preset_and_set_key_with_its_meaning(capsys):
    assert main(["plan", "--keys", "--json"]) == 0
    keys = json.loads(capsys.readouterr().out)
    by_section = {(k["section"], k["key"]): k for k in keys}
    for section, cls in (("request", PlanRequest), ("train", TrainOptions)):
        for name in cls.__dataclass_fields__:
            k = by_section[(section, name)]
            assert k["meaning"] and k["default"], k
            assert split_override_key(f"{section}.{name}") == (section, name)     # --set takes it
    assert by_section[("request", "host_ram")]["flag"] == "--host-ram"
    assert main(["plan", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "request.micro_batch" in text and "train.keep_checkpoints" in text


def test_70b_full_on_8x4090_with_256_gib_host_ram_does_not_fit_naming_host_ram(capsys):
    assert main(["plan", *LLAMA_70B_ON_4090, "--host-ram", "256"]) == 3
    out = capsys.readouterr().out
    verdict = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert len(verdict) == 1
    assert "does not fit: needs" in verdict[0] and "host RAM per node" in verdict[0] and "256 GiB" in verdict[0]
    assert main(["plan", *LLAMA_70B_ON_4090, "--host-ram", "256", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    res = doc["resources"]
    assert doc["memory"]["fits"] is True                      # the GPUs hold it: host RAM is what binds
    assert res["fits"] is False and res["binding"] == "host_ram"
    host = next(c for c in res["checks"] if c["resource"] == "host_ram")
    assert host["have_bytes"] == 256 * 1024**3
    # the engine's own numbers: the node's GPUs' offloaded states plus rank 0's export
    assert host["need_bytes"] == doc["memory"]["host_bytes_per_gpu"] * 8 + doc["disk"]["export_host_bytes"]


def test_named_gpus_without_host_ram_are_not_judged_on_host_ram(capsys):
    assert main(["plan", *LLAMA_70B_ON_4090, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["resources"]
    host = next(c for c in res["checks"] if c["resource"] == "host_ram")
    assert res["fits"] is True and host["fits"] is None and "--host-ram" in host["where"]
    assert main(["plan", *LLAMA_70B_ON_4090, "--host-ram", "4096"]) == 0
    assert "verdict: fits: GPU memory, host RAM" in capsys.readouterr().out


def test_a_detected_node_is_judged_against_its_own_ram():
    hw = parse_gpus("8xRTX4090")
    hw = type(hw)(gpu=hw.gpu, gpus_per_node=8, source="detected")
    req = PlanRequest(model="meta-llama/Llama-3.1-70B", gpus="8xRTX4090")
    plan = make_plan(req, hardware=hw)
    v = resource_verdict(plan, TrainOptions())
    host = next(c for c in v.checks if c.key == "host_ram")
    assert host.have_bytes == host_memory_bytes() and host.need_bytes > 1000 * 1024**3
    assert v.fits is False and v.binding is host and "this node has" in v.line()


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "lots"])
def test_bad_host_ram_is_bad_input_not_does_not_fit(capsys, value):
    assert main(["plan", *LLAMA_70B_ON_4090, "--host-ram", value]) == 2
    err = capsys.readouterr().err
    assert "--host-ram" in err and err.count("\n") == 1


def test_headless_does_not_launch_a_plan_that_does_not_fit(tmp_path, capsys):
    run = tmp_path / "run"
    code = main([*LLAMA_70B_ON_4090, "--host-ram", "256", "--headless", "--run-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 3
    assert "does not fit: needs" in out and "host RAM" in out and "nothing launched" in out
    assert (run / "launch.sh").exists() and not list((run / "logs").iterdir())


def test_env_reports_versions_without_importing_torch(tmp_path):
    cfg = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("distributed_type: DEEPSPEED\nnum_processes: 8\nmixed_precision: bf16\n"
                   f"deepspeed_config:\n  deepspeed_config_file: {tmp_path / 'missing_ds.json'}\n")
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_secret_value",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    env.pop("ACCELERATE_CONFIG_FILE", None)
    code = ("import sys, json; from scaletrain.tui.cli.main import main; rc = main(['env', '--json']); "
            "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'deepspeed', 'accelerate', 'peft', 'trl', "
            "'textual') if m in sys.modules), file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["packages"]) == set(PACKAGES)
    assert doc["packages"]["torch"] == package_version("torch")
    assert doc["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(doc["gpus"]["gpus"], list)               # no GPU is an answer, not an error
    acc = doc["accelerate_config"]
    assert acc["found"] and acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 8
    assert acc["deepspeed_config_found"] is False
    assert doc["environment"]["HF_TOKEN"] == "set (hidden)" and "hf_secret_value" not in r.stdout
    assert doc["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    text = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "env"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert text.returncode == 0 and "- torch version: " in text.stdout and "DeepSpeed config: " in text.stdout
    assert package_version("no-such-distribution-scaletrain") == NOT_INSTALLED


def _script(shell: str) -> str:
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "completion", shell], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _bash_complete(script: Path, *words: str, cwd: Path | None = None) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    cmd = (f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); _scaletrain; "
           'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", cmd], capture_output=True, text=True, timeout=60,
                       cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completion_sourced_in_bash_completes_commands_flags_choices_presets_and_models(tmp_path):
    script = tmp_path / "scaletrain.bash"
    script.write_text(_script("bash"))
    assert "plan" in _bash_complete(script, "scaletrain", "")
    assert _bash_complete(script, "scaletrain", "comp") == ["completion"]
    assert _bash_complete(script, "scaletrain", "plan", "--host") == ["--host-ram"]
    assert _bash_complete(script, "scaletrain", "plan", "--strategy", "") == ["ddp", "zero1", "zero2", "zero3", "fsdp"]
    assert {"h200x4-fast", "4090x8"} <= set(_bash_complete(script, "scaletrain", "--preset", ""))
    assert set(_bash_complete(script, "scaletrain", "plan", "--model", "")) == set(catalog_ids())
    assert "8xRTX4090" in _bash_complete(script, "scaletrain", "plan", "--gpus", "8x")
    assert _bash_complete(script, "scaletrain", "config", "") == ["write"]
    assert _bash_complete(script, "scaletrain", "config", "write", "--install") == ["--install-default"]
    assert _bash_complete(script, "scaletrain", "completion", "") == ["bash", "zsh", "fish"]
    # a flag's value is not a command: `--model plan` leaves the top level, `--table` is plan's
    assert _bash_complete(script, "scaletrain", "--gpus", "auto", "plan", "--tab") == ["--table"]
    (tmp_path / "chat.jsonl").write_text("{}\n")
    assert _bash_complete(script, "scaletrain", "plan", "--data", "ch", cwd=tmp_path) == ["chat.jsonl"]
    assert _bash_complete(script, "scaletrain", "plan", "--micro-batch", "") == []


@pytest.mark.parametrize("shell,check", [("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])])
def test_zsh_and_fish_scripts_are_valid_syntax(tmp_path, shell, check):
    if shutil.which(check[0]) is None:
        pytest.skip(f"{shell} is not installed here (apt-get install {shell})")
    script = tmp_path / f"scaletrain.{shell}"
    script.write_text(_script(shell))
    r = subprocess.run([*check, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if shell == "fish":
        r = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C'scaletrain plan --strategy '"],
                           capture_output=True, text=True, timeout=60)
        assert [line.split("\t")[0] for line in r.stdout.splitlines()] == ["ddp", "fsdp", "zero1", "zero2", "zero3"]


def test_a_cpu_plans_tables_say_per_process_and_a_gpu_plans_per_gpu(capsys):
    """The alternatives and the micro-batch table headed their memory column "per GPU" on a CPU plan, whose every
    other line says "per process": the column follows the plan's device noun."""
    assert main(["plan", "--preset", "cpu-tiny", "--alternatives", "--table", "batch"]) == 0
    out = capsys.readouterr().out
    assert "per GPU" not in out and "per-GPU" not in out
    assert out.count("  per process  ") == 2 and "micro batch vs per-process memory" in out
    assert " per process; * this plan" in out
    assert main(["plan", "--preset", "4090x8", "--alternatives", "--table", "batch"]) == 0
    out = capsys.readouterr().out
    assert out.count("  per GPU  ") == 2 and "per process" not in out and " per GPU; * this plan" in out


def test_alternatives_table_columns_line_up(capsys):
    assert main(["plan", "--preset", "4090x8", "--alternatives", "--table", "batch"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for header_word, last in (("strategy", "tokens/s"), ("accum", "tokens/s")):
        h = next(i for i, line in enumerate(lines) if header_word in line and last in line)
        header = lines[h]
        rows = []
        for line in lines[h + 2:]:
            if not line[:1].strip() and not line.strip():
                break
            if not any(ch.isdigit() for ch in line[:6]):
                break
            rows.append(line)
        assert len(rows) >= 3
        end = header.index(last) + len(last)
        for row in rows:                         # the right-aligned last column ends where its header does
            assert len(row.rstrip()) == end, (header, row)
        if header_word == "strategy":            # a left-aligned column starts where its header does
            start = header.index("strategy")
            assert all(row[start - 1] == " " and row[start] != " " for row in rows), rows

"""Issue 14, done-when 1: malformed input, replayed as a hostile new user would type it. Every case must exit 2 with
one line on stderr ("scaletrain: error: …"), print no traceback and write no file anywhere under the sandbox (the
working directory, HOME, the HF cache and the config dir all live there).

The cases run in-process through the CLI's main() with SCALETRAIN_DEBUG=1, so an exception no check foresaw is not
softened into a line by the catch-all: it fails the test with its traceback. A few run as real subprocesses too,
without the debug flag, to see exactly what a terminal would show. And the YAML bomb: refused fast, in little memory,
with a short line. (What must *not* be an error, such as junk lines among step records: test_hostile_monitor.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaletrain.engine.catalog.architectures import catalog_entry
from scaletrain.engine.devices.detect import visible_gpu_count
from scaletrain.tui.cli.main import main

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
TINY = "scaletrain/tiny-qwen2"
BOMB_LEVELS = 9          # 9 aliases of 9 aliases … : 9**9 ≈ 387 million strings once expanded


def _bomb(levels: int = BOMB_LEVELS) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\ndescription: bomb\nrequest: {{model: *l{levels - 1}}}\n"


def _config(folder: Path, **changes: object) -> str:
    """A copy of tiny-qwen2's config.json with some fields changed (written as raw JSON: Infinity and NaN too)."""
    cfg = dict(catalog_entry(TINY)["config"])
    cfg.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def _run_dir(root: Path, name: str, preset: str = "cpu-tiny", *extra: str) -> Path:
    d = root / name
    assert main(["--preset", preset, "--headless", "--dry-run", "--run-dir", str(d), *extra]) == 0
    return d


def _edit_plan(d: Path, edit) -> str:
    doc = json.loads((d / "plan.json").read_text())
    edit(doc)
    (d / "plan.json").write_text(json.dumps(doc))
    return str(d)


def _readonly_dir(path: Path) -> Path | None:
    """An empty directory no one can write into: a read-only tmpfs (root ignores permission bits), else 0o555."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return path
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True)
    return path if r.returncode == 0 else None


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Every file the cases point at, built once; the cases then must leave this tree exactly as it is."""
    root = tmp_path_factory.mktemp("hostile")
    fx = root / "fx"
    fx.mkdir()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        f: dict[str, object] = {"root": root}
        f["heads0"] = _config(fx / "heads0", num_attention_heads=0)
        f["hinf"] = _config(fx / "hinf", hidden_size=float("inf"))
        f["hdneg"] = _config(fx / "hdneg", head_dim=-8)
        f["layers"] = _config(fx / "layers", num_hidden_layers=10**6)
        f["kv3"] = _config(fx / "kv3", num_key_value_heads=3)
        f["vnan"] = _config(fx / "vnan", vocab_size=float("nan"))
        f["hfloat"] = _config(fx / "hfloat", hidden_size=64.5)
        f["hstr"] = _config(fx / "hstr", hidden_size="abc")
        f["hbig"] = _config(fx / "hbig", hidden_size=10**10)
        f["hbool"] = _config(fx / "hbool", hidden_size=True)
        f["inter0"] = _config(fx / "inter0", intermediate_size=0)
        f["indivisible"] = _config(fx / "indivisible", hidden_size=66, head_dim=None)
        f["unknown_type"] = _config(fx / "unknown_type", model_type="foobarnet")   # transformers' long refusal
        (fx / "list").mkdir()
        (fx / "list" / "config.json").write_text("[1, 2]")
        f["list"] = str(fx / "list")
        (fx / "binary").mkdir()
        (fx / "binary" / "config.json").write_bytes(bytes(range(256)) * 4)
        f["binary"] = str(fx / "binary")
        (fx / "empty").mkdir()
        (fx / "empty" / "config.json").write_text("")
        f["empty"] = str(fx / "empty")
        (fx / "noconfig").mkdir()
        f["noconfig"] = str(fx / "noconfig")
        hub = root / "home" / ".cache" / "huggingface" / "hub" / "models--acme--broken" / "snapshots" / "abc"
        hub.mkdir(parents=True)
        (hub / "config.json").write_text('{"hidden_size": 64, "num_hidden_')           # a torn download
        (fx / "bomb.yaml").write_text(_bomb())
        (fx / "bomb4.yaml").write_text(_bomb(4))                                     # small enough to validate
        (fx / "deep.yaml").write_text("description: deep\nrequest: " + "[" * 5000 + "]" * 5000 + "\n")
        (fx / "huge.yaml").write_text("description: huge\n# " + "x" * (2 << 20) + "\nrequest: {model: m}\n")
        (fx / "binary.yaml").write_bytes(b"\xff\xfe\x00" * 100)
        (fx / "list.yaml").write_text("- 1\n- 2\n")
        (fx / "typo.yaml").write_text(f"description: typo\nrequest:\n  model: {TINY}\n  micro_bach: 2\n")
        (fx / "dir.yaml").mkdir()
        (fx / "afile").write_text("not a run directory\n")
        (fx / "loop").symlink_to(fx / "loop")                                        # unreadable even for root
        (fx / "plan-binary.json").write_bytes(bytes(range(256)))
        (fx / "plan-list.json").write_text("[]")
        (fx / "samples.jsonl").write_text('[1, 2]\nnull\n')

        runs = root / "runs"
        good = _run_dir(runs, "good")
        f["good"] = str(good)
        f["gpu"] = str(_run_dir(runs, "gpu", "h200x4-fast"))
        for name, edit in {
            "pj_list": lambda d: d.clear(),
            "lr_str": lambda d: d["train"].update(lr="abc"),
            "train_list": lambda d: d.update(train=[1]),
            "train_unknown": lambda d: d["train"].update(warp=9),
            "batch_null": lambda d: d.update(batch=None),
            "steps_neg": lambda d: d["train"].update(max_steps=-1),
            "lr_nan": lambda d: d["train"].update(lr=float("nan")),
        }.items():
            d = runs / name
            shutil.copytree(good, d)
            _edit_plan(d, edit)
            f[name] = str(d)
        (runs / "pj_list" / "plan.json").write_text("[]")
        for name, text in (("pj_null", "null"), ("pj_trunc", '{"hardware": {"gpu": ')):
            shutil.copytree(good, runs / name)
            (runs / name / "plan.json").write_text(text)
            f[name] = str(runs / name)
        shutil.copytree(good, runs / "pj_bin")
        (runs / "pj_bin" / "plan.json").write_bytes(bytes(range(256)) * 8)
        f["pj_bin"] = str(runs / "pj_bin")
        shutil.copytree(good, runs / "pj_dir")
        (runs / "pj_dir" / "plan.json").unlink()
        (runs / "pj_dir" / "plan.json").mkdir()
        for name, layout, make in (("logs_file", "logs", "file"), ("ckpt_file", "checkpoints", "file"),
                                   ("status_dir", "status.json", "dir")):
            d = runs / name
            shutil.copytree(good, d)
            p = d / layout
            if p.is_dir():
                p.rmdir()
            p.write_text("x") if make == "file" else p.mkdir()
            f[name] = str(d)
        for name, text in (("yaml_bomb", _bomb()), ("yaml_list", "- 1\n")):
            shutil.copytree(good, runs / name)
            (runs / name / "accelerate_config.yaml").write_text(text)
            f[name] = str(runs / name)
        for name, file, text in (("status_list", "status.json", "[1, 2]"), ("metrics_junk", "metrics.jsonl",
                                 'null\n[1]\n{"step": "x"}\n"s"\n'), ("noplan", "plan.json", None)):
            shutil.copytree(good, runs / name)               # issue 23's monitor cases
            (runs / name / file).write_text(text) if text is not None else (runs / name / file).unlink()
            f[name] = str(runs / name)
        (fx / "plan-empty.json").write_text('{"hardware": {}, "training": {}, "batch": {}, "memory": {}}')
        shutil.copytree(good, runs / "yaml_missing")
        (runs / "yaml_missing" / "accelerate_config.yaml").unlink()
        f["yaml_missing"] = str(runs / "yaml_missing")
        local = root / "with-local" / "presets-local"
        local.mkdir(parents=True)
        (local / "bomb.yaml").write_text(_bomb())
        f["readonly"] = _readonly_dir(root / "readonly")
        f["readonly_hf"] = _readonly_dir(root / "readonly-hf")
        yield f
    finally:
        os.chdir(cwd)
        for key in ("readonly", "readonly_hf"):
            p = root / key.replace("_", "-")
            if os.geteuid() == 0:
                subprocess.run(["umount", str(p)], capture_output=True)
            elif p.exists():
                p.chmod(0o755)


def _cases(f: dict) -> list[tuple[str, list[str], str]]:
    """(id, argv, a word the one line must hold) for every malformed input."""
    fx = Path(f["root"]) / "fx"
    plan = ["plan", "--gpus", "2xCPU", "--model"]
    tiny = ["plan", "--model", TINY, "--gpus", "2xCPU"]
    dry = ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(Path(f["root"]) / "out")]
    cases = [
        # ---- a config.json that is not a sane causal LM (plan time) ----------------------------------------
        ("heads0", [*plan, f["heads0"]], "num_attention_heads"),
        ("hidden_inf", [*plan, f["hinf"]], "hidden_size"),
        ("head_dim_neg", [*plan, f["hdneg"]], "head_dim"),
        ("layers_1e6", [*plan, f["layers"]], "num_hidden_layers"),
        ("kv_not_dividing", [*plan, f["kv3"]], "num_key_value_heads"),
        ("vocab_nan", [*plan, f["vnan"]], "vocab_size"),
        ("hidden_float", [*plan, f["hfloat"]], "hidden_size"),
        ("hidden_str", [*plan, f["hstr"]], "hidden_size"),
        ("hidden_1e10", [*plan, f["hbig"]], "hidden_size"),
        ("hidden_bool", [*plan, f["hbool"]], "hidden_size"),
        ("intermediate_0", [*plan, f["inter0"]], "intermediate_size"),
        ("heads_not_dividing_hidden", [*plan, f["indivisible"]], "not divisible"),
        ("config_list", [*plan, f["list"]], "config.json object"),
        ("config_binary", [*plan, f["binary"]], "JSON config.json"),
        ("config_empty", [*plan, f["empty"]], "JSON config.json"),
        ("folder_without_config", [*plan, f["noconfig"]], "without a config.json"),
        ("hf_cache_torn_config", [*plan, "acme/broken"], "JSON config.json"),
        ("model_10000_chars", [*plan, "m" * 10_000], "characters long"),
        ("model_300_chars", [*plan, "m" * 300], "not a usable path"),
        ("model_empty", [*plan, ""], "--model"),
        ("model_unknown", [*plan, "nobody/nothing"], "unknown model"),
        ("resident_empty", [*plan, TINY, "--resident", ""], "--resident"),
        # ---- request values: finite, positive, bounded --------------------------------------------------------
        ("epochs_inf", [*tiny, "--epochs", "inf", "--dataset-size", "1000"], "--epochs"),
        ("epochs_nan", [*tiny, "--epochs", "nan"], "--epochs"),
        ("epochs_negative", [*tiny, "--epochs", "-1"], "--epochs"),
        ("epochs_1e9", [*tiny, "--epochs", "1e9"], "--epochs"),
        ("headroom_nan", [*tiny, "--headroom", "nan"], "--headroom"),
        ("headroom_1", [*tiny, "--headroom", "1"], "--headroom"),
        ("base_lr_inf", [*tiny, "--base-lr", "inf", "--base-batch", "8"], "--base-lr"),
        ("base_lr_negative", [*tiny, "--base-lr", "-1", "--base-batch", "8"], "--base-lr"),
        ("inter_node_negative", [*tiny, "--nodes", "2", "--inter-node-gbps=-5"], "--inter-node-gbps"),
        ("inter_node_nan", [*tiny, "--nodes", "2", "--inter-node-gbps", "nan"], "--inter-node-gbps"),
        ("inter_node_1e12", [*tiny, "--nodes", "2", "--inter-node-gbps", "1e12"], "--inter-node-gbps"),
        ("inter_node_word", [*tiny, "--nodes", "2", "--inter-node-gbps", "fast"], "--inter-node-gbps"),
        ("effective_batch_1e15", [*tiny, "--effective-batch", str(10**15)], "--effective-batch"),
        ("nodes_1e9", ["plan", "--model", TINY, "--gpus", "8xH100", "--nodes", str(10**9)], "--nodes"),
        ("gpus_1e11_per_node", ["plan", "--model", TINY, "--gpus", f"{10**11}xH100"], "not a machine"),
        ("gpus_1e8_nodes", ["plan", "--model", TINY, "--gpus", f"{10**8}x8xH100"], "nodes"),
        ("cpu_processes_5000", ["plan", "--model", TINY, "--gpus", "5000xCPU"], "CPU processes"),
        ("gpus_empty", ["plan", "--model", TINY, "--gpus", ""], "--gpus"),
        ("gpus_10000_chars", ["plan", "--model", TINY, "--gpus", "x" * 10_000], "--gpus"),
        ("seq_len_0", [*tiny, "--seq-len", "0"], "--seq-len"),
        ("seq_len_1e12", [*tiny, "--seq-len", str(10**12)], "--seq-len"),
        ("micro_batch_negative", [*tiny, "--micro-batch", "-1"], "--micro-batch"),
        ("dataset_size_1e20", [*tiny, "--dataset-size", str(10**20)], "--dataset-size"),
        ("lora_rank_1e9", [*tiny, "--method", "lora", "--lora-rank", str(10**9)], "--lora-rank"),
        ("tokens_per_sample_0", [*tiny, "--tokens-per-sample", "0"], "--tokens-per-sample"),
        ("method_unknown", [*tiny, "--method", "x" * 5000], "invalid choice"),
        ("set_without_preset", [*tiny, "--set", "micro_batch=2"], "--preset"),
        ("set_yaml_bomb", ["plan", "--preset", "cpu-tiny", "--set",
                           "model=[&a [1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a], [*b,*b,*b,*b,*b,*b,*b,*b]]"],
         "request.model"),
        # ---- presets ---------------------------------------------------------------------------------------------
        ("preset_yaml_bomb", ["plan", "--preset", str(fx / "bomb.yaml")], "refused"),
        ("preset_small_bomb", ["plan", "--preset", str(fx / "bomb4.yaml")], "request.model"),
        ("preset_deep_nesting", ["plan", "--preset", str(fx / "deep.yaml")], "refused"),
        ("preset_2mb", ["plan", "--preset", str(fx / "huge.yaml")], "KiB"),
        ("preset_binary", ["plan", "--preset", str(fx / "binary.yaml")], "preset file"),
        ("preset_list", ["plan", "--preset", str(fx / "list.yaml")], "mapping"),
        ("preset_directory", ["plan", "--preset", str(fx / "dir.yaml")], "not a file"),
        ("preset_10000_chars", ["plan", "--preset", "p" * 10_000], "--preset"),
        ("save_preset_bad_name", [*dry, "--save-preset", "../evil"], "preset name"),
        # ---- train options and run directories at --dry-run ------------------------------------------------------
        ("run_dir_empty", ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", ""], "--run-dir"),
        ("run_dir_newline", ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", "a\ntouch x"],
         "--run-dir"),
        ("run_dir_is_a_file", ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(fx / "afile")],
         "not a directory"),
        ("max_steps_negative", [*dry, "--set", "train.max_steps=-1"], "max_steps"),
        ("checkpoint_every_0", [*dry, "--set", "train.checkpoint_every=0"], "checkpoint_every"),
        ("lr_nan", [*dry, "--set", "train.lr=.nan"], "lr"),
        ("lr_text", [*dry, "--set", "train.lr=abc"], "lr"),
        ("warmup_ratio_5", [*dry, "--set", "train.warmup_ratio=5"], "warmup_ratio"),
        ("weight_decay_negative", [*dry, "--set", "train.weight_decay=-1"], "weight_decay"),
        ("lora_dropout_1_5", [*dry, "--set", "train.lora_dropout=1.5"], "lora_dropout"),
        ("seed_negative", [*dry, "--set", "train.seed=-1"], "seed"),
        ("dataset_missing", [*dry, "--set", "train.dataset=/nonexistent/d.jsonl"], "does not exist"),
        ("set_unknown_key", [*dry, "--set", "warp_speed=9"], "unknown key"),
        # ---- launch: what is not a run directory, or a damaged one ----------------------------------------------
        ("launch_a_file", ["launch", str(fx / "afile")], "not a run directory"),
        ("launch_nowhere", ["launch", str(fx / "nowhere")], "no plan.json"),
        ("launch_empty", ["launch", ""], "RUN_DIR"),
        ("plan_json_list", ["launch", f["pj_list"]], "JSON object"),
        ("plan_json_null", ["launch", f["pj_null"]], "JSON object"),
        ("plan_json_binary", ["launch", f["pj_bin"]], "binary"),
        ("plan_json_truncated", ["launch", f["pj_trunc"]], "not valid JSON"),
        ("plan_json_directory", ["launch", str(Path(f["root"]) / "runs" / "pj_dir")], "directory"),
        ("logs_is_a_file", ["launch", f["logs_file"]], "logs"),
        ("checkpoints_is_a_file", ["launch", f["ckpt_file"]], "checkpoints"),
        ("status_is_a_directory", ["launch", f["status_dir"]], "status.json"),
        ("train_lr_text", ["launch", f["lr_str"]], "lr"),
        ("train_lr_nan", ["launch", f["lr_nan"]], "lr"),
        ("train_max_steps_negative", ["launch", f["steps_neg"]], "max_steps"),
        ("train_section_list", ["launch", f["train_list"]], "train options"),
        ("train_unknown_option", ["launch", f["train_unknown"]], "unknown train option"),
        ("batch_section_null", ["launch", f["batch_null"]], "not a scaletrain plan"),
        ("accelerate_yaml_bomb", ["launch", f["yaml_bomb"]], "refused"),
        ("accelerate_yaml_list", ["launch", f["yaml_list"]], "accelerate config"),
        ("accelerate_yaml_missing", ["launch", f["yaml_missing"]], "missing"),
        ("machine_rank_negative", ["launch", f["good"], "--machine-rank", "-1"], "--machine-rank"),
        ("args_without_script", ["launch", f["good"], "--", "stray"], "--script"),
        ("script_missing", ["launch", f["good"], "--script", str(fx / "missing.py")], "does not exist"),
        # ---- monitor, diagnose, validate, config, presets ---------------------------------------------------------
        ("monitor_a_file", ["monitor", str(fx / "afile"), "--headless", "--once"], "not a directory"),
        # (a run directory that does not exist yet is waited for: tests/frontends/test_monitor_layout.py)
        ("monitor_replay_junk", ["monitor", f["good"], "--headless", "--once", "--replay", str(fx / "samples.jsonl")],
         "not a recorded sample"),
        ("monitor_replay_directory", ["monitor", f["good"], "--headless", "--once", "--replay", str(fx)],
         "cannot read recorded samples"),
        ("monitor_interval_0", ["monitor", f["good"], "--headless", "--once", "--interval", "0"], "--interval"),
        ("monitor_interval_nan", ["monitor", f["good"], "--headless", "--once", "--interval", "nan"], "--interval"),
        ("diagnose_plan_directory", ["diagnose", str(fx / "afile"), "--plan", f["good"]], "directory"),
        ("diagnose_plan_unreadable", ["diagnose", str(fx / "afile"), "--plan", str(fx / "loop")], "cannot read"),
        ("diagnose_plan_binary", ["diagnose", str(fx / "afile"), "--plan", str(fx / "plan-binary.json")], "binary"),
        ("diagnose_plan_list", ["diagnose", str(fx / "afile"), "--plan", str(fx / "plan-list.json")], "JSON object"),
        ("diagnose_log_unreadable", ["diagnose", str(fx / "loop")], "cannot read"),
        ("diagnose_log_missing", ["diagnose", str(fx / "missing.log")], "does not exist"),
        ("diagnose_not_a_run_dir", ["diagnose", str(fx / "noconfig")], "not a run directory"),
        ("diagnose_bad_exit_code", ["diagnose", str(fx / "afile"), "--exit-code", "x"], "RANK=CODE"),
        ("validate_steps_negative", ["validate", "--preset", "cpu-tiny", "--steps", "-5"], "--steps"),
        ("validate_run_dir_empty", ["validate", "--preset", "cpu-tiny", "--run-dir", ""], "--run-dir"),
        ("config_without_action", ["config"], "write"),
        # ---- issue 23: the last bad inputs ------------------------------------------------------------------------
        ("monitor_once_nowhere", ["monitor", str(fx / "nowhere"), "--headless", "--once"], "does not exist"),
        ("monitor_status_list", ["monitor", f["status_list"], "--headless", "--once"], "JSON list"),
        ("monitor_without_plan", ["monitor", f["noplan"], "--headless", "--once"], "no plan.json"),
        ("monitor_plan_not_json", ["monitor", f["pj_trunc"], "--headless", "--once"], "not valid JSON"),
        ("monitor_metrics_all_junk", ["monitor", f["metrics_junk"], "--headless", "--once"], "step record"),
        ("plain_and_headless", ["--plain", "--headless", "--preset", "cpu-tiny"], "--plain"),
        ("lora_targets_comma", [*tiny, "--method", "lora", "--lora-targets", ","], "--lora-targets"),
        ("diagnose_plan_empty_sections", ["diagnose", str(fx / "afile"), "--plan", str(fx / "plan-empty.json")],
         "hardware"),
        ("model_type_unknown_to_transformers", [*plan, f["unknown_type"]], "could not be traced"),
        ("set_unknown_key_nearest", [*dry, "--set", "micro_bach=2"], "did you mean micro_batch"),
        ("preset_unknown_key_nearest", ["plan", "--preset", str(fx / "typo.yaml")], "did you mean micro_batch"),
    ]
    if visible_gpu_count()[0] < 8:          # a GPU plan on a machine without its GPUs (it once ran on CPU)
        cases += [("gpu_plan_on_cpu_machine", ["launch", f["gpu"]], "GPUs per node"),
                  ("validate_gpu_plan_on_cpu", ["validate", "--model", "Qwen/Qwen3-4B", "--gpus", "8xH100"],
                   "GPUs per node")]
    if f["readonly"] is not None:
        cases.append(("run_dir_parent_read_only",
                      ["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(Path(f["readonly"]) / "r")],
                      "cannot write"))
    if f["readonly_hf"] is not None:
        cases.append(("install_default_read_only", ["config", "write", "--preset", "cpu-tiny", "--run-dir",
                                                    str(Path(f["root"]) / "cfg-out"), "--install-default"],
                      "cannot write accelerate's default config"))
    return cases


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.is_dir())
    return out


@pytest.fixture()
def hostile_env(sandbox, monkeypatch):
    root = Path(sandbox["root"])
    monkeypatch.chdir(root)
    monkeypatch.setenv("HOME", str(root / "home"))
    for var in ("HF_HUB_CACHE", "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(sandbox["readonly_hf"] or root / "home" / ".cache" / "huggingface"))
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")         # an unforeseen exception fails the test with its traceback
    return sandbox


@pytest.mark.long
def test_every_malformed_input_is_one_line_exit_2_and_writes_nothing(hostile_env, capsys):
    root = Path(hostile_env["root"])
    cases = _cases(hostile_env)
    assert len(cases) >= 60
    failures = []
    for case_id, argv, needle in cases:
        before = _tree(root)
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        problems = []
        if code != 2:
            problems.append(f"exit {code}")
        if len(lines) != 1 or not lines[0].startswith("scaletrain: error: "):
            problems.append(f"stderr not one error line: {err[:300]!r}")
        elif needle not in lines[0]:
            problems.append(f"{needle!r} not in {lines[0][:300]!r}")
        if "Traceback" in err + out or "unexpected" in err:
            problems.append("a traceback or an unexpected exception")
        if len(err) > 700:
            problems.append(f"a {len(err)}-character line")
        after = _tree(root)
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))[:3]
            problems.append(f"files changed: {changed}")
        if problems:
            failures.append(f"{case_id}: {'; '.join(problems)}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_the_presets_listing_refuses_a_bomb_in_presets_local_in_one_line(hostile_env, monkeypatch, capsys):
    monkeypatch.chdir(Path(hostile_env["root"]) / "with-local")
    assert main(["presets"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bomb.yaml is refused" in err


@pytest.mark.long
def test_a_terminal_sees_one_line_and_no_traceback(sandbox, tmp_path):
    """The real binary, no debug flag: what a user's terminal shows for a few of the cases."""
    fx = Path(sandbox["root"]) / "fx"
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("SCALETRAIN_DEBUG", None)
    for argv in (["plan", "--gpus", "2xCPU", "--model", sandbox["heads0"]],
                 ["plan", "--gpus", "2xCPU", "--model", "m" * 10_000],
                 ["launch", str(fx / "afile")],
                 ["diagnose", str(fx / "afile"), "--plan", sandbox["good"]],
                 ["monitor", sandbox["good"], "--headless", "--once", "--interval", "-1"],
                 ["plan", "--preset", str(fx / "bomb.yaml")]):
        r = subprocess.run([*CLI, *argv], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert r.returncode == 2, (argv[:3], r.stderr[-2000:])
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("scaletrain: error: "), r.stderr[-2000:]
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_the_yaml_bomb_is_refused_fast_in_little_memory(sandbox, tmp_path):
    """The issue: ~1 GB of memory and a 312 MB error line. Now: a short line, quickly, in a small process."""
    # VmHWM: this process's own peak (ru_maxrss would carry over the forking pytest's, exec or not)
    script = ("import sys; from scaletrain.tui.cli.main import main; code = main(sys.argv[1:]); "
              "print(next(ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM'))); "
              "sys.exit(code)")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script, "plan", "--preset", str(Path(sandbox["root"]) / "fx" /
                                                                               "bomb.yaml")],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2 and len(r.stderr) < 400 and "is refused: more than" in r.stderr, r.stderr[:500]
    peak_kib = int(r.stdout.split()[-1])
    assert peak_kib < 300 * 1024, f"{peak_kib} KiB peak"          # the interpreter and its imports, no expansion
    assert took < 30


SRUN_STANDIN = """\
#!{python}
# Stand-in for srun: run the task's command line as its node's shell would, with `exec` recording the words it
# would run (nothing is executed beyond the shell's own expansion).
import os, subprocess, sys
inner = sys.argv[-1]
env = dict(os.environ, SLURM_NODEID="0", SLURM_PROCID="0")
subprocess.run(["bash", "-c", 'exec() {{ printf "%s\\\\n" "$@" > "$ARGV_OUT.srun"; }}; ' + inner], env=env, check=True)
"""
SCONTROL_STANDIN = "#!/bin/sh\necho 127.0.0.1\n"


def test_names_that_look_like_shell_run_nothing_from_launch_sh_or_sbatch_sh(tmp_path, monkeypatch):
    """A run directory named with $(…), backticks, ; and quotes, and a model folder whose name holds a newline and
    a command: both scripts are executed for real (exec and srun stood in for), and no command runs."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    model = Path(_config(tmp_path / "models" / "tiny\ntouch m4 #"))
    run_dir = tmp_path / "runs" / "r$(touch m1)`touch m2`;touch m3;'\"x"
    assert main(["--model", str(model), "--gpus", "2xCPU", "--nodes", "2", "--main-process-ip", "127.0.0.1",
                 "--precision", "fp32", "--headless", "--dry-run", "--run-dir", str(run_dir)]) == 0
    launch_sh, sbatch_sh = run_dir / "launch.sh", run_dir / "sbatch.sh"
    head = launch_sh.read_text().split("set -euo pipefail")[0]
    assert all(line.startswith("#") for line in head.splitlines()) and "tiny?touch m4 #" in head
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN_STANDIN.format(python=sys.executable)), ("scontrol", SCONTROL_STANDIN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "argv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", ARGV_OUT=str(out), SLURM_JOB_NODELIST="n[1-2]",
               SCALETRAIN_VENV=sys.prefix)
    r = subprocess.run(["bash", "-c", 'exec() { printf "%s\\n" "$@" > "$ARGV_OUT"; }; source "$1" 1 127.0.0.1',
                        "_", str(launch_sh)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    words = out.read_text().splitlines()
    assert "--config_file" in words and str(run_dir / "accelerate_config.yaml") in words
    assert words[words.index("--machine_rank") + 1] == "1"
    r = subprocess.run(["bash", str(sbatch_sh)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"logs in {run_dir / 'logs'}/node-<N>.log" in r.stdout            # the folder, found at run time
    words = Path(f"{out}.srun").read_text().splitlines()
    assert str(run_dir / "accelerate_config.yaml") in words and words[words.index("--machine_rank") + 1] == "0"
    assert words[words.index("--main_process_ip") + 1] == "127.0.0.1"
    planted = [p for p in tmp_path.rglob("*") if p.name in ("m1", "m2", "m3", "m4")]
    assert planted == [] and list(work.iterdir()) == []


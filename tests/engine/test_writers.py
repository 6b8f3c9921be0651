"""Config writers: every written file goes through accelerate's and DeepSpeed's own parsers.

The parsers run in one subprocess per module (deepspeed.runtime.config needs a torch.distributed group to take a
world size; keeping that out of the pytest process leaves other tests undisturbed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from scaletrain.engine.catalog.hardware import host_cores, threads_per_process
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.states import (DS_ALLGATHER_BUCKET_ELEMS, DS_PREFETCH_BUCKET_ELEMS, DS_REDUCE_BUCKET_ELEMS,
                                      DS_SUB_GROUP_ELEMS)
from scaletrain.engine.request.presets import load_preset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.scripts import launch_argv
from scaletrain.engine.run import configs
from scaletrain.engine.run import writers
from scaletrain.tui.cli.main import main

# ---- the parser harness (shared with test_headless_dryrun.py) ----------------------------------------------------
_PARSE_SCRIPT = textwrap.dedent(r'''
    import json, os, sys, tempfile, warnings, logging
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch.distributed as tdist
    import deepspeed.comm as dscomm
    import deepspeed.runtime.constants as ds_constants
    import deepspeed.runtime.zero.config as zero_mod
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser, _validate_launch_command
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    from accelerate.utils import DeepSpeedPlugin

    store = tempfile.mktemp()
    tdist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    from scaletrain.trainer.distributed import load_deepspeed_cpu_comm_op
    load_deepspeed_cpu_comm_op()        # as the trainer does: a killed build's stale lock cannot hang this
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)

    class MPU:  # DeepSpeed takes the data-parallel world size from an mpu; this is the plan's world size
        def __init__(self, n): self.n = n
        def get_data_parallel_world_size(self): return self.n
        def get_data_parallel_rank(self): return 0

    KNOWN_TOP = {v for k, v in vars(ds_constants).items() if k.isupper() and isinstance(v, str)}
    KNOWN_TOP |= {"zero_optimization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}

    def device(offload):
        return None if offload is None else str(getattr(offload.device, "value", offload.device))

    def parse(run_dir, world):
        out = {}
        yml = os.path.join(run_dir, "accelerate_config.yaml")
        cfg = load_config_from_file(yml)                      # rejects unknown keys
        out["cluster"] = {"distributed_type": str(cfg.distributed_type.value), "num_processes": cfg.num_processes,
                          "num_machines": cfg.num_machines, "mixed_precision": cfg.mixed_precision,
                          "use_cpu": cfg.use_cpu, "deepspeed_config": cfg.deepspeed_config,
                          "fsdp_config": cfg.fsdp_config, "main_process_port": cfg.main_process_port}
        args = launch_command_parser().parse_args(["--config_file", yml, "train.py"])
        args, defaults, mp_from_config = _validate_launch_command(args)
        env = dict(os.environ)
        if args.use_deepspeed:
            # the same bookkeeping accelerate's launch_command does before deepspeed_launcher
            fields = list(defaults.deepspeed_config.keys()) if defaults else []
            if mp_from_config:
                fields.append("mixed_precision")
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            _, launch_env = prepare_deepspeed_cmd_env(args)
            saved = dict(os.environ)
            os.environ.update({k: v for k, v in launch_env.items() if k.startswith("ACCELERATE")})
            try:
                plugin = DeepSpeedPlugin()                   # raises on keys that conflict with the JSON
                out["plugin"] = {"zero_stage": plugin.zero_stage,
                                 "gradient_accumulation_steps": plugin.gradient_accumulation_steps}
            finally:
                os.environ.clear(); os.environ.update(saved)
        else:
            launch_env = prepare_multi_gpu_env(args) if args.multi_gpu or args.use_fsdp else {}
        out["launch_env"] = {k: v for k, v in launch_env.items()
                             if k.startswith(("ACCELERATE_", "FSDP_")) or k in ("MASTER_PORT",)}
        ds_path = os.path.join(run_dir, "ds_config.json")
        if os.path.exists(ds_path):
            ds = json.load(open(ds_path))
            c = DeepSpeedConfig(ds, mpu=MPU(world))           # asserts batch = micro x accum x world
            DeepSpeedZeroConfig(strict=True, **ds["zero_optimization"])   # no unknown keys, no "auto"
            out["ds"] = {"world_size": c.world_size, "train_batch_size": c.train_batch_size,
                         "micro": c.train_micro_batch_size_per_gpu, "accum": c.gradient_accumulation_steps,
                         "stage": int(c.zero_optimization_stage), "bf16": c.bfloat16_config.enabled,
                         "fp16": c.float16_config.enabled, "clipping": c.gradient_clipping,
                         "unknown_top_keys": sorted(set(ds) - KNOWN_TOP),
                         "offload_optimizer": device(c.zero_config.offload_optimizer),
                         "offload_param": device(c.zero_config.offload_param)}
        return out

    results = {}
    for item in json.loads(sys.argv[1]):
        try:
            results[item["key"]] = {"ok": parse(item["dir"], item["world"])}
        except BaseException as e:
            results[item["key"]] = {"error": f"{type(e).__name__}: {e}"}
    print("RESULTS=" + json.dumps(results))
''')


def parse_run_dirs(items: list[dict]) -> dict[str, dict]:
    """items: {"key", "dir", "world"} → key → {"ok": parsed} or {"error": message}, from accelerate and DeepSpeed."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _PARSE_SCRIPT, json.dumps(items)], capture_output=True,
                          text=True, env=env, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS=")), None)
    assert line is not None, f"parser harness failed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(line[len("RESULTS="):])


# ---- fixtures ----------------------------------------------------------------------------------------------------
def _req(**kw) -> PlanRequest:
    base = dict(model="Qwen/Qwen3-4B", gpus="8xRTX4090", strategy="zero3", offload="none", precision="bf16",
                grad_ckpt=True, micro_batch=2, grad_accum=8, seq_len=2048, attn="flash", name="t")
    base.update(kw)
    return PlanRequest(**base)


CASES = {
    "4090x8": ("preset", "4090x8"),
    "h200x4-fast": ("preset", "h200x4-fast"),
    "cpu-tiny": ("preset", "cpu-tiny"),
    "4090x16-bs256": ("preset", "4090x16-bs256"),
    "zero1-fp16": ("request", _req(strategy="zero1", precision="fp16", gpus="4xA100-80GB", micro_batch=1,
                                   grad_accum=4)),
    "zero2-offload": ("request", _req(strategy="zero2", offload="optimizer", gpus="2xH100", micro_batch=1,
                                      grad_accum=2)),
    "zero3-offload-all": ("request", _req(strategy="zero3", offload="all", gpus="4xL40S", micro_batch=1,
                                          grad_accum=3)),
    "fsdp": ("request", _req(strategy="fsdp", gpus="8xH100", micro_batch=2, grad_accum=4)),
    "cpu-zero3": ("request", PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", strategy="zero3",
                                         offload="none", precision="fp32", grad_ckpt=False, micro_batch=4,
                                         grad_accum=2, seq_len=128, name="t")),
}


def _plan_for(kind, spec):
    if kind == "preset":
        p = load_preset(spec)
        req = PlanRequest(**p.request_fields())
        return make_plan(req), req, p.train
    return make_plan(spec), spec, TrainOptions()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for key, (kind, spec) in CASES.items():
        plan, req, train = _plan_for(kind, spec)
        run = writers.write_run_dir(plan, req, train, root / key)
        out[key] = (plan, req, train, run)
    return out


@pytest.fixture(scope="module")
def parsed(written, tmp_path_factory) -> dict[str, dict]:
    items = [{"key": k, "dir": str(run.path), "world": plan.setup.world_size} for k, (plan, _, _, run) in written.items()]
    # negative controls: the harness must reject what accelerate and DeepSpeed reject
    bad = tmp_path_factory.mktemp("bad")
    src = written["4090x8"][3]
    for name, mutate in (("bad-batch", "batch"), ("bad-yaml-key", "yaml"), ("bad-mixed", "mixed")):
        d = bad / name
        d.mkdir()
        ds = json.loads(src.ds_config.read_text())
        cfg = yaml.safe_load(src.accelerate_config.read_text())
        if mutate == "batch":
            ds["train_batch_size"] += 1
        elif mutate == "yaml":
            cfg["num_gpus"] = 8
        else:
            cfg["mixed_precision"] = "bf16"
        cfg["deepspeed_config"]["deepspeed_config_file"] = str(d / "ds_config.json")
        (d / "ds_config.json").write_text(json.dumps(ds))
        (d / "accelerate_config.yaml").write_text(yaml.safe_dump(cfg))
        items.append({"key": name, "dir": str(d), "world": 8})
    return parse_run_dirs(items)


# ---- accelerate and DeepSpeed accept every written file -------------------------------------------------------
@pytest.mark.long
@pytest.mark.parametrize("key", list(CASES))
def test_written_files_pass_accelerate_and_deepspeed(parsed, written, key):
    plan, _, train, run = written[key]
    res = parsed[key]
    assert "ok" in res, res.get("error")
    got = res["ok"]
    s = plan.setup
    cl = got["cluster"]
    assert cl["num_processes"] == s.world_size                 # the total over nodes
    assert cl["num_machines"] == s.hardware.nodes
    assert cl["use_cpu"] is False
    if s.strategy in ("zero1", "zero2", "zero3"):
        assert cl["distributed_type"] == "DEEPSPEED"
        assert cl["mixed_precision"] is None                    # lives in the JSON only
        assert set(cl["deepspeed_config"]) <= {"deepspeed_config_file", "zero3_init_flag",
                                                "deepspeed_multinode_launcher"}
        assert got["plugin"]["zero_stage"] == int(s.strategy[-1])
        assert got["plugin"]["gradient_accumulation_steps"] == s.grad_accum
        ds = got["ds"]
        assert ds["world_size"] == s.world_size
        assert (ds["train_batch_size"], ds["micro"], ds["accum"]) == (s.effective_batch, s.micro_batch, s.grad_accum)
        assert ds["stage"] == int(s.strategy[-1])
        assert ds["bf16"] == (s.precision == "bf16") and ds["fp16"] == (s.precision == "fp16")
        assert ds["clipping"] == train.max_grad_norm
        assert ds["unknown_top_keys"] == []
        assert ds["offload_optimizer"] == ("cpu" if s.offload in ("optimizer", "all") else None)
        assert ds["offload_param"] == ("cpu" if s.offload == "all" else None)
    else:
        assert not run.ds_config.exists()
        want = {"fsdp": "FSDP"}.get(s.strategy, "MULTI_GPU" if s.world_size > 1 else "NO")
        assert cl["distributed_type"] == want
        assert cl["mixed_precision"] == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[s.precision]
    if s.strategy == "fsdp":
        assert got["launch_env"]["ACCELERATE_USE_FSDP"] == "true"
        assert cl["fsdp_config"]["fsdp_version"] == 2


@pytest.mark.long
def test_harness_rejects_what_the_libraries_reject(parsed):
    assert "train_batch_size is not equal" in parsed["bad-batch"]["error"]
    assert "unknown keys" in parsed["bad-yaml-key"]["error"]
    assert "deepspeed_config_file" in parsed["bad-mixed"]["error"]


# ---- numbers come from the plan ----------------------------------------------------------------------------------
def test_deepspeed_numbers_are_the_plans_and_the_memory_models(written):
    plan, _, _, run = written["4090x8"]
    ds = json.loads(run.ds_config.read_text())
    z = ds["zero_optimization"]
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (2, 8, 128)
    assert z["stage"] == 3
    assert z["reduce_bucket_size"] == DS_REDUCE_BUCKET_ELEMS
    assert z["stage3_prefetch_bucket_size"] == DS_PREFETCH_BUCKET_ELEMS
    assert z["sub_group_size"] == DS_SUB_GROUP_ELEMS
    assert z["stage3_param_persistence_threshold"] == configs.DS_PERSISTENCE_PER_HIDDEN * plan.setup.model.hidden_size
    assert "auto" not in json.dumps(ds)
    z2 = json.loads(written["zero2-offload"][3].ds_config.read_text())["zero_optimization"]
    assert z2["allgather_bucket_size"] == DS_ALLGATHER_BUCKET_ELEMS
    assert z2["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_overlap_comm_follows_the_plans_spare_memory(written):
    ds = json.loads(written["4090x8"][3].ds_config.read_text())
    assert ds["zero_optimization"]["overlap_comm"] is True          # 4090x8 has room for the overlap buffers
    tight = make_plan(_req(micro_batch=3))                           # over the limit: no room
    assert not tight.fits
    assert configs.deepspeed_config(tight, TrainOptions())["zero_optimization"]["overlap_comm"] is False
    cpu = json.loads(written["cpu-zero3"][3].ds_config.read_text())
    assert cpu["zero_optimization"]["overlap_comm"] is False         # gloo on the same cores
    assert "pin_memory" not in json.dumps(cpu)


def test_cpu_ddp_runs_as_multi_gpu_with_every_process(written):
    cfg = yaml.safe_load(written["cpu-tiny"][3].accelerate_config.read_text())
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["use_cpu"] is False and cfg["num_processes"] == 2
    assert cfg["mixed_precision"] == "no"
    lo, hi = configs.MAIN_PROCESS_PORT_BASE, configs.MAIN_PROCESS_PORT_BASE + configs.MAIN_PROCESS_PORT_SPAN
    ports = {yaml.safe_load(r.accelerate_config.read_text())["main_process_port"] for *_, r in written.values()}
    assert all(lo <= p < hi for p in ports) and len(ports) > 1


def test_plan_json_is_plan_plus_request_train_and_disk(written):
    from scaletrain.engine.run.disk import disk_need

    plan, req, train, run = written["h200x4-fast"]
    doc = json.loads(run.plan.read_text())
    assert {k: v for k, v in doc.items() if k not in ("request", "train", "disk")} == \
        json.loads(json.dumps(plan.to_json()))
    assert doc["disk"] == disk_need(plan, train).to_json()
    assert doc["request"] == json.loads(json.dumps(req.to_json()))
    assert TrainOptions.from_json(doc["train"]) == train


def test_launch_sh_is_the_launchers_argv(written):
    plan, _, _, run = written["4090x8"]
    text = run.launch_sh.read_text()
    assert os.access(run.launch_sh, os.X_OK)
    subprocess.run(["bash", "-n", str(run.launch_sh)], check=True)
    assert str(run.path) not in text and sys.executable not in text       # found at run time (a folder travels)
    env = dict(os.environ, SCALETRAIN_VENV=sys.prefix)
    r = subprocess.run(["bash", "-c", 'exec() { printf "%s\\n" "$@"; }; source "$1"', "_", str(run.launch_sh)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    train = TrainOptions.from_json(json.loads(run.plan.read_text())["train"])
    threads = threads_per_process(host_cores(), plan.setup.hardware.gpus_per_node)    # the node's cores ÷ 8, at run time
    assert r.stdout.splitlines() == launch_argv(run, train, python=os.path.join(sys.prefix, "bin", "python"),
                                                threads=threads)
    assert "--deepspeed_config_file" in r.stdout                        # 4090x8 is ZeRO-3: the folder's own file


def test_multi_node_plan_gets_sbatch_and_a_per_node_launch(written):
    plan, _, _, run = written["4090x16-bs256"]
    assert plan.setup.hardware.nodes == 2
    for script in (run.sbatch_sh, run.launch_sh):
        subprocess.run(["bash", "-n", str(script)], check=True)
    sb = run.sbatch_sh.read_text()
    assert "#SBATCH --nodes=2" in sb and "#SBATCH --gres=gpu:8" in sb and "$SLURM_PROCID" in sb
    r = subprocess.run(["bash", str(run.launch_sh)], capture_output=True, text=True)
    assert r.returncode != 0 and "MACHINE_RANK" in r.stderr       # refuses to guess a node's rank
    assert not written["4090x8"][3].sbatch_sh.exists()


# ---- the run directory -----------------------------------------------------------------------------------------
def _tiny():
    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", strategy="ddp", offload="none", precision="fp32",
                      grad_ckpt=False, micro_batch=4, grad_accum=2, seq_len=128, name="tiny")
    return make_plan(req), req


def test_same_plan_rewrites_in_place_and_a_different_one_is_refused(tmp_path):
    plan, req = _tiny()
    d = tmp_path / "run"
    writers.write_run_dir(plan, req, TrainOptions(), d)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    writers.write_run_dir(plan, req, TrainOptions(), d)               # same plan: fine, nothing backed up
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    oreq = req.with_(micro_batch=2)
    other = make_plan(oreq)
    with pytest.raises(ScaletrainError, match="different plan.*--overwrite"):
        writers.write_run_dir(other, oreq, TrainOptions(), d)
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    writers.write_run_dir(other, oreq, TrainOptions(), d, overwrite=True)
    assert json.loads((d / "plan.json").read_text())["batch"]["micro_batch"] == 2
    old = [p for p in d.iterdir() if p.name.startswith(writers.SUPERSEDED_PREFIX)]
    assert len(old) == 1
    assert json.loads((old[0] / "plan.json").read_text())["batch"]["micro_batch"] == 4
    assert (old[0] / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not (d / "metrics.jsonl").exists()


def test_foreign_folder_is_refused_and_its_files_survive_overwrite(tmp_path):
    plan, req = _tiny()
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ScaletrainError, match="not a scaletrain plan"):
        writers.write_run_dir(plan, req, TrainOptions(), d)
    assert [p.name for p in d.iterdir()] == ["notes.txt"]
    writers.write_run_dir(plan, req, TrainOptions(), d, overwrite=True)
    assert (d / "notes.txt").read_text() == "mine" and (d / "plan.json").exists()


def test_missing_dataset_is_one_error_and_nothing_is_written(tmp_path):
    plan, req = _tiny()
    with pytest.raises(ScaletrainError, match="dataset .*does not exist"):
        writers.write_run_dir(plan, req, TrainOptions(dataset=str(tmp_path / "nope.jsonl")), tmp_path / "r")
    assert not (tmp_path / "r").exists()
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    run = writers.write_run_dir(plan, req, TrainOptions(dataset=str(data)), tmp_path / "r")
    assert json.loads(run.plan.read_text())["train"]["dataset"] == str(data.resolve())


def test_default_run_dir_is_runs_date_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan, req = _tiny()
    run = writers.write_run_dir(plan, req, TrainOptions())
    assert run.path.parent == tmp_path / "runs" and run.path.name.endswith("-tiny")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.path.name]     # no temp dir left behind


# ---- accelerate's default config -----------------------------------------------------------------------------
@pytest.mark.long
def test_default_config_path_matches_accelerates(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code = "from accelerate.commands.config.config_args import default_config_file as f; print(f)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, HF_HOME=str(tmp_path / "hf"))).stdout.strip().splitlines()[-1]
    assert Path(out) == writers.accelerate_default_config_path() == tmp_path / "hf" / "accelerate" / "default_config.yaml"


def test_config_write_install_default_backs_up_the_users_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\n")
    rc = main(["config", "write", "--preset", "cpu-tiny", "--run-dir", str(tmp_path / "r")])
    assert rc == 0 and default.read_text().startswith("compute_environment: LOCAL_MACHINE\ndistributed_type: NO")
    rc = main(["config", "write", "--preset", "cpu-tiny", "--run-dir", str(tmp_path / "r"), "--install-default"])
    out = capsys.readouterr().out
    assert rc == 0
    backup = default.with_name("default_config.yaml.bak")
    assert backup.read_text() == "compute_environment: LOCAL_MACHINE\ndistributed_type: NO\n"
    assert default.read_text() == (tmp_path / "r" / "accelerate_config.yaml").read_text()
    assert str(backup) in out.replace("\n", "")

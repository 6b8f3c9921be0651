"""--job-spec: SkyPilot and Kubeflow specs written from the plan, accepted by the engines' own loaders, and the
commands they run start each node's launcher with its rank and the head node's address (run in bash here, with
the engine's variables set and a stand-in `scaletrain` that records its arguments).

The validators are the engines' own, from PyPI: SkyPilot's task loader (`sky.Task.from_yaml`: its JSON schema, then
the Task and Resources it builds; in its own venv, `make specs-venv`), Kubeflow Trainer's API models (`kubeflow-trainer-api`, the
pydantic models generated from the Trainer's OpenAPI spec) and the training operator's SDK (`kubeflow-training`,
its PyTorchJob model through its ApiClient). The generated models skip keys they do not know, so each document must
also come back from its model unchanged: a misspelt key fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.args import asked_from_args
from scaletrain.engine.run.jobspecs import SKYPILOT_ACCELERATORS, NodeSizes, k8s_name
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.writers import render_run_files
from scaletrain.tui.cli.main import main
from scaletrain.tui.cli.parser import parse_args

PRESET = "4090x16-bs256"           # Qwen3-4B on 2 nodes × 8 RTX 4090
KF_MISSING = "Kubeflow Trainer's API models are not installed (pip install kubeflow-trainer-api, in the dev extra)"
KFT_MISSING = "the training operator's SDK is not installed (pip install kubeflow-training, in the dev extra)"


def _write(run_dir: Path, *extra: str, preset: str = PRESET) -> int:
    return main(["--preset", preset, "--headless", "--dry-run", "--run-dir", str(run_dir), *extra])


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """The done-when command's run directory, and sbatch.sh as written without --job-spec at the same path."""
    d = tmp_path_factory.mktemp("specs") / "D"
    assert _write(d) == 0
    sbatch_alone = (d / "sbatch.sh").read_text()
    assert not (d / "skypilot.yaml").exists()
    assert _write(d, "--job-spec", "skypilot,kubeflow") == 0
    return d, sbatch_alone


def _sizes() -> NodeSizes:
    asked = asked_from_args(parse_args(["--preset", PRESET]))
    return NodeSizes.of(make_plan(asked.request()), asked.train)


def test_the_done_when_command_writes_both_specs_and_leaves_sbatch_unchanged(specs):
    d, sbatch_alone = specs
    for name in ("skypilot.yaml", "skypilot-managed.yaml", "trainjob.yaml", "pytorchjob.yaml"):
        assert (d / name).is_file(), name
    assert (d / "sbatch.sh").read_text() == sbatch_alone
    sky = yaml.safe_load((d / "skypilot.yaml").read_text())
    assert sky["num_nodes"] == 2 and sky["resources"]["accelerators"] == "RTX4090:8"
    job = yaml.safe_load((d / "trainjob.yaml").read_text())
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 8
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"


# ---- SkyPilot's own loader -------------------------------------------------------------------------------------------
# skypilot cannot share the dev venv (its resolver pulls transformers back to 5.17): `make specs-venv` installs it
# in .venv-specs, and its loader runs there (tests/fixtures/skypilot_load.py). `make test` builds that venv, so CI
# runs these tests; a bare `pytest` without it skips them, saying how to get it.
ROOT = Path(__file__).resolve().parents[2]
SKY_LOAD = ROOT / "tests" / "fixtures" / "skypilot_load.py"
SKY_MISSING = "SkyPilot's task loader is not installed: `make specs-venv` (.venv-specs) or SCALETRAIN_SPECS_PYTHON"


@pytest.fixture(scope="module")
def sky_python() -> str:
    python = os.environ.get("SCALETRAIN_SPECS_PYTHON") or str(ROOT / ".venv-specs" / "bin" / "python")
    if not Path(python).is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{SKY_MISSING} (CI runs `make test`, which builds it)")
        pytest.skip(SKY_MISSING)
    return python


def _sky_load(python: str, path: Path, cwd: Path) -> tuple[int, dict]:
    """`sky.Task.from_yaml(path)` in SkyPilot's environment, from cwd (the task's workdir is the run folder)."""
    done = subprocess.run([python, str(SKY_LOAD), str(path)], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_skypilot_accepts_skypilot_yaml(specs, sky_python):
    d, _ = specs
    code, task = _sky_load(sky_python, d / "skypilot.yaml", d)   # `cd RUN_DIR && sky launch …`
    assert code == 0, task
    sizes = _sizes()
    assert task["num_nodes"] == 2
    assert task["accelerators"] == {"RTX4090": 8}
    assert task["disk_size"] == max(256, sizes.disk_bytes // 10**9)
    assert task["memory"] == f"{sizes.memory_bytes // 2**30}+"
    assert task["envs"]["SCALETRAIN_PIP_SPEC"].startswith("scaletrain[train]==")
    assert not task["use_spot"]


@pytest.mark.long
def test_skypilot_accepts_the_managed_variant(specs, sky_python):
    d, _ = specs
    code, task = _sky_load(sky_python, d / "skypilot-managed.yaml", d)
    assert code == 0, task
    assert task["use_spot"] and task["job_recovery"]["max_restarts_on_errors"] >= 1
    (mount, storage_name), = task["storage_mounts"].items()
    assert storage_name == task["envs"]["CHECKPOINT_BUCKET"]      # ${CHECKPOINT_BUCKET} filled in by SkyPilot
    assert f"ln -sfn {mount} checkpoints" in task["run"]


@pytest.mark.long
def test_skypilots_loader_refuses_a_misspelt_spec(specs, sky_python, tmp_path):
    """The loader checks: the same file with one key misspelt is refused (so its acceptance above means something)."""
    d, _ = specs
    bad = tmp_path / "bad.yaml"
    bad.write_text((d / "skypilot.yaml").read_text().replace("disk_size:", "disk_sise:"))
    code, answer = _sky_load(sky_python, bad, d)
    assert code == 1 and "disk_sise" in answer["error"]


def _skypilot_table(python: str, fetcher: str, name: str) -> dict:
    """A name table of one of SkyPilot's catalog fetchers, read from its source (importing it needs the cloud's
    own SDK; its catalogs themselves are downloaded, so the loader cannot check a name offline)."""
    import ast

    origin = subprocess.run([python, str(SKY_LOAD), "--source", f"sky.catalog.data_fetchers.{fetcher}"],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=True)
    tree = ast.parse(Path(origin.stdout.strip()).read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{fetcher}.{name} not found")


@pytest.mark.long
def test_the_accelerator_names_are_skypilots(sky_python):
    """RTX4090 and L40S are names in SkyPilot's RunPod catalog; H100, A100-80GB, A100 and A6000 in its Lambda one."""
    runpod = _skypilot_table(sky_python, "fetch_runpod", "DEFAULT_GPU_INFO")
    lambda_ = _skypilot_table(sky_python, "fetch_lambda_cloud", "GPU_TO_MEMORY")
    assert SKYPILOT_ACCELERATORS["RTX4090"] in runpod and SKYPILOT_ACCELERATORS["L40S"] in runpod
    for key in ("H100-SXM", "A100-80GB", "A100-40GB", "A6000"):
        assert SKYPILOT_ACCELERATORS[key] in lambda_


# ---- Kubeflow's own models -------------------------------------------------------------------------------------------
def test_kubeflow_trainer_accepts_trainjob_yaml(specs):
    api = pytest.importorskip("kubeflow_trainer_api.models", reason=KF_MISSING)
    d, _ = specs
    doc = yaml.safe_load((d / "trainjob.yaml").read_text())
    job = api.TrainerV1alpha1TrainJob.from_dict(doc)
    assert job.to_dict() == doc                              # nothing the model does not know
    t = job.spec.trainer
    assert (job.api_version, job.kind) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job.spec.runtime_ref.name == "torch-distributed"
    assert t.num_nodes == 2 and t.num_proc_per_node == 8
    assert t.resources_per_node.limits["nvidia.com/gpu"].actual_instance == "8"
    assert t.resources_per_node.requests["memory"].actual_instance == f"{_sizes().memory_bytes // 2**30}Gi"
    pod = job.spec.runtime_patches[0].training_runtime_spec.template.spec.replicated_jobs[0].template.spec.template
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes["dshm"].empty_dir.medium == "Memory"
    assert volumes["runs"].persistent_volume_claim.claim_name
    mounts = {m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert {"/dev/shm", "/runs"} <= mounts
    assert [e.name for e in t.env][:1] == ["HF_TOKEN"]


def test_kubeflow_trainers_models_refuse_a_wrong_type(specs):
    api = pytest.importorskip("kubeflow_trainer_api.models", reason=KF_MISSING)
    d, _ = specs
    doc = yaml.safe_load((d / "trainjob.yaml").read_text())
    doc["spec"]["trainer"]["numNodes"] = "two"
    with pytest.raises(Exception, match="numNodes|num_nodes"):
        api.TrainerV1alpha1TrainJob.from_dict(doc)
    doc = yaml.safe_load((d / "trainjob.yaml").read_text())
    doc["spec"]["trainer"]["numNodez"] = 2
    assert api.TrainerV1alpha1TrainJob.from_dict(doc).to_dict() != doc     # the round trip catches a misspelt key


class _Response:
    def __init__(self, doc: dict):
        self.data = json.dumps(doc)


def test_the_training_operator_accepts_pytorchjob_yaml(specs):
    pytest.importorskip("kubeflow.training", reason=KFT_MISSING)
    from kubeflow.training.api_client import ApiClient

    d, _ = specs
    doc = yaml.safe_load((d / "pytorchjob.yaml").read_text())
    client = ApiClient()
    job = client.deserialize(_Response(doc), "KubeflowOrgV1PyTorchJob")
    assert client.sanitize_for_serialization(job) == doc
    specs_ = job.spec.pytorch_replica_specs
    assert specs_["Master"].replicas == 1 and specs_["Worker"].replicas == 1
    assert job.spec.nproc_per_node == "8"
    container = specs_["Worker"].template.spec.containers[0]
    assert container.name == "pytorch" and container.resources.limits["nvidia.com/gpu"] == "8"
    with pytest.raises(ValueError):              # runPolicy is required: the SDK's model checks
        client.deserialize(_Response({**doc, "spec": {**doc["spec"], "runPolicy": None}}), "KubeflowOrgV1PyTorchJob")


# ---- the commands they run ---------------------------------------------------------------------------------------
def _fake_scaletrain(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose `scaletrain` writes its arguments, one per line, to argv.txt (and whose `python`, the weights'
    download, its last argument to fetched.txt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "argv.txt"
    fake = bin_dir / "scaletrain"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {out}\n')
    fake.chmod(0o755)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nfor a in "$@"; do last="$a"; done\necho "$last" > {tmp_path / "fetched.txt"}\n')
    python.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}, out


def _bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_skypilots_run_starts_each_nodes_launcher_with_its_rank_and_the_head(specs, tmp_path):
    d, _ = specs
    run = yaml.safe_load((d / "skypilot.yaml").read_text())["run"]
    env, argv = _fake_scaletrain(tmp_path)
    sky_env = {**env, "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
               "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    r = _bash(run, sky_env, d)
    assert r.returncode == 0, r.stderr
    assert argv.read_text().split("\n")[:-1] == ["launch", ".", "--machine-rank", "1", "--main-process-ip",
                                                 "10.0.0.7"]
    argv.unlink()
    r = _bash(run, {**sky_env, "SKYPILOT_NUM_NODES": "3"}, d)       # another size: stop, do not train copies
    assert r.returncode == 2 and "this plan is for 2 node(s) × 8 GPU(s)" in r.stderr
    assert not argv.exists()


def test_the_managed_run_resumes_from_the_bucket(specs, tmp_path):
    d, _ = specs
    task = yaml.safe_load((d / "skypilot-managed.yaml").read_text())
    mount = next(iter(task["file_mounts"]))
    work = tmp_path / "work"
    shutil.copytree(d, work)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    env, argv = _fake_scaletrain(tmp_path)
    run = task["run"].replace(mount, str(bucket))       # the bucket's mount point, here a folder
    r = _bash(run, {**env, "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
                    "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}, work)
    assert r.returncode == 0, r.stderr
    assert argv.read_text().split("\n")[:3] == ["launch", ".", "--resume"]
    assert (work / "checkpoints").resolve() == bucket.resolve()


def test_the_trainjob_command_takes_the_torch_runtimes_variables(specs, tmp_path):
    d, _ = specs
    command = yaml.safe_load((d / "trainjob.yaml").read_text())["spec"]["trainer"]["command"]
    assert command[:2] == ["bash", "-c"]
    env, argv = _fake_scaletrain(tmp_path)
    where = f"/runs/{d.name}"
    script = command[2].replace(f"cd {where}\n", "")           # no /runs here: the folder is where it is
    r = _bash(script, {**env, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job"}, d)
    assert r.returncode == 0, r.stderr
    assert argv.read_text().split("\n")[:-1] == ["launch", where, "--machine-rank", "1", "--main-process-ip",
                                                 "job-node-0-0.job"]
    # the weights: `scaletrain launch` fetches the files the run loads (engine/launch/prefetch.py, tested against a
    # local hub in tests/e2e/test_hub_download.py); the spec runs no download of its own that would take every file
    assert not (tmp_path / "fetched.txt").exists()
    assert "# scaletrain launch downloads Qwen/Qwen3-4B" in command[2]


def test_skypilots_setup_installs_scaletrain_and_says_who_fetches_the_weights(specs, tmp_path):
    d, _ = specs
    task = yaml.safe_load((d / "skypilot.yaml").read_text())
    env, _ = _fake_scaletrain(tmp_path)
    pip = tmp_path / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "pip.txt"}\n')
    pip.chmod(0o755)
    r = _bash(task["setup"], {**env, **task["envs"]}, d)
    assert r.returncode == 0, r.stderr
    from scaletrain.engine.run.jobspecs import scaletrain_version
    assert (tmp_path / "pip.txt").read_text().split() == ["install", f"scaletrain[train]=={scaletrain_version()}"]
    assert not (tmp_path / "fetched.txt").exists()           # the launcher on each node fetches, not the setup
    assert "# scaletrain launch downloads Qwen/Qwen3-4B" in task["setup"]


# ---- choices and refusals ----------------------------------------------------------------------------------------
def test_a_relaunch_rewrites_the_specs_the_folder_holds(specs):
    """render_run_files without job_specs (a relaunch, a remedy) keeps the folder's specs, for the new plan."""
    d, _ = specs
    asked = asked_from_args(parse_args(["--preset", PRESET, "--micro-batch", "1", "--grad-accum", "16"]))
    files = render_run_files(make_plan(asked.request()), asked.request(), asked.train, RunDir(d))
    assert {"skypilot.yaml", "skypilot-managed.yaml", "trainjob.yaml", "pytorchjob.yaml"} <= set(files)


@pytest.mark.long
def test_a_single_node_cpu_plan_gets_specs_without_gpus(tmp_path, sky_python):
    d = tmp_path / "cpu"
    assert _write(d, "--job-spec", "skypilot,kubeflow", preset="cpu-tiny") == 0
    assert not (d / "sbatch.sh").exists()
    sky_doc = yaml.safe_load((d / "skypilot.yaml").read_text())
    assert "accelerators" not in sky_doc["resources"] and sky_doc["num_nodes"] == 1
    assert "--machine-rank" not in sky_doc["run"]
    job = yaml.safe_load((d / "trainjob.yaml").read_text())
    assert "nvidia.com/gpu" not in job["spec"]["trainer"]["resourcesPerNode"]["requests"]
    assert "Worker" not in yaml.safe_load((d / "pytorchjob.yaml").read_text())["spec"]["pytorchReplicaSpecs"]
    code, task = _sky_load(sky_python, d / "skypilot.yaml", d)
    assert code == 0 and task["num_nodes"] == 1 and not task["accelerators"]


@pytest.mark.parametrize("argv,needle", [
    (["--job-spec", "slurm"], "sbatch.sh is written for multi-node plans"),
    (["--job-spec", "skypilot,k8s"], "--job-spec 'skypilot,k8s' is not accepted; give a comma list of slurm, "
                                     "skypilot, kubeflow"),
    (["--job-spec", ","], "is not accepted"),
])
def test_bad_job_specs_are_one_line_and_exit_2(argv, needle, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "--preset", "cpu-tiny", "--headless", "--dry-run",
                        "--run-dir", str(tmp_path / "x"), *argv], env=env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()                      # nothing half-written


def test_k8s_names_are_dns_labels_starting_with_a_letter():
    assert k8s_name("4090x16-bs256") == "st-4090x16-bs256"
    assert k8s_name("My Plan: Qwen/Qwen3") == "my-plan-qwen-qwen3"
    assert len(k8s_name("a" * 200)) <= 40


def test_the_wizards_write_step_writes_and_lists_the_asked_specs(tmp_path):
    """`scaletrain --preset … --job-spec skypilot` (the wizard): its write step writes the specs and lists them
    among the written files (tui/wizard/run_files.py, no Textual)."""
    from scaletrain.tui.wizard import run_files
    from scaletrain.tui.wizard.state import state_from_args

    state = state_from_args(parse_args(["--preset", PRESET, "--job-spec", "skypilot"]))
    asked = asked_from_args(parse_args(["--preset", PRESET]))
    plan = make_plan(asked.request())
    assert {"skypilot.yaml", "skypilot-managed.yaml"} <= set(run_files.preview(plan, state, str(tmp_path / "w")))
    run = run_files.write(plan, state, str(tmp_path / "w"))
    listed = list(run_files.written_files(run))
    assert listed.index("sbatch.sh") < listed.index("skypilot.yaml") < listed.index("skypilot-managed.yaml")
    assert "trainjob.yaml" not in listed

"""Job specs for the engines people rent GPUs through, written into the run directory on request (--job-spec):

    slurm     sbatch.sh (scripts.py; every multi-node plan has it anyway)
    skypilot  skypilot.yaml (`sky launch`) and skypilot-managed.yaml (`sky jobs launch`: spot allowed, checkpoints
              on a bucket, `scaletrain launch RUN --resume` on every recovery)
    kubeflow  trainjob.yaml (Kubeflow Trainer, trainer.kubeflow.org/v1alpha1 TrainJob) and pytorchjob.yaml (the
              training operator's kubeflow.org/v1 PyTorchJob, for older clusters)

Each node runs the same thing the other launch paths run: `scaletrain launch RUN_DIR --machine-rank R
--main-process-ip HEAD` (engine/launch), its rank and the head node's address from the engine's own variables
(SkyPilot: SKYPILOT_NODE_RANK and the first of SKYPILOT_NODE_IPS; Kubeflow: the PET_* variables its torch runtime
and the PyTorchJob operator set). Before it starts, each node checks that the engine gave it the plan's node and GPU
counts and stops in one line if not: a spec edited to another size must not silently train separate copies.

Sizes come from the plan: GPUs per node and nodes, host RAM per node (the verdict's need: offloaded states and the
export, engine/run/resources.py, plus what each process holds on the host), the disk (engine/run/disk.py: the
checkpoints kept, the export, the logs, plus the downloaded weights and the software). Nothing of the writing
machine is baked in: the run folder is the SkyPilot workdir (`cd RUN_DIR && sky launch …`) or lives on a
PersistentVolumeClaim under /runs/<folder name>.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from typing import TYPE_CHECKING, Any

import yaml

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.fields import JOB_SPEC_KINDS
from scaletrain.engine.run.layout import (JOB_SPECS, PYTORCHJOB_YAML, SBATCH_SH, SKYPILOT_MANAGED_YAML, SKYPILOT_YAML,
                                         TRAINJOB_YAML, RunDir)

from scaletrain.engine.run.scripts import SBATCH_CPUS_PER_PROCESS      # cores per process, as sbatch.sh asks

if TYPE_CHECKING:
    from scaletrain.engine.plan.plan import Plan
    from scaletrain.engine.request.options import TrainOptions

SPEC_FILES: dict[str, tuple[str, ...]] = {"slurm": (SBATCH_SH,), "skypilot": (SKYPILOT_YAML, SKYPILOT_MANAGED_YAML),
                                          "kubeflow": (TRAINJOB_YAML, PYTORCHJOB_YAML)}
# The catalog's GPUs by SkyPilot's accelerator names (its catalogs: AWS p5/p5e/p3dn, GCP a3/g2, Lambda, RunPod).
# SkyPilot does not tell H100 SXM from PCIe; its "H100" offers are mostly SXM.
SKYPILOT_ACCELERATORS = {
    "H200": "H200", "H100-SXM": "H100", "H100-PCIe": "H100", "A100-80GB": "A100-80GB", "A100-40GB": "A100",
    "L40S": "L40S", "A6000": "A6000", "RTX4090": "RTX4090", "RTX3090": "RTX3090", "V100": "V100-32GB", "L4": "L4",
}
GB = 10**9
GiB = 1024**3
# Host RAM a training process holds besides the plan's offloaded states: Python, torch and the CUDA context
# (~2-3 GiB RSS per CUDA process) and the model as loaded on the CPU before it moves to its GPU (16-bit weights).
PROCESS_RUNTIME_BYTES = 3 * GiB
LOAD_BYTES_PER_PARAM = 2
# Disk besides the run's own files: the OS image, the Python environment with the train extra (torch, DeepSpeed,
# CUDA libraries: ~15 GB) and pip's cache; SkyPilot's default disk is 256 GB and is never asked smaller.
SYSTEM_DISK_BYTES = 64 * GB
SKYPILOT_MIN_DISK_GB = 256
KUBE_RUNS_MOUNT = "/runs"
KUBE_RUNS_CLAIM = "scaletrain-runs"
KUBE_HF_SECRET = "hf-token"
KUBE_IMAGE = "scaletrain"
SKY_CHECKPOINT_MOUNT = "/scaletrain-checkpoints"
# Kubeflow Trainer's runtimes (its manifests' ClusterTrainingRuntimes). DeepSpeed plans use the torch runtime too:
# accelerate starts DeepSpeed's ranks itself from the PET_* variables, while `deepspeed-distributed` is an MPI
# runtime (mpirun from a launcher pod over SSH), which this launch path does not use.
KUBE_TORCH_RUNTIME = "torch-distributed"
MAX_K8S_NAME = 40                 # JobSet and Job names append suffixes to the TrainJob's; 63 in all


def present_job_specs(run: RunDir) -> tuple[str, ...]:
    """The kinds whose spec files the run directory already holds (a relaunch rewrites them for the new plan)."""
    return tuple(k for k in JOB_SPEC_KINDS if k != "slurm" and any((run.path / n).is_file() for n in SPEC_FILES[k]))


def scaletrain_version() -> str:
    """The version a spec installs: this scaletrain's (its package metadata; the source tree's own otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scaletrain")
    except PackageNotFoundError:
        return "0.1.0"


def job_spec_files(plan: Plan, run: RunDir, train: TrainOptions,
                   kinds: tuple[str, ...]) -> dict[str, tuple[str, int | None]]:
    """File name → (text, mode) for the asked kinds ("slurm": sbatch.sh comes from scripts.py, checked here)."""
    if "slurm" in kinds and plan.setup.hardware.nodes <= 1:
        raise ScaletrainError("--job-spec slurm: sbatch.sh is written for multi-node plans (--nodes 2 or more); a "
                              "single node runs launch.sh (`sbatch --wrap 'bash launch.sh'` on one SLURM node)")
    sizes = NodeSizes.of(plan, train)
    out: dict[str, tuple[str, int | None]] = {}
    if "skypilot" in kinds:
        out[SKYPILOT_YAML] = (skypilot_yaml(plan, train, sizes, managed=False), None)
        out[SKYPILOT_MANAGED_YAML] = (skypilot_yaml(plan, train, sizes, managed=True), None)
    if "kubeflow" in kinds:
        out[TRAINJOB_YAML] = (trainjob_yaml(plan, run, train, sizes), None)
        out[PYTORCHJOB_YAML] = (pytorchjob_yaml(plan, run, train, sizes), None)
    assert set(out) <= set(JOB_SPECS)
    return out


class NodeSizes:
    """What one node needs, from the plan: processes, GPUs, CPUs, host RAM, disk."""

    def __init__(self, processes: int, gpus: int, cpus: int, memory_bytes: int, disk_bytes: int, parts: str):
        self.processes, self.gpus, self.cpus = processes, gpus, cpus
        self.memory_bytes, self.disk_bytes, self.parts = memory_bytes, disk_bytes, parts

    @classmethod
    def of(cls, plan: Plan, train: TrainOptions) -> "NodeSizes":
        from scaletrain.engine.run.disk import disk_need
        from scaletrain.engine.run.resources import resource_verdict

        s = plan.setup
        hw = s.hardware
        per_node = hw.gpus_per_node
        checks = {c.key: c for c in resource_verdict(plan, train).checks}
        host = checks["host_ram"].need_bytes if "host_ram" in checks else plan.memory.total_bytes * per_node
        process = PROCESS_RUNTIME_BYTES + LOAD_BYTES_PER_PARAM * s.model.params
        memory = math.ceil((host + per_node * process) / GiB) * GiB
        run_bytes = disk_need(plan, train).total_bytes
        weights = LOAD_BYTES_PER_PARAM * s.model.params
        disk = math.ceil((run_bytes + weights + SYSTEM_DISK_BYTES) / GB) * GB
        parts = (f"host RAM {memory // GiB:,} GiB per node = the plan's {host / GiB:,.1f} GiB + {per_node} × "
                 f"{process / GiB:,.1f} GiB per process (runtime + 16-bit weights as loaded); disk {disk // GB:,} GB = "
                 f"run {run_bytes / GB:,.1f} + weights {weights / GB:,.1f} + system {SYSTEM_DISK_BYTES / GB:,.0f}")
        gpus = per_node if s.device == "cuda" else 0
        return cls(per_node, gpus, SBATCH_CPUS_PER_PROCESS * per_node, memory, disk, parts)


# ---- YAML ----------------------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the scripts) as literal blocks, and no anchors (a shared part is
    written out where it is used)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> Any:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def _comment(text: str) -> str:
    """One `# …` line: anything that could end it (a newline, a control character) becomes '?'."""
    return "# " + "".join(ch if ch.isprintable() else "?" for ch in text)


def _render(header: list[str], doc: dict[str, Any]) -> str:
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)
    return "\n".join(_comment(h) for h in header) + "\n" + body


def k8s_name(name: str) -> str:
    """A DNS-1123 label from the plan's name: lower case, digits and '-', starting with a letter."""
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)[:MAX_K8S_NAME].strip("-")
    return slug if slug[:1].isalpha() else f"st-{slug}".strip("-")[:MAX_K8S_NAME]


def _what(plan: Plan) -> str:
    s = plan.setup
    return f"scaletrain plan {plan.name!r}: {s.model.name} on {s.hardware.describe()} ({s.strategy}, {s.precision})"


def _hub_id(train: "TrainOptions") -> str | None:
    """The HF hub id the run's weights come from (None: random init, or a local folder)."""
    from scaletrain.engine.request.weights import RANDOM_INIT

    src = train.model_source
    if not src or src == RANDOM_INIT or src.startswith(("/", ".", "~")) or os.path.isabs(src):
        return None
    return src


def _fetch_weights(train: "TrainOptions") -> str:
    """A comment line saying where hub weights come from (`scaletrain launch` downloads only the files the run loads
    into the node's HF cache before its ranks start, engine/launch/prefetch.py), or none."""
    hub = _hub_id(train)
    if hub is None:
        return ""
    return (f"# scaletrain launch downloads {shlex.quote(hub)} (the files the run loads) into this node's HF cache "
            "before the ranks start; a gated repo needs HF_TOKEN\n")


def _paths_note(train: "TrainOptions") -> list[str]:
    """Header lines for what the spec cannot carry: a local weights folder or data file, by their paths here."""
    notes = []
    if train.model_source and _hub_id(train) is None and os.path.isabs(train.model_source):
        notes.append(f"The weights are a local folder ({train.model_source}): it must exist at that path on every "
                     "node (or plan with an HF id).")
    for what, spec in (("data", train.dataset), ("eval data", train.eval_data)):
        if spec and os.path.isabs(spec):
            notes.append(f"The {what} is a local file ({spec}): it must exist at that path on every node (or give "
                         "an HF dataset id).")
    return notes


def _size_check(engine: str, nodes_var: str, gpus_var: str | None, plan: Plan) -> str:
    """Shell lines: stop in one line unless the engine gave this node the plan's node (and GPU) counts."""
    hw = plan.setup.hardware
    cond = f'[ "${{{nodes_var}}}" != {hw.nodes} ]'
    got = f"${{{nodes_var}}} node(s)"
    if gpus_var is not None:
        cond += f' || [ "${{{gpus_var}}}" != {hw.gpus_per_node} ]'
        got += f" × ${{{gpus_var}}} GPU(s)"
    return (f"if {cond}; then\n"
            f"  echo \"scaletrain: this plan is for {hw.nodes} node(s) × {hw.gpus_per_node} GPU(s), {engine} gave "
            f"{got}; re-plan for that size (scaletrain --gpus ...)\" >&2\n  exit 2\nfi\n")


def _launch(rank: str, head: str, plan: Plan, *, resume: bool = False, where: str = ".") -> str:
    argv = ["scaletrain", "launch", where]
    line = shlex.join(argv) + (" --resume" if resume else "")
    if plan.setup.hardware.nodes > 1:
        line += f' --machine-rank "{rank}" --main-process-ip "{head}"'
    return f"exec {line}\n"


# ---- SkyPilot ------------------------------------------------------------------------------------------------------
def skypilot_yaml(plan: Plan, train: TrainOptions, sizes: NodeSizes, *, managed: bool) -> str:
    """skypilot.yaml (`cd RUN_DIR && sky launch -c NAME skypilot.yaml --secret HF_TOKEN`) or its managed-jobs
    variant (`sky jobs launch skypilot-managed.yaml --secret HF_TOKEN`: spot allowed, recovered on preemption)."""
    s = plan.setup
    hw = s.hardware
    resources: dict[str, Any] = {}
    if sizes.gpus:
        acc = SKYPILOT_ACCELERATORS.get(hw.gpu.key)
        if acc is None:
            raise ScaletrainError(f"--job-spec skypilot: no SkyPilot accelerator name for {hw.gpu.name}; plan with a "
                                  f"catalog GPU ({', '.join(SKYPILOT_ACCELERATORS)})")
        resources["accelerators"] = f"{acc}:{sizes.gpus}"
    resources["cpus"] = f"{sizes.cpus}+"
    resources["memory"] = f"{math.ceil(sizes.memory_bytes / GiB)}+"
    resources["disk_size"] = max(SKYPILOT_MIN_DISK_GB, math.ceil(sizes.disk_bytes / GB))
    version = scaletrain_version()
    run = ("set -euo pipefail\n"
           + _size_check("SkyPilot", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE" if sizes.gpus else None, plan)
           + 'HEAD_IP="$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | sed -n 1p)"\n'     # no SIGPIPE under pipefail
           + 'echo "scaletrain: node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES, head node $HEAD_IP"\n')
    doc: dict[str, Any] = {"name": k8s_name(plan.name), "num_nodes": hw.nodes, "resources": resources,
                           "workdir": ".", "envs": {"SCALETRAIN_PIP_SPEC": f"scaletrain[train]=={version}"},
                           "secrets": {"HF_TOKEN": None}}
    header = [_what(plan) + ".",
              f"SkyPilot task: {hw.nodes} node(s) × {sizes.gpus or sizes.processes} {hw.gpu.key if sizes.gpus else 'CPU'} "
              "process(es); the run folder is the workdir (synced to every node).",
              f"Sizes from the plan: {sizes.parts}.",
              "setup installs this scaletrain version with the train extra (override: --env "
              "SCALETRAIN_PIP_SPEC=/path/or/spec) and fetches the weights; HF_TOKEN is passed as a secret.",
              *_paths_note(train)]
    if managed:
        resources["use_spot"] = True
        resources["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
        doc["envs"]["CHECKPOINT_BUCKET"] = f"scaletrain-{k8s_name(plan.name)}-checkpoints"
        doc["file_mounts"] = {SKY_CHECKPOINT_MOUNT: {"name": "${CHECKPOINT_BUCKET}", "mode": "MOUNT"}}
        run += (f"# checkpoints/ lives on the bucket, so a recovered job finds them on its new nodes\n"
                f"if [ -d checkpoints ] && [ ! -L checkpoints ]; then\n"
                f"  cp -Rn checkpoints/. {SKY_CHECKPOINT_MOUNT}/ && rm -rf checkpoints\n"
                f"fi\n"
                f"ln -sfn {SKY_CHECKPOINT_MOUNT} checkpoints\n"
                + _launch("$SKYPILOT_NODE_RANK", "$HEAD_IP", plan, resume=True))
        header += ["Managed job: cd RUN_DIR && sky jobs launch -n NAME skypilot-managed.yaml --secret HF_TOKEN "
                   "[--env CHECKPOINT_BUCKET=a-unique-name].",
                   "Spot instances allowed; on preemption SkyPilot starts new nodes and reruns `run`, whose "
                   "`scaletrain launch . --resume` continues from the newest complete checkpoint on the bucket "
                   "(step 0 the first time)."]
    else:
        run += _launch("$SKYPILOT_NODE_RANK", "$HEAD_IP", plan)
        header.append("Start: cd RUN_DIR && sky launch -c NAME skypilot.yaml --secret HF_TOKEN")
    doc["setup"] = 'set -euo pipefail\npip install "$SCALETRAIN_PIP_SPEC"\n' + _fetch_weights(train)
    doc["run"] = run
    return _render(header, doc)


# ---- Kubeflow ------------------------------------------------------------------------------------------------------
def _kube_resources(sizes: NodeSizes) -> dict[str, Any]:
    req = {"cpu": str(sizes.cpus), "memory": f"{math.ceil(sizes.memory_bytes / GiB)}Gi"}
    lim = {"memory": req["memory"]}
    if sizes.gpus:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(sizes.gpus)
    return {"requests": req, "limits": lim}


def _kube_env() -> list[dict[str, Any]]:
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": KUBE_HF_SECRET, "key": "HF_TOKEN",
                                                                 "optional": True}}},
            {"name": "PYTHONUNBUFFERED", "value": "1"}]


def _kube_volumes() -> list[dict[str, Any]]:
    return [{"name": "runs", "persistentVolumeClaim": {"claimName": KUBE_RUNS_CLAIM}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def _kube_mounts() -> list[dict[str, Any]]:
    return [{"name": "runs", "mountPath": KUBE_RUNS_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]


def _kube_command(plan: Plan, run: RunDir, train: TrainOptions, rank: str, head: str, nodes: str) -> list[str]:
    where = f"{KUBE_RUNS_MOUNT}/{run.path.name}"
    script = ("set -euo pipefail\n" + _size_check("Kubeflow", nodes, None, plan) + _fetch_weights(train)
              + f"cd {shlex.quote(where)}\n" + _launch(rank, head, plan, where=where))
    return ["bash", "-c", script]


def _kube_header(plan: Plan, run: RunDir, train: TrainOptions, sizes: NodeSizes, what: str,
                 apply: str) -> list[str]:
    version = scaletrain_version()
    return [_what(plan) + ".",
            what,
            f"Image: {KUBE_IMAGE}:{version}, built from the Dockerfile in scaletrain's repository "
            f"(docker build -t REGISTRY/{KUBE_IMAGE}:{version} . && docker push …; set `image` to it).",
            f"The run folder goes on the PersistentVolumeClaim {KUBE_RUNS_CLAIM!r} (ReadWriteMany for several nodes, "
            f"at least {sizes.disk_bytes / GB:,.0f} GB) at {KUBE_RUNS_MOUNT}/{run.path.name}:",
            f"  kubectl cp RUN_DIR POD:{KUBE_RUNS_MOUNT}/{run.path.name} (through any pod mounting the claim)",
            f"HF_TOKEN from the secret {KUBE_HF_SECRET!r}: kubectl create secret generic {KUBE_HF_SECRET} "
            "--from-literal=HF_TOKEN=hf_…",
            f"Sizes from the plan: {sizes.parts}.",
            f"The image's HF cache is on the claim too (HF_HOME={KUBE_RUNS_MOUNT}/.cache/huggingface).",
            *_paths_note(train),
            f"Start: {apply}"]


def trainjob_yaml(plan: Plan, run: RunDir, train: TrainOptions, sizes: NodeSizes) -> str:
    """trainjob.yaml: a Kubeflow Trainer TrainJob on the torch runtime, the volumes through a runtime patch."""
    hw = plan.setup.hardware
    pod = {"volumes": _kube_volumes(), "containers": [{"name": "node", "volumeMounts": _kube_mounts()}]}
    doc = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": k8s_name(plan.name)},
        "spec": {
            "runtimeRef": {"name": KUBE_TORCH_RUNTIME},
            "trainer": {
                "image": f"{KUBE_IMAGE}:{scaletrain_version()}",
                "command": _kube_command(plan, run, train, "$PET_NODE_RANK", "$PET_MASTER_ADDR", "PET_NNODES"),
                "env": _kube_env(),
                "numNodes": hw.nodes,
                "numProcPerNode": sizes.processes,
                "resourcesPerNode": _kube_resources(sizes),
            },
            "runtimePatches": [{"manager": "scaletrain", "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}}],
        },
    }
    header = _kube_header(plan, run, train, sizes, f"Kubeflow Trainer TrainJob ({KUBE_TORCH_RUNTIME} runtime; "
                          "Trainer 2.3 runtimePatches carry the volumes): each node runs `scaletrain launch` with "
                          "PET_NODE_RANK and PET_MASTER_ADDR.", "kubectl apply -f trainjob.yaml")
    return _render(header, doc)


def pytorchjob_yaml(plan: Plan, run: RunDir, train: TrainOptions, sizes: NodeSizes) -> str:
    """pytorchjob.yaml: the same run as a training-operator PyTorchJob (kubeflow.org/v1): Master + Workers."""
    hw = plan.setup.hardware
    container = {"name": "pytorch", "image": f"{KUBE_IMAGE}:{scaletrain_version()}",
                 "command": _kube_command(plan, run, train, "${PET_NODE_RANK:-$RANK}",
                                          "${PET_MASTER_ADDR:-$MASTER_ADDR}", f"PET_NNODES:-{hw.nodes}"),
                 "env": _kube_env(), "resources": _kube_resources(sizes), "volumeMounts": _kube_mounts()}

    def replicas(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "Never",
                "template": {"spec": {"containers": [container], "volumes": _kube_volumes()}}}

    specs = {"Master": replicas(1)}
    if hw.nodes > 1:
        specs["Worker"] = replicas(hw.nodes - 1)
    doc = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": k8s_name(plan.name)},
           "spec": {"nprocPerNode": str(sizes.processes), "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
                    "pytorchReplicaSpecs": specs}}
    header = _kube_header(plan, run, train, sizes, "Kubeflow training-operator PyTorchJob v1 (older clusters): one "
                          "Master and nodes-1 Workers, each running `scaletrain launch` with its node rank.",
                          "kubectl apply -f pytorchjob.yaml")
    return _render(header, doc)

"""Plan → a run directory: plan.json, the configs (configs.py) and the scripts (scripts.py), written whole.

A new directory appears whole (written beside it, then renamed); one holding the same plan is rewritten file by
file; a different previous run is refused, or moved aside with --overwrite. No torch, accelerate or DeepSpeed
import: writing a run directory is as fast as `scaletrain plan`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write, writing
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.configs import accelerate_config, deepspeed_config, render_accelerate_yaml
from scaletrain.engine.run.layout import (LAYOUT_NAMES, NODE_STATUS_PREFIX, RunDir, check_host, check_run_dir_path,
                                         default_run_dir)
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.jobspecs import job_spec_files, present_job_specs
from scaletrain.engine.run.plan_document import PlanDocument, holds_plan
from scaletrain.engine.run.scripts import launch_script, sbatch_script

SUPERSEDED_PREFIX = "superseded-"
# Names the run-directory layout owns (layout.py, plus the trainer's TensorBoard folder); --overwrite moves exactly
# these aside, nothing else.


# ---- the run directory -----------------------------------------------------------------------------------------
class WrittenRun(RunDir):
    """A run directory write_run_dir wrote, with the train options it checked and wrote into plan.json (the
    weights resolved, the data checked): what the caller shows needs no second read of plan.json."""

    def __init__(self, path: str | os.PathLike[str], train: TrainOptions):
        super().__init__(path)
        self.train = train


def checked_train(train: TrainOptions, request: PlanRequest | None = None, plan: Plan | None = None, *,
                  random_quantized_ok: bool = False, objective: str | None = None) -> TrainOptions:
    """The trainer's options, checked as launch would (so --dry-run refuses what launch would). With the request:
    the weights resolved (None → the model's own, a local folder made absolute) and checked against the method
    and the planned architecture; a 4/8-bit base from random init only where asked for (validation measures it).
    A given dataset must be readable and is recorded as an absolute path or an HF id (the trainer runs from
    anywhere). The data and eval data are read and checked for the objective (the plan's, else the request's, else
    `objective`, else sft) exactly as the trainer will (engine/request/records.check_data)."""
    from scaletrain.engine.request.weights import resolve_weights, weights_mismatch, weights_problem

    train.check()
    if request is not None:
        source = resolve_weights(train.model_source, request.model)
        setup = plan.setup if plan is not None else None
        method = setup.method if setup is not None else request.method
        bits = setup.base_bits if setup is not None else request.base_bits
        problem = weights_problem(method, bits, source)
        if problem and not (random_quantized_ok and source == "random-init"):
            raise ScaletrainError(problem)
        if setup is not None and (problem := weights_mismatch(source, setup.model)):
            raise ScaletrainError(problem)
        if setup is not None and setup.method.is_adapter and train.lora_dropout and any(
                setup.model.expert_lora(setup.lora_rank, setup.lora_targets)[1:]):
            raise ScaletrainError(f"lora_dropout {train.lora_dropout} cannot run with LoRA on the fused experts "
                                  "(peft's ParamWrapper refuses dropout): set lora_dropout 0 or leave the experts out "
                                  "of the targets")
        train = replace(train, model_source=source)
    from scaletrain.engine.request.data_source import resolve_data
    from scaletrain.engine.request.records import check_data

    if objective is None:
        objective = plan.setup.objective if plan is not None and plan.setup is not None else (
            request.objective if request is not None else "sft")
    from scaletrain.engine.request.options import check_seed

    check_seed(train.seed, str(getattr(objective, "value", objective)))
    for spec in (train.dataset, train.eval_data):   # read and checked as the trainer will: its own line, now
        if spec is not None:
            check_data(spec, str(getattr(objective, "value", objective)), train.data_columns)
    if train.eval_data is not None:                 # the trainer runs in the run directory: an absolute path
        train = replace(train, eval_data=resolve_data(train.eval_data).spec)
    if train.resume_from is not None and plan is not None:   # the checkpoint itself, checked against the plan
        from scaletrain.engine.run.resume_source import resume_for_plan

        src = resume_for_plan(plan, train.resume_from)
        train = replace(train, resume_from=str(src.checkpoint) if src is not None else None)
    if train.dataset is None:
        return train
    return replace(train, dataset=resolve_data(train.dataset).spec)


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):       # a name too long for the filesystem, a NUL byte
        return False


def render_run_files(plan: Plan, request: PlanRequest, train: TrainOptions, run: RunDir, *,
                     main_process_ip: str | None = None,
                     job_specs: tuple[str, ...] | None = None) -> dict[str, tuple[str, int | None]]:
    """File name → (text, mode) for everything the run directory holds before launch. `job_specs`: the kinds of
    --job-spec (jobspecs.py); None: those whose files the folder already holds (a relaunch keeps them current)."""
    if main_process_ip is not None:
        main_process_ip = check_host(main_process_ip)
    if train.model_source is None:
        from scaletrain.engine.request.weights import resolve_weights
        train = replace(train, model_source=resolve_weights(None, request.model))
    ds = deepspeed_config(plan, train)
    files: dict[str, tuple[str, int | None]] = {
        run.plan.name: (PlanDocument.build(plan, request, train).dumps(), None),
        run.accelerate_config.name: (render_accelerate_yaml(
            accelerate_config(plan, run, train, main_process_ip=main_process_ip), plan), None),
        run.launch_sh.name: (launch_script(plan, run, train, main_process_ip=main_process_ip,
                                           deepspeed=ds is not None), 0o755),
    }
    if ds is not None:
        files[run.ds_config.name] = (json.dumps(ds, indent=2) + "\n", None)
    sb = sbatch_script(plan, run, train, deepspeed=ds is not None)
    if sb is not None:
        files[run.sbatch_sh.name] = (sb, 0o755)
    kinds = job_specs if job_specs is not None else present_job_specs(run)
    files.update(job_spec_files(plan, run, train, kinds))
    return files


def _supersede(run: RunDir) -> Path | None:
    """Move the previous run's layout files into superseded-<stamp>/ (kept, never deleted)."""
    present = [run.path / n for n in LAYOUT_NAMES if (run.path / n).exists()]
    present += sorted(run.path.glob(f"{NODE_STATUS_PREFIX}*.json"))          # other nodes' launcher status
    if not present:
        return None
    dest = run.path / f"{SUPERSEDED_PREFIX}{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{dest.name}-{n}")
        n += 1
    dest.mkdir()
    for p in present:
        shutil.move(str(p), str(dest / p.name))
    return dest


def write_run_dir(plan: Plan, request: PlanRequest, train: TrainOptions, run_dir: str | os.PathLike[str] | None = None,
                  *, overwrite: bool = False, main_process_ip: str | None = None,
                  random_quantized_ok: bool = False, job_specs: tuple[str, ...] = ()) -> WrittenRun:
    """Write plan.json, the configs and the scripts; refuse a directory holding a different plan. Returns the run
    directory with the train options as checked and written.

    A new directory appears whole (written beside it, then renamed); an existing one that holds the same plan is
    rewritten file by file (atomic, with .bak of anything that differs); with overwrite, a different previous run
    is moved to superseded-<stamp>/ first. random_quantized_ok: a 4/8-bit base from random init is written too
    (validation and tests measure it; a real run is refused at checked_train). job_specs: --job-spec's kinds
    (slurm, skypilot, kubeflow: engine/run/jobspecs.py).
    """
    train = checked_train(train, request, plan, random_quantized_ok=random_quantized_ok)
    run = RunDir(check_run_dir_path(run_dir) if run_dir is not None else default_run_dir(plan.name))
    check_run_dir_path(run.path)        # a sane path (the scripts find it at run time)
    files = render_run_files(plan, request, train, run, main_process_ip=main_process_ip, job_specs=tuple(job_specs))
    with writing(f"the run directory {run.path}"):
        _write(run, plan, request, train, files, overwrite)
    return WrittenRun(run.path, train)


def _write(run: RunDir, plan: Plan, request: PlanRequest, train: TrainOptions,
           files: dict[str, tuple[str, int | None]], overwrite: bool) -> None:
    if run.path.exists() and not run.path.is_dir():
        raise ScaletrainError(f"run directory {run.path} exists and is not a directory; choose another --run-dir")
    if not run.path.exists() or not any(run.path.iterdir()):
        _write_fresh(run, files)
        return
    same = holds_plan(run.plan, PlanDocument.build(plan, request, train))
    if not same:
        if not overwrite:
            what = "a different plan" if same is False else "files that are not a scaletrain plan"
            raise ScaletrainError(f"{run.path} already holds {what}; choose another --run-dir, or pass --overwrite "
                                  f"(the previous files are moved to {SUPERSEDED_PREFIX}<date>/ inside it)")
        _supersede(run)
    for name, (text, mode) in files.items():
        atomic_write(run.path / name, text, mode=mode)
    run.logs.mkdir(exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)


def _write_fresh(run: RunDir, files: dict[str, tuple[str, int | None]]) -> None:
    run.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run.path.parent, prefix=f".{run.path.name}.", suffix=".tmp"))
    try:
        for name, (text, mode) in files.items():
            (tmp / name).write_text(text)
            if mode is not None:
                os.chmod(tmp / name, mode)
        (tmp / run.logs.name).mkdir()
        (tmp / run.checkpoints.name).mkdir()
        os.chmod(tmp, 0o777 & ~_umask())    # mkdtemp makes it 0o700; a run directory is an ordinary one
        os.replace(tmp, run.path)       # replaces an empty directory too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- accelerate's default config ---------------------------------------------------------------------------------
def accelerate_default_config_path() -> Path:
    """Where `accelerate launch` looks without --config_file, computed as accelerate does
    (accelerate/commands/config/config_args.py: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface),
    but at call time, not at import time."""
    hf_home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(hf_home)) / "accelerate" / "default_config.yaml"


def check_installable(dest: Path | None = None) -> Path:
    """Refuse, before anything is written, a default-config target that cannot be written (a read-only place, a
    directory in the way); returns the target."""
    target = Path(dest or accelerate_default_config_path())
    if target.is_dir():
        raise ScaletrainError(f"accelerate's default config {target} is a directory; move it away first")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ScaletrainError(f"cannot write accelerate's default config {target}: {parent} is not writable "
                              "(nothing was written); use `accelerate launch --config_file RUN_DIR/...` instead")
    return target


def install_accelerate_default(run: RunDir, dest: Path | None = None) -> tuple[Path, Path | None]:
    """Copy the run's accelerate YAML to accelerate's default location; an existing different file is backed up
    first (returned). Nothing is written when the default already holds the same text."""
    if not run.accelerate_config.is_file():
        raise ScaletrainError(f"{run.path} has no accelerate_config.yaml; write the run directory first")
    target = dest or accelerate_default_config_path()
    with writing(f"accelerate's default config {target}"):
        backup = atomic_write(target, run.accelerate_config.read_text(), backup=True)
    return target, backup


def written_files(run: RunDir) -> list[Path]:
    """The files of the layout that exist now, in layout order (for summaries)."""
    return [run.path / n for n in LAYOUT_NAMES if (run.path / n).exists()]

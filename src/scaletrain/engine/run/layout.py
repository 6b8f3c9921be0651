"""The run directory: where a plan becomes files, and the contract between writers, trainer, launcher, monitor.

    RUN_DIR/
      plan.json               Plan.to_json() + {"request": PlanRequest, "train": TrainOptions} (plan_document.py)
      accelerate_config.yaml  accelerate's own schema only
      ds_config.json          DeepSpeed strategies (zero1/2/3)
      launch.sh               the exact command, runnable by hand (same argv the launcher runs)
      sbatch.sh               multi-node plans
      skypilot.yaml, skypilot-managed.yaml   --job-spec skypilot (jobspecs.py): `sky launch` / `sky jobs launch`
      trainjob.yaml, pytorchjob.yaml         --job-spec kubeflow: Kubeflow Trainer TrainJob, PyTorchJob v1
      logs/rank-<i>.log       one file per rank, numbered by global rank (disjoint across nodes)
      logs/launcher.log       the launcher's own output (node R > 0 of a multi-node run: launcher-node-<R>.log)
      metrics.jsonl           one JSON line per optimizer step (trainer, global rank 0 only)
      checkpoints/step-<n>/   trainer checkpoints (complete once trainer_state.json is written, last)
      tensorboard/            TensorBoard event files (trainer, global rank 0: loss, lr, tokens/s, step time)
      status.json             launcher: exit code, first failing rank, pids (node R > 0: status-node-<R>.json;
                              status.py)
      .launch.lock            flock held by the launcher (and its watchdog) while the run lives (runlock.py)

Multi-node: every node runs from the same files (the YAML holds machine_rank 0; each node's launch passes its own
--machine_rank). Nodes sharing one run directory (a shared filesystem, or the loopback test) write disjoint files.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError

# The run directory's own names: this module and the module that writes each file are the only places spelling
# them (plan_document, configs and scripts write what RunDir names here).
PLAN, ACCELERATE_CONFIG, DS_CONFIG = "plan.json", "accelerate_config.yaml", "ds_config.json"
LAUNCH_SH, SBATCH_SH = "launch.sh", "sbatch.sh"
# Job specs for other schedulers, written on request (--job-spec; engine/run/jobspecs.py).
SKYPILOT_YAML, SKYPILOT_MANAGED_YAML = "skypilot.yaml", "skypilot-managed.yaml"
TRAINJOB_YAML, PYTORCHJOB_YAML = "trainjob.yaml", "pytorchjob.yaml"
JOB_SPECS = (SKYPILOT_YAML, SKYPILOT_MANAGED_YAML, TRAINJOB_YAML, PYTORCHJOB_YAML)
LOGS, METRICS, CHECKPOINTS, STATUS, TENSORBOARD = "logs", "metrics.jsonl", "checkpoints", "status.json", "tensorboard"
EXPORTS = "export"                # scaletrain export's folders (export/step-<n>/), the trainer's at the end of a run
# What writing a run directory writes, in the order a reader meets the files.
WRITTEN = (PLAN, ACCELERATE_CONFIG, DS_CONFIG, LAUNCH_SH, SBATCH_SH) + JOB_SPECS
# Every name of the layout, in layout order: a previous run's are moved aside before a different plan is written.
LAYOUT_NAMES = WRITTEN + (LOGS, METRICS, CHECKPOINTS, STATUS, TENSORBOARD, EXPORTS)
# What a relaunch copies into attempts/<n>/ before it rewrites the folder (logs/ are copied as a tree).
BACKED_UP = WRITTEN + (STATUS, METRICS)
# A folder holding any of these is a run directory (the monitor waits for one; anything else is a wrong path).
RUN_DIR_MARKERS = frozenset({PLAN, ACCELERATE_CONFIG, DS_CONFIG, LAUNCH_SH, LOGS, METRICS, STATUS})
NODE_STATUS_PREFIX = "status-node-"
# logs/rank-<i>.log (also a copied "<anything>__rank-<i>.log"): the rank a log file belongs to
RANK_LOG_RE = re.compile(r"(?:^|__)rank-(\d+)\.log$")
# checkpoints/step-<n>/, complete once trainer_state.json is written (last)
CHECKPOINT_PREFIX = "step-"
TRAINER_STATE = "trainer_state.json"
# torchrun's console line prefix (${rank} is the global rank): the launcher sets it, launch.sh and sbatch.sh export
# it, so rank attribution works the same by hand, under SLURM and under `scaletrain launch`.
LINE_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
LINE_PREFIX = "[rank${rank}]:"


class RunDir:
    """Paths inside a run directory (no I/O beyond what each method says)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).resolve()

    plan = property(lambda self: self.path / PLAN)
    accelerate_config = property(lambda self: self.path / ACCELERATE_CONFIG)
    ds_config = property(lambda self: self.path / DS_CONFIG)
    launch_sh = property(lambda self: self.path / LAUNCH_SH)
    sbatch_sh = property(lambda self: self.path / SBATCH_SH)
    logs = property(lambda self: self.path / LOGS)
    metrics = property(lambda self: self.path / METRICS)
    checkpoints = property(lambda self: self.path / CHECKPOINTS)
    status = property(lambda self: self.path / STATUS)
    tensorboard = property(lambda self: self.path / TENSORBOARD)    # the trainer's TensorBoard event files

    exports = property(lambda self: self.path / EXPORTS)               # scaletrain export's folders

    def export_dir(self, step: int) -> Path:
        """Where checkpoint step-<n> is exported by default: export/step-<n>/."""
        return self.exports / f"{CHECKPOINT_PREFIX}{step}"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def node_status(self, machine_rank: int | None = None) -> Path:
        """One node's launcher status: status.json on the head node (and for every single-node run)."""
        r = machine_rank or 0
        return self.status if r == 0 else self.path / f"{NODE_STATUS_PREFIX}{r}.json"

    def node_statuses(self) -> list[Path]:
        """Every node's status file present, head node first."""
        others = sorted(self.path.glob(f"{NODE_STATUS_PREFIX}*.json"),
                        key=lambda p: int(p.stem[len(NODE_STATUS_PREFIX):]) if p.stem[len(NODE_STATUS_PREFIX):]
                        .isdigit() else 1 << 30)
        return ([self.status] if self.status.exists() else []) + others

    def node_lock(self, machine_rank: int | None = None) -> Path:
        """The lock one node's launch holds for its whole run (runlock.py): .launch.lock, .launch-node-<R>.lock."""
        r = machine_rank or 0
        return self.path / (".launch.lock" if r == 0 else f".launch-node-{r}.lock")

    def launcher_log(self, machine_rank: int | None = None) -> Path:
        r = machine_rank or 0
        return self.logs / ("launcher.log" if r == 0 else f"launcher-node-{r}.log")

    def newest_checkpoint(self) -> Path | None:
        """The highest step-<n>/ whose trainer_state.json exists (an interrupted save is never picked)."""
        complete = self.complete_checkpoints()
        return complete[0] if complete else None

    def complete_checkpoints(self) -> list[Path]:
        """Every step-<n>/ whose trainer_state.json exists, newest first (resume falls back along this list)."""
        found: list[tuple[int, Path]] = []
        if not self.checkpoints.is_dir():
            return []
        for d in self.checkpoints.iterdir():
            n = checkpoint_step(d)
            if n is not None and (d / TRAINER_STATE).is_file():
                found.append((n, d))
        return [d for _, d in sorted(found, reverse=True)]

    def remove_checkpoints(self) -> int:
        """Delete every checkpoints/step-<n>/ (the weights a validation run must not leave); bytes freed."""
        import shutil

        freed = 0
        if self.checkpoints.is_dir():
            for d in list(self.checkpoints.iterdir()):
                if checkpoint_step(d) is not None:
                    freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
                    shutil.rmtree(d, ignore_errors=True)
        return freed


def checkpoint_step(path: Path) -> int | None:
    """n for a checkpoints/step-<n>/ folder, None for anything else."""
    name = path.name
    if not name.startswith(CHECKPOINT_PREFIX) or not path.is_dir():
        return None
    try:
        return int(name[len(CHECKPOINT_PREFIX):])
    except ValueError:
        return None


def log_rank(name: str) -> int | None:
    """The rank a log file (logs/rank-<i>.log) belongs to; None for other logs."""
    m = RANK_LOG_RE.search(name)
    return int(m.group(1)) if m else None


_HOST_RE = re.compile(r"^[A-Za-z0-9._:\-\[\]%]+$")     # hostnames, IPv4, IPv6 (bracketed or not)


def check_host(text: str) -> str:
    """A head-node address as accelerate passes it to torchrun: a hostname or an IP, nothing a shell would read."""
    host = str(text).strip()
    if not host or not _HOST_RE.match(host):
        raise ScaletrainError(f"--main-process-ip {text!r} is not a host name or IP address; give the head node's "
                              "address as every node reaches it, e.g. 10.0.0.1 or node001")
    return host


MAX_RUN_DIR_CHARS = 1024


def check_run_dir_path(path: str | os.PathLike[str]) -> Path:
    """--run-dir as given: not empty (that would be the current directory), one printable line (a newline or a
    control character in a path ends up in launch.sh and sbatch.sh), of a sane length."""
    text = os.fspath(path)
    if not str(text).strip():
        raise ScaletrainError("--run-dir is empty; give a directory to write the run into (it is created)")
    if len(text) > MAX_RUN_DIR_CHARS or not str(text).isprintable():
        shown = repr(text[:60]) + ("…" if len(text) > 60 else "")
        raise ScaletrainError(f"--run-dir {shown} is not accepted: give a path of printable characters (no newline "
                              f"or control character), at most {MAX_RUN_DIR_CHARS} long")
    return Path(text)


def default_run_dir(name: str, root: str | os.PathLike[str] = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name) or "run"
    return Path(root) / f"{stamp}-{safe}"


def tensorboard_command(run: "RunDir | str | os.PathLike[str]") -> str:
    """The command that shows a run's TensorBoard events: `tensorboard --logdir RUN/tensorboard` (shell-quoted)."""
    import shlex

    rd = run if isinstance(run, RunDir) else RunDir(run)
    return f"tensorboard --logdir {shlex.quote(str(rd.tensorboard))}"

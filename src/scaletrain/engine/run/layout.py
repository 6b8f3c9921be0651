"""The run directory: where a plan becomes files, and the contract between writers, trainer, launcher, monitor.

    RUN_DIR/
      plan.json               Plan.to_json() + {"request": PlanRequest, "train": TrainOptions}
      accelerate_config.yaml  accelerate's own schema only
      ds_config.json          DeepSpeed strategies (zero1/2/3)
      launch.sh               the exact command, runnable by hand (same argv the launcher runs)
      sbatch.sh               multi-node plans
      logs/rank-<i>.log       one file per rank, numbered by global rank (disjoint across nodes)
      logs/launcher.log       the launcher's own output (node R > 0 of a multi-node run: launcher-node-<R>.log)
      metrics.jsonl           one JSON line per optimizer step (trainer, global rank 0 only)
      checkpoints/step-<n>/   trainer checkpoints
      status.json             launcher: exit code, first failing rank, pids (node R > 0: status-node-<R>.json)

Multi-node: every node runs from the same files (the YAML holds machine_rank 0; each node's launch passes its own
--machine_rank). Nodes sharing one run directory (a shared filesystem, or the loopback test) write disjoint files.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError


NODE_STATUS_PREFIX = "status-node-"
# torchrun's console line prefix (${rank} is the global rank): the launcher sets it, launch.sh and sbatch.sh export
# it, so rank attribution works the same by hand, under SLURM and under `scaletrain launch`.
LINE_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
LINE_PREFIX = "[rank${rank}]:"


@dataclass(frozen=True)
class TrainOptions:
    """What the bundled trainer needs beyond the plan's numbers."""

    dataset: str | None = None            # JSONL path; None → the bundled demo data (presets/data/demo.jsonl)
    model_source: str = "random-init"     # "random-init" (from the plan's config) | local path | HF cache id
    lr: float = 2e-5
    lr_schedule: str = "cosine"           # cosine | linear | constant
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0            # gradient clipping (ds_config.json gradient_clipping); 0 = off
    max_steps: int | None = None          # overrides epochs when set
    checkpoint_every: int = 50            # optimizer steps; a final checkpoint is always written
    seed: int = 0
    packing: bool = True                  # pack samples into seq_len blocks (else pad each sample)
    lora_alpha: int | None = None         # default 2 × rank
    lora_dropout: float = 0.0
    script: str | None = None             # user-script mode: run this instead of the bundled trainer
    script_args: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "TrainOptions":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ScaletrainError(f"unknown train option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}")
        if "script_args" in d and d["script_args"] is not None:
            d["script_args"] = tuple(d["script_args"])
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["script_args"] = list(self.script_args)
        return d


class RunDir:
    """Paths inside a run directory (no I/O beyond what each method says)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).resolve()

    plan = property(lambda self: self.path / "plan.json")
    accelerate_config = property(lambda self: self.path / "accelerate_config.yaml")
    ds_config = property(lambda self: self.path / "ds_config.json")
    launch_sh = property(lambda self: self.path / "launch.sh")
    sbatch_sh = property(lambda self: self.path / "sbatch.sh")
    logs = property(lambda self: self.path / "logs")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    checkpoints = property(lambda self: self.path / "checkpoints")
    status = property(lambda self: self.path / "status.json")

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

    def launcher_log(self, machine_rank: int | None = None) -> Path:
        r = machine_rank or 0
        return self.logs / ("launcher.log" if r == 0 else f"launcher-node-{r}.log")

    def read_plan(self) -> dict[str, Any]:
        try:
            return json.loads(self.plan.read_text())
        except FileNotFoundError:
            raise ScaletrainError(f"{self.path} is not a run directory (no plan.json)") from None
        except json.JSONDecodeError as e:
            raise ScaletrainError(f"{self.plan} is not valid JSON ({e.msg} at line {e.lineno})") from None


_HOST_RE = re.compile(r"^[A-Za-z0-9._:\-\[\]%]+$")     # hostnames, IPv4, IPv6 (bracketed or not)


def check_host(text: str) -> str:
    """A head-node address as accelerate passes it to torchrun: a hostname or an IP, nothing a shell would read."""
    host = str(text).strip()
    if not host or not _HOST_RE.match(host):
        raise ScaletrainError(f"--main-process-ip {text!r} is not a host name or IP address; give the head node's "
                              "address as every node reaches it, e.g. 10.0.0.1 or node001")
    return host


def default_run_dir(name: str, root: str | os.PathLike[str] = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name) or "run"
    return Path(root) / f"{stamp}-{safe}"


def atomic_write(path: Path, text: str, *, mode: int | None = None, backup: bool = True) -> Path | None:
    """Write via a temp file + rename; keep a `.bak` of an existing file that differs. Returns the backup path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bak = None
    if path.exists() and backup:
        try:
            same = path.read_text() == text
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            return None
        bak = path.with_name(path.name + ".bak")
        n = 1
        while bak.exists():
            bak = path.with_name(f"{path.name}.bak{n}")
            n += 1
        bak.write_bytes(path.read_bytes())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return bak


def launch_argv(run: RunDir, plan: dict[str, Any], *, machine_rank: int | None = None,
                main_process_ip: str | None = None, python: str | None = None) -> list[str]:
    """The exact `accelerate launch` argument list (no shell) for this run; launch.sh holds the same words."""
    train = TrainOptions.from_json(plan.get("train"))
    argv = [python or sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run.accelerate_config)]
    # per-rank output: torchrun tees each rank's stdout+stderr to files under logs/elastic/ and prefixes its console
    # lines with the rank, which engine.launcher splits into logs/rank-<i>.log
    argv += ["--tee", "3", "--log_dir", str(run.logs / "elastic")]
    if machine_rank is not None:
        argv += ["--machine_rank", str(machine_rank)]
    if main_process_ip:
        argv += ["--main_process_ip", main_process_ip]
    if train.script:
        argv += [train.script, *train.script_args]
    else:
        argv += ["-m", "scaletrain.trainer.train", "--run-dir", str(run.path)]
    return argv

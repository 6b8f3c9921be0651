"""Where rank 0 reports each step besides metrics.jsonl (issue 22): `train.report_to` / `--report-to`.

tensorboard  RUN/tensorboard/ event files (torch's SummaryWriter), the plan as a text summary
wandb        a Weights & Biases run through its own library (the `wandb` extra), offline unless the environment
             says otherwise (WANDB_MODE, or WANDB_API_KEY for online), in RUN/wandb/; the plan's predicted memory
             and time, the request and the train options are its config, so measured and predicted sit side by side
none         metrics.jsonl only

A tracker that cannot start (its library missing, its service refusing) is a note, never a failed run.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_CONFIG_BYTES, read_text_bounded
from scaletrain.engine.run.layout import RunDir


class Trackers:
    """The step scalars fanned out to every tracker that started (the loop calls add_scalars and close)."""

    def __init__(self, tensorboard: Any = None, wandb_run: Any = None):
        self.tensorboard = tensorboard
        self.wandb_run = wandb_run

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        """One step's scalars as one record per tracker: one TensorBoard event (SummaryWriter.add_scalar writes an
        event per tag, each a wake-up of its writer thread on rank 0 while the other ranks wait at the next
        collective) and one wandb log call."""
        if self.tensorboard is not None:
            writer = getattr(self.tensorboard, "_get_file_writer", None)
            if writer is None:        # another SummaryWriter: an event per tag
                for tag, x in scalars.items():
                    self.tensorboard.add_scalar(tag, x, step)
            else:
                from tensorboard.compat.proto.summary_pb2 import Summary

                values = [Summary.Value(tag=tag, simple_value=float(x)) for tag, x in scalars.items()]
                writer().add_summary(Summary(value=values), step)
        if self.wandb_run is not None:
            self.wandb_run.log(dict(scalars), step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def plan_config(run: RunDir) -> dict[str, Any]:
    """The plan's predictions and choices as a tracker's config (plan.json's sections, as written)."""
    try:
        doc = json.loads(read_text_bounded(run.plan, MAX_CONFIG_BYTES << 2, run.plan.name))
    except (OSError, ValueError, ScaletrainError):
        return {}
    keep = ("model", "hardware", "training", "batch", "memory", "time", "request", "train", "disk")
    return {k: doc[k] for k in keep if k in doc}


def open_trackers(run: RunDir, report_to: tuple[str, ...]) -> Trackers | None:
    names = set(report_to) - {"none"}
    if not names:
        return None
    config = plan_config(run)
    return Trackers(_tensorboard(run, config) if "tensorboard" in names else None,
                    _wandb(run, config) if "wandb" in names else None)


def _tensorboard(run: RunDir, config: dict[str, Any]) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("scaletrain: note: tensorboard is not installed; metrics.jsonl only", file=sys.stderr)
        return None
    w = SummaryWriter(log_dir=str(run.tensorboard))
    if config:
        w.add_text("plan", "```\n" + json.dumps(config, indent=2) + "\n```", 0)
    return w


def wandb_mode() -> str:
    """offline unless the environment asks otherwise (no network is the safe assumption on a training node)."""
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def _wandb(run: RunDir, config: dict[str, Any]) -> Any:
    try:
        import wandb
    except ImportError:
        print("scaletrain: note: wandb is not installed (pip install 'scaletrain[wandb]'); not reporting to W&B",
              file=sys.stderr)
        return None
    try:
        return wandb.init(project=os.environ.get("WANDB_PROJECT", "scaletrain"), name=run.path.name,
                          dir=str(run.path), mode=wandb_mode(), config=config)
    except Exception as e:                 # a refused login, a full disk: the run goes on without W&B
        print(f"scaletrain: note: W&B did not start ({str(e).splitlines()[0][:200]}); not reporting to W&B",
              file=sys.stderr)
        return None

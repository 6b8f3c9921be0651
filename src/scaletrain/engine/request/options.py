"""TrainOptions: what the bundled trainer needs beyond the plan's numbers (plan.json's "train" section)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError

# The trainer's learning-rate schedules, by the name a preset or --set uses → transformers' scheduler name.
LR_SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


REPORT_TO = ("tensorboard", "wandb", "none")


def check_report_to(names: Any) -> None:
    """--report-to: a comma list of tensorboard, wandb (offline unless WANDB_MODE/WANDB_API_KEY say otherwise), or
    none alone."""
    ok = isinstance(names, tuple) and names and all(isinstance(n, str) and n in REPORT_TO for n in names)
    if not ok or ("none" in names and len(names) > 1):
        raise ScaletrainError(f"report_to {_short(names)} is not accepted; give a comma list of tensorboard, wandb, "
                              "or none alone")

MAX_SEED = 2**64 - 1                      # torch.manual_seed accepts 0 … 2**64-1
MAX_TRL_SEED = 2**32 - 1                  # TRL's runs seed numpy too (transformers.set_seed): 0 … 2**32-1


def check_seed(seed: int, objective: str) -> None:
    """The seed against what the objective's libraries accept (TrainOptions.check has refused the rest)."""
    if objective in ("reward", "dpo", "grpo") and isinstance(seed, int) and seed > MAX_TRL_SEED:
        raise ScaletrainError(f"seed must be from 0 to 2**32-1 = {MAX_TRL_SEED} for --objective {objective} (TRL "
                              f"seeds numpy, which accepts no more; got {seed})")


@dataclass(frozen=True)
class TrainOptions:
    """What the bundled trainer needs beyond the plan's numbers."""

    dataset: str | None = None            # --data: a file/folder (JSONL, JSON, Parquet, CSV) or an HF dataset id;
                                          # None → the bundled demo data (presets/data/demo.jsonl)
    model_source: str | None = None       # --weights: HF id | local folder | "random-init"; None → the model's own
                                          # (weights.default_weights), resolved when the run directory is written
    lr: float = 2e-5
    lr_schedule: str = "cosine"           # cosine | linear | constant
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0            # gradient clipping (ds_config.json gradient_clipping); 0 = off
    max_steps: int | None = None          # overrides epochs when set
    checkpoint_every: int = 50            # optimizer steps; a final checkpoint is written too (when saving)
    save_checkpoints: bool = True         # false: no checkpoint at all, not even the final one (validation runs)
    keep_checkpoints: int | None = None   # keep only the newest N complete checkpoints; None keeps every one
    report_to: tuple[str, ...] = ("tensorboard",)   # --report-to: tensorboard, wandb (offline by default), none
    export_at_end: bool = True            # rank 0 exports the last checkpoint (export/step-N/), checked against
                                          # the trained model's logits on one batch (trainer/export.py)
    seed: int = 0
    packing: bool = True                  # pack samples into seq_len blocks (else pad each sample)
    eval_data: str | None = None          # --eval-data: an eval split (a file/folder or an HF dataset id)
    eval_fraction: float = 0.0            # --eval-fraction: else hold out this share of --data's blocks (the last)
    eval_every: int | None = None         # optimizer steps between evaluations (default checkpoint_every); and at the end
    data_columns: dict[str, str] | None = None   # --data-columns: TRL's name → the data's column (prompt=question)
    lora_alpha: int | None = None         # default 2 × rank
    lora_dropout: float = 0.0
    script: str | None = None             # user-script mode: run this instead of the bundled trainer
    script_args: tuple[str, ...] = ()
    max_restarts: int = 0                 # torchrun's elastic agent restarts every rank up to N times after one
                                          # dies; each restart resumes from the newest checkpoint
    resume_from: str | None = None        # --resume-from: another run's checkpoint (engine/run/resume_source.py),
                                          # recorded as its step-<n>/ folder; possibly written by another world size

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "TrainOptions":
        if d is not None and not isinstance(d, dict):
            raise ScaletrainError(f"the train options must be a mapping of option → value (got {_short(d)})")
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(map(str, d)) - known)
        if unknown:
            raise ScaletrainError(f"unknown train option(s) {_short(', '.join(unknown), 200)}; accepted: "
                                  f"{', '.join(sorted(known))}")
        if isinstance(d.get("report_to"), str):
            d["report_to"] = tuple(x.strip() for x in d["report_to"].split(",") if x.strip())
        elif isinstance(d.get("report_to"), list):
            d["report_to"] = tuple(d["report_to"])
        if "script_args" in d and d["script_args"] is not None:
            if not isinstance(d["script_args"], (list, tuple)):
                raise ScaletrainError(f"script_args must be a list of strings (got {_short(d['script_args'])})")
            d["script_args"] = tuple(d["script_args"])
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["script_args"] = list(self.script_args)
        d["report_to"] = list(self.report_to)
        return d

    def check(self) -> None:
        """The options the training loop reads, checked before any process loads a model (and at --dry-run):
        types, finite numbers and ranges, each refused in one line naming the option and what is accepted."""
        _whole("checkpoint_every", self.checkpoint_every, 1)
        if self.eval_every is not None:
            _whole("eval_every", self.eval_every, 1, "or unset (checkpoint_every)")
        if not 0 <= _real("eval_fraction", self.eval_fraction) < 0.5:
            raise ScaletrainError(f"eval_fraction must be in [0, 0.5): a share of the data held out for evaluation "
                                  f"(got {self.eval_fraction})")
        if self.eval_data is not None and self.eval_fraction:
            raise ScaletrainError("give an eval split either as eval_data (--eval-data) or as eval_fraction of the "
                                  "data, not both")
        _whole("seed", self.seed, 0)
        if self.seed > MAX_SEED:
            raise ScaletrainError(f"seed must be from 0 to 2**64-1 = {MAX_SEED} (torch.manual_seed's range; got "
                                  f"{_short(self.seed)})")
        if self.max_steps is not None:
            _whole("max_steps", self.max_steps, 1, "or unset")
        if self.lora_alpha is not None:
            _whole("lora_alpha", self.lora_alpha, 1, "or unset (2 × rank)")
        if not isinstance(self.lr_schedule, str) or self.lr_schedule not in LR_SCHEDULES:
            raise ScaletrainError(f"lr_schedule {_short(self.lr_schedule)} is not accepted; use one of: "
                                  f"{', '.join(LR_SCHEDULES)}")
        lr = _real("lr", self.lr)
        if not lr > 0:
            raise ScaletrainError(f"lr must be a positive finite number (got {self.lr})")
        if not 0 <= _real("warmup_ratio", self.warmup_ratio) < 1:
            raise ScaletrainError(f"warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")
        for name in ("weight_decay", "max_grad_norm"):
            if _real(name, getattr(self, name)) < 0:
                raise ScaletrainError(f"{name} must be ≥ 0 (got {getattr(self, name)})")
        if not 0 <= _real("lora_dropout", self.lora_dropout) < 1:
            raise ScaletrainError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout})")
        if not isinstance(self.packing, bool):
            raise ScaletrainError(f"packing must be true or false (got {_short(self.packing)})")
        for name in ("dataset", "script"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip() or len(v) > MAX_PATH_CHARS):
                raise ScaletrainError(f"{name} must be a path (got {_short(v)})")
        if self.model_source is not None and (not isinstance(self.model_source, str)
                                              or not self.model_source.strip()
                                              or len(self.model_source) > MAX_PATH_CHARS):
            raise ScaletrainError(f"model_source must be random-init, a local path or an HF cache id "
                                  f"(got {_short(self.model_source)})")
        check_report_to(self.report_to)
        if self.data_columns is not None and not (isinstance(self.data_columns, dict) and all(
                isinstance(k, str) and isinstance(v, str) and k in ("text", "prompt", "completion", "messages")
                for k, v in self.data_columns.items())):
            raise ScaletrainError(f"data_columns {_short(self.data_columns)} is not accepted; give NAME: COLUMN pairs "
                                  "with NAME one of text, prompt, completion, messages")
        for name in ("save_checkpoints", "export_at_end"):
            if not isinstance(getattr(self, name), bool):
                raise ScaletrainError(f"{name} must be true or false (got {_short(getattr(self, name))})")
        if self.keep_checkpoints is not None:
            _whole("keep_checkpoints", self.keep_checkpoints, 1, "or unset")
        _whole("max_restarts", self.max_restarts, 0)
        if self.max_restarts > MAX_RESTARTS:
            raise ScaletrainError(f"max_restarts must be from 0 to {MAX_RESTARTS} (got {self.max_restarts})")
        if self.resume_from is not None and (not isinstance(self.resume_from, str) or not self.resume_from.strip()
                                             or len(self.resume_from) > MAX_PATH_CHARS):
            raise ScaletrainError(f"resume_from must be a run directory or checkpoint path (got "
                                  f"{_short(self.resume_from)})")
        if self.resume_from is not None and self.script is not None:
            raise ScaletrainError("resume_from is for the bundled trainer; pass your script its own resume flag")
        if not all(isinstance(a, str) for a in self.script_args):
            raise ScaletrainError("script_args must be a list of strings")


MAX_PATH_CHARS = 4096
MAX_RESTARTS = 100          # torchrun's restarts of the whole worker group: more means a run that cannot work


def _short(v: Any, limit: int = 60) -> str:
    text = v if isinstance(v, str) and limit > 60 else repr(v)
    return text if len(text) <= limit else text[:limit] + "…"


def _whole(name: str, v: Any, least: int, alternative: str = "") -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ScaletrainError(f"{name} must be a whole number ≥ {least}{' ' + alternative if alternative else ''} "
                              f"(got {_short(v)})")


def _real(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ScaletrainError(f"{name} must be a finite number (got {_short(v)})")
    return float(v)


def bundled_demo_dataset() -> Path:
    """presets/data/demo.jsonl, the offline demo data shipped with the package (the dataset when none is set)."""
    import scaletrain.presets as presets_pkg

    return Path(presets_pkg.__file__).parent / "data" / "demo.jsonl"


def bundled_dataset(objective: str = "sft") -> Path:
    """The bundled data a run trains on when no dataset is set: demo.jsonl for SFT, preference.jsonl (chosen and
    rejected pairs) for reward and DPO, prompts.jsonl for GRPO (trainer/objective_run.py bundled_dataset)."""
    if objective == "sft":
        return bundled_demo_dataset()
    return bundled_demo_dataset().with_name("prompts.jsonl" if objective == "grpo" else "preference.jsonl")

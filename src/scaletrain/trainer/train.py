"""The bundled trainer: `python -m scaletrain.trainer.train --run-dir DIR [--resume]`, started by `accelerate launch`.

Causal-LM fine-tuning (full, LoRA, QLoRA) with accelerate + transformers + peft, driven by the run directory's
plan.json: the plan's micro batch, accumulation, sequence length, precision, attention and checkpointing; the
train options' LR schedule, epochs or max steps, checkpoints and data.

Distribution: DDP/FSDP run as accelerate configures them (`Accelerator(cpu=...)` so two gloo ranks work on a CPU
host). ZeRO strategies use accelerate's DeepSpeed plugin with ds_config.json; on a CPU host accelerate then reports
one process on every rank while torch.distributed (and DeepSpeed) see them all, so rank and world size always come
from torch.distributed / the launcher's environment, and this trainer shards the data itself for every strategy.

Outputs (rank 0): metrics.jsonl (engine.metrics), TensorBoard events under tensorboard/, a human line per step on
stdout. Checkpoints: checkpoints/step-<n>/ every train.checkpoint_every steps and at the end, each completed by
trainer_state.json (written last); `--resume` continues from the newest complete one with the step count going on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.trainer import data as data_mod
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import MetricsWriter, RankMemory, StepMetrics
from scaletrain.engine.run.layout import RunDir, TrainOptions, atomic_write
from scaletrain.engine.vocabulary import Attention, Method, Optimizer, Precision, Strategy

SGD_MOMENTUM = 0.9                   # the memory model counts one fp32 momentum buffer for sgd
LR_SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}
CHECKPOINT_PREFIX = "step-"
TRAINER_STATE = "trainer_state.json"
SCHEDULER_STATE = "scheduler.pt"
DS_CHECKPOINT_TAG = "deepspeed"
EXIT_INTERRUPTED = 130               # shell convention for SIGINT


@dataclass(frozen=True)
class RunConfig:
    """Everything the loop needs, read once from plan.json."""

    run: RunDir
    train: TrainOptions
    model_id: str
    method: Method
    lora_rank: int
    lora_targets: tuple[str, ...]
    base_bits: int
    strategy: Strategy
    precision: Precision
    optimizer: Optimizer
    attn: Attention
    grad_ckpt: bool
    micro_batch: int
    grad_accum: int
    seq_len: int
    epochs: float
    planned_world_size: int

    @property
    def uses_deepspeed(self) -> bool:
        return self.strategy.uses_deepspeed

    @property
    def quantized_base(self) -> bool:
        return self.method == "qlora" or (self.method == "lora" and self.base_bits in (4, 8))


def read_run_config(run_dir: str | os.PathLike[str]) -> RunConfig:
    run = RunDir(run_dir)
    plan = run.read_plan()
    try:
        req, tr, batch = plan["request"], plan["training"], plan["batch"]
        train = TrainOptions.from_json(plan.get("train"))
        _check_train_options(train)
        return RunConfig(
            run=run, train=train, model_id=str(req["model"]), method=Method(tr["method"]),
            lora_rank=int(tr.get("lora_rank") or req.get("lora_rank") or 16),
            lora_targets=tuple(tr.get("lora_targets") or ()), base_bits=int(tr.get("base_bits", 16)),
            strategy=Strategy(tr["strategy"]), precision=Precision(tr["precision"]),
            optimizer=Optimizer(tr["optimizer"]), attn=Attention(tr["attn"]),
            grad_ckpt=bool(tr["grad_ckpt"]), micro_batch=int(batch["micro_batch"]),
            grad_accum=int(batch["grad_accum"]), seq_len=int(batch["seq_len"]),
            epochs=float(req.get("epochs") or 1.0), planned_world_size=int(batch["world_size"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ScaletrainError(f"{run.plan} is not a scaletrain plan (missing or bad field {e}); "
                              "write it with `scaletrain ... --run-dir DIR --dry-run`") from None


def _check_train_options(t: TrainOptions) -> None:
    """The options the loop reads, checked before any process loads a model."""
    if t.lr_schedule not in LR_SCHEDULES:
        raise ScaletrainError(f"lr_schedule {t.lr_schedule!r} is not accepted; use one of: {', '.join(LR_SCHEDULES)}")
    if not t.lr > 0:
        raise ScaletrainError(f"lr must be positive (got {t.lr})")
    if not 0 <= t.warmup_ratio < 1:
        raise ScaletrainError(f"warmup_ratio must be in [0, 1) (got {t.warmup_ratio})")
    if t.max_steps is not None and t.max_steps < 1:
        raise ScaletrainError(f"max_steps must be ≥ 1 or unset (got {t.max_steps})")
    if t.checkpoint_every < 1:
        raise ScaletrainError(f"checkpoint_every must be ≥ 1 optimizer step (got {t.checkpoint_every})")


# ---- distribution ----------------------------------------------------------------------------------------------
def rank_and_world(accelerator: Any) -> tuple[int, int]:
    """torch.distributed when initialised, else the launcher's RANK/WORLD_SIZE, else accelerate's view."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return accelerator.process_index, accelerator.num_processes


def _dist_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if _dist_ready():
        import torch.distributed as dist
        dist.barrier()


def make_accelerator(cfg: RunConfig) -> Any:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    if cfg.precision == "fp16" and not torch.cuda.is_available():
        raise ScaletrainError("precision fp16 needs a CUDA GPU; on CPU use --precision bf16 or fp32")
    if cfg.uses_deepspeed:
        acc = Accelerator(gradient_accumulation_steps=cfg.grad_accum)
        if acc.distributed_type != DistributedType.DEEPSPEED:
            print(f"scaletrain: warning: the plan's strategy is {cfg.strategy} but accelerate runs "
                  f"{acc.distributed_type.value}; launch with `scaletrain launch` or launch.sh", file=sys.stderr)
        else:
            _check_ds_config(acc, cfg)
        return acc
    # DDP's default keeps a second, flat copy of every gradient in its all-reduce buckets; bucket views make the
    # gradients live inside the buckets instead (torch DDP docs: saves "the total gradients size"). The memory
    # model counts the buckets as persistent gradients (engine/memory.py).
    from accelerate.utils import DistributedDataParallelKwargs

    return Accelerator(cpu=not torch.cuda.is_available(), gradient_accumulation_steps=cfg.grad_accum,
                       kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True)])


def _check_ds_config(acc: Any, cfg: RunConfig) -> None:
    """Fill 'auto' batch values with the plan's numbers (accelerate would use its own process count) and refuse
    sections that would fight the trainer."""
    ds = acc.state.deepspeed_plugin.deepspeed_config
    for key in ("optimizer", "scheduler"):
        if key in ds:
            raise ScaletrainError(f"ds_config.json has an {key!r} section; the bundled trainer builds the optimizer "
                                  "and LR schedule from the plan, so remove it (or use --script for your own)")
    _, world = rank_and_world(acc)
    wanted = {"train_micro_batch_size_per_gpu": cfg.micro_batch, "gradient_accumulation_steps": cfg.grad_accum,
              "train_batch_size": cfg.micro_batch * cfg.grad_accum * world}
    for key, value in wanted.items():
        have = ds.get(key, "auto")
        if have == "auto":
            ds[key] = value
        elif int(have) != value:
            raise ScaletrainError(f"ds_config.json {key} is {have} but the plan with {world} processes needs "
                                  f"{value}; rewrite the run directory or set it to \"auto\"")
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = cfg.train.max_grad_norm


# ---- model -----------------------------------------------------------------------------------------------------
def check_capabilities(cfg: RunConfig) -> None:
    """Fail fast, before loading anything, on choices this machine cannot run."""
    import importlib.util

    import torch

    if cfg.attn == "flash" and not (torch.cuda.is_available() and importlib.util.find_spec("flash_attn")):
        raise ScaletrainError("attn flash needs a CUDA GPU with the flash-attn package installed; "
                              "use --attn sdpa (or eager)")
    needs_bnb = cfg.quantized_base or cfg.optimizer == "adamw-8bit"
    if needs_bnb and not (torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes")):
        what = f"a {cfg.base_bits}-bit base" if cfg.quantized_base else "optimizer adamw-8bit"
        raise ScaletrainError(f"{what} needs bitsandbytes and a CUDA GPU (pip install bitsandbytes); "
                              "use --method lora/full with a 16-bit base and --optimizer adamw here")
    if cfg.quantized_base and cfg.train.model_source == "random-init":
        raise ScaletrainError("a quantized base needs pretrained weights: set the train option model_source to a "
                              "local path or HF cache id (random-init builds full-precision weights)")


def model_config_dict(model_id: str) -> dict[str, Any]:
    from scaletrain.engine.catalog.architectures import load_model

    return dict(load_model(model_id).config)


def build_model(cfg: RunConfig, device: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    attn = cfg.attn.hf_implementation
    src = cfg.train.model_source
    torch.manual_seed(cfg.train.seed)
    if src == "random-init":
        conf_d = model_config_dict(cfg.model_id)
        conf_d.pop("torch_dtype", None)
        conf_d.pop("dtype", None)
        conf = AutoConfig.for_model(conf_d.pop("model_type"), **conf_d)
        model = AutoModelForCausalLM.from_config(conf, attn_implementation=attn)
    else:
        kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": attn}
        if cfg.method != "full":           # frozen base in the compute precision; adapters stay fp32 (peft)
            kwargs["dtype"] = getattr(torch, cfg.precision.torch_dtype)
        if cfg.quantized_base:
            from transformers import BitsAndBytesConfig
            compute = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
            kwargs["quantization_config"] = (
                BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=compute)
                if cfg.base_bits == 4 else BitsAndBytesConfig(load_in_8bit=True))
            kwargs["device_map"] = {"": device}
        try:
            model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
        except OSError as e:
            raise ScaletrainError(f"cannot load model {src!r} offline ({str(e).splitlines()[0]}); give a local "
                                  "folder or an id already in the HF cache, or model_source random-init") from None
    model.config.use_cache = False
    if cfg.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.method.is_adapter:
        from peft import LoraConfig, get_peft_model

        if cfg.quantized_base:
            from peft import prepare_model_for_kbit_training
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=cfg.grad_ckpt,
                gradient_checkpointing_kwargs={"use_reentrant": False})
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.train.lora_alpha or 2 * cfg.lora_rank,
                          lora_dropout=cfg.train.lora_dropout, target_modules=list(cfg.lora_targets) or None,
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    return model


def make_tokenizer(cfg: RunConfig) -> data_mod.Tokenizer:
    if cfg.train.model_source == "random-init":
        return data_mod.ByteTokenizer(int(model_config_dict(cfg.model_id)["vocab_size"]))
    from transformers import AutoTokenizer

    try:
        return data_mod.HFTokenizer(AutoTokenizer.from_pretrained(cfg.train.model_source, local_files_only=True))
    except OSError as e:
        raise ScaletrainError(f"cannot load the tokenizer of {cfg.train.model_source!r} offline "
                              f"({str(e).splitlines()[0]})") from None


def make_optimizer(cfg: RunConfig, model: Any) -> Any:
    """Weight decay on matrices only (not biases or norms), the usual transformer recipe."""
    import torch

    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [g for g in ({"params": decay, "weight_decay": cfg.train.weight_decay},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.train.lr)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.train.lr, momentum=SGD_MOMENTUM)
    import bitsandbytes as bnb  # adamw-8bit; availability checked in check_capabilities

    return bnb.optim.AdamW8bit(groups, lr=cfg.train.lr)


# ---- checkpoints -----------------------------------------------------------------------------------------------
def newest_checkpoint(run: RunDir) -> Path | None:
    """The highest step-<n>/ whose trainer_state.json exists (an interrupted save is never picked)."""
    best: tuple[int, Path] | None = None
    if not run.checkpoints.is_dir():
        return None
    for d in run.checkpoints.iterdir():
        if d.name.startswith(CHECKPOINT_PREFIX) and (d / TRAINER_STATE).is_file():
            try:
                n = int(d.name[len(CHECKPOINT_PREFIX):])
            except ValueError:
                continue
            if best is None or n > best[0]:
                best = (n, d)
    return best[1] if best else None


def save_checkpoint(acc: Any, model: Any, scheduler: Any, run: RunDir, state: dict[str, Any], rank: int,
                    deepspeed: bool) -> Path:
    import torch

    d = run.checkpoints / f"{CHECKPOINT_PREFIX}{state['step']}"
    d.mkdir(parents=True, exist_ok=True)
    if deepspeed:
        model.save_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)    # every rank writes its ZeRO partition
    else:
        acc.save_state(str(d))
    if rank == 0:
        torch.save(scheduler.state_dict(), d / SCHEDULER_STATE)
    barrier()
    if rank == 0:
        atomic_write(d / TRAINER_STATE, json.dumps(state, indent=2) + "\n", backup=False)
    barrier()
    return d


def load_checkpoint(acc: Any, model: Any, scheduler: Any, d: Path, deepspeed: bool) -> dict[str, Any]:
    import torch

    if deepspeed:
        path, _ = model.load_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)
        if path is None:
            raise ScaletrainError(f"{d} has no DeepSpeed checkpoint; it was written by another strategy")
    else:
        if not any(d.glob("model*")):
            raise ScaletrainError(f"{d} holds no accelerate checkpoint; it was written by another strategy")
        acc.load_state(str(d))
    scheduler.load_state_dict(torch.load(d / SCHEDULER_STATE, weights_only=False))
    return json.loads((d / TRAINER_STATE).read_text())


# ---- the loop --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    rows: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int


def make_schedule(cfg: RunConfig, rows: int, world: int) -> Schedule:
    per_step = cfg.micro_batch * cfg.grad_accum * world
    steps_per_epoch = (rows // world) // cfg.micro_batch // cfg.grad_accum
    if steps_per_epoch == 0:
        raise ScaletrainError(
            f"the dataset gives {rows} blocks of {cfg.seq_len} tokens, but one optimizer step needs micro batch "
            f"{cfg.micro_batch} × accumulation {cfg.grad_accum} × {world} processes = {per_step}; "
            "add data, or lower the batch or the sequence length")
    total = cfg.train.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
    warmup = math.ceil(cfg.train.warmup_ratio * total)
    return Schedule(rows, steps_per_epoch, total, warmup)


def peak_memory(acc: Any, rank: int, world: int) -> tuple[RankMemory, ...]:
    """Every rank's peaks (CUDA allocated/reserved where present, host peak RSS always), gathered to all."""
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports kibibytes
    if torch.cuda.is_available():
        mine = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), rss]
    else:
        mine = [-1, -1, rss]
    t = torch.tensor(mine, dtype=torch.int64, device=acc.device)
    if _dist_ready() and world > 1:
        import torch.distributed as dist
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
    else:
        parts = [t]
    out = []
    for r, p in enumerate(parts):
        a, res, h = (int(x) for x in p.tolist())
        out.append(RankMemory(r, a if a >= 0 else None, res if res >= 0 else None, h))
    return tuple(out)


def all_sum(acc: Any, values: list[float]) -> list[float]:
    import torch

    t = torch.tensor(values, dtype=torch.float64, device=acc.device)
    if _dist_ready():
        import torch.distributed as dist
        dist.all_reduce(t)
    return t.tolist()


def _tensorboard(run: RunDir) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("scaletrain: note: tensorboard is not installed; metrics.jsonl only", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=str(run.path / "tensorboard"))


def train(cfg: RunConfig, resume: bool) -> int:
    import torch
    from transformers import get_scheduler

    dataset = Path(cfg.train.dataset).expanduser() if cfg.train.dataset else data_mod.bundled_demo_dataset()
    if not dataset.is_file():
        raise ScaletrainError(f"dataset {dataset} does not exist (give a JSONL file: train option dataset)")
    check_capabilities(cfg)
    acc = make_accelerator(cfg)
    rank, world = rank_and_world(acc)
    main = rank == 0
    if main and world != cfg.planned_world_size:
        print(f"scaletrain: warning: planned for {cfg.planned_world_size} processes, running {world}",
              file=sys.stderr)

    tok = make_tokenizer(cfg)
    blocks = data_mod.load_blocks(dataset, tok, cfg.seq_len, packing=cfg.train.packing)
    sched = make_schedule(cfg, len(blocks), world)
    model = build_model(cfg, acc.device)
    optimizer = make_optimizer(cfg, model)
    scheduler = get_scheduler(LR_SCHEDULES[cfg.train.lr_schedule], optimizer,
                              num_warmup_steps=sched.warmup_steps, num_training_steps=sched.total_steps)
    model, optimizer = acc.prepare(model, optimizer)
    ds = cfg.uses_deepspeed and hasattr(model, "save_checkpoint")

    step = 0
    if not resume and main and (old := newest_checkpoint(cfg.run)) is not None:
        print(f"scaletrain: note: starting at step 0 although {old} exists; --resume continues from it",
              flush=True)
    if resume:
        ck = newest_checkpoint(cfg.run)
        if ck is None:
            if main:
                print("scaletrain: no checkpoint to resume from; starting at step 0", flush=True)
        else:
            state = load_checkpoint(acc, model, scheduler, ck, ds)
            # [issue 6, relaunch] a micro-batch split that keeps micro × accum reads exactly the same rows per
            # optimizer step (make_schedule and shard_order depend on the product only), so it may resume.
            layout = {"micro_batch × grad_accum": cfg.micro_batch * cfg.grad_accum, "world_size": world,
                      "rows": len(blocks)}
            saved = {**state, "micro_batch × grad_accum": (state.get("micro_batch") or 0) * (state.get("grad_accum")
                                                                                            or 0)}
            changed = {k: (saved.get(k), v) for k, v in layout.items() if saved.get(k) != v}
            if changed:
                what = ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items())
                raise ScaletrainError(f"cannot resume {ck.name}: the data layout changed ({what}); "
                                      "start a new run directory instead")
            step = int(state["step"])
            if main:
                print(f"scaletrain: resumed from {ck} at step {step}", flush=True)

    if main:
        n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3: full size
        sharding = f", DeepSpeed data-parallel over {model.dp_world_size}" if ds else ""
        print(f"scaletrain: {cfg.model_id} ({cfg.method}, {cfg.strategy}, {cfg.precision}) on {world} "
              f"process(es){sharding}; {len(blocks)} blocks × {cfg.seq_len} tokens from {dataset.name}; "
              f"{sched.steps_per_epoch} steps/epoch, {sched.total_steps} steps; {n_params:,} parameters",
              flush=True)
    writer = MetricsWriter(cfg.run.metrics) if main else None
    tb = _tensorboard(cfg.run) if main else None
    every = cfg.train.checkpoint_every
    last_saved = step
    model.train()
    t_last = time.perf_counter()
    try:
        while step < sched.total_steps:
            epoch = step // sched.steps_per_epoch
            order = data_mod.shard_order(sched.rows, epoch, cfg.train.seed, rank, world)
            first_micro = (step % sched.steps_per_epoch) * cfg.grad_accum
            loss_sum = tokens = 0.0
            micro_in_step = 0
            for m in range(first_micro, sched.steps_per_epoch * cfg.grad_accum):
                rows = order[m * cfg.micro_batch:(m + 1) * cfg.micro_batch]
                batch = {k: torch.tensor([getattr(blocks, k)[i] for i in rows], device=acc.device)
                         for k in ("input_ids", "labels", "attention_mask")}
                micro_in_step += 1
                boundary = micro_in_step == cfg.grad_accum
                acc.sync_gradients = boundary
                with contextlib.nullcontext() if boundary else acc.no_sync(model):
                    loss = model(**batch).loss
                    acc.backward(loss)
                loss_sum += float(loss.detach())
                tokens += float(batch["attention_mask"].sum())
                if not boundary:
                    continue
                grad_norm = None
                if not ds and cfg.train.max_grad_norm > 0:
                    norm = acc.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
                    grad_norm = float(norm) if norm is not None else None
                lr = float(scheduler.get_last_lr()[0])
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if ds:
                    gn = model.get_global_grad_norm()
                    grad_norm = float(gn) if gn is not None else None
                step += 1
                loss_all, micro_all, tok_all = all_sum(acc, [loss_sum, float(micro_in_step), tokens])
                now = time.perf_counter()
                step_s = now - t_last
                t_last = now
                rec = StepMetrics(step=step, total_steps=sched.total_steps,
                                  epoch=round(step / sched.steps_per_epoch, 4), loss=loss_all / micro_all, lr=lr,
                                  tokens_per_second=tok_all / step_s, step_seconds=step_s, world_size=world,
                                  time=time.time(), tokens=int(tok_all), grad_norm=grad_norm,
                                  peak_memory=peak_memory(acc, rank, world))
                if main:
                    writer.write(rec)
                    if tb is not None:
                        for k in ("loss", "lr", "tokens_per_second", "step_seconds"):
                            tb.add_scalar(f"train/{k}", getattr(rec, k), step)
                    print(f"step {step}/{sched.total_steps} loss {rec.loss:.4f} lr {lr:.3g} "
                          f"tok/s {rec.tokens_per_second:.0f} step {step_s:.3f}s", flush=True)
                loss_sum = tokens = 0.0
                micro_in_step = 0
                if step % every == 0 or step == sched.total_steps:
                    save_checkpoint(acc, model, scheduler, cfg.run,
                                    {"step": step, "total_steps": sched.total_steps, "epoch": rec.epoch,
                                     "micro_batch": cfg.micro_batch, "grad_accum": cfg.grad_accum,
                                     "world_size": world, "rows": len(blocks), "strategy": cfg.strategy,
                                     "time": time.time()}, rank, ds)
                    last_saved = step
                    t_last = time.perf_counter()          # saving is not step time
                _injected_failure(step, rank, resume)
                if step >= sched.total_steps:
                    break
    except KeyboardInterrupt:
        if main:
            print(f"scaletrain: interrupted at step {step} (last checkpoint: step {last_saved})", flush=True)
        return EXIT_INTERRUPTED
    finally:
        if writer is not None:
            writer.close()
        if tb is not None:
            tb.close()
    barrier()
    if main:
        print(f"scaletrain: done, {step} steps; checkpoints in {cfg.run.checkpoints}", flush=True)
    acc.end_training()
    return 0


# [issue 6, failure doctor tests] SCALETRAIN_FAIL_AT_STEP=N kills rank SCALETRAIN_FAIL_RANK (default 0) with
# SIGKILL right after step N (its metrics and any checkpoint are written), only in a run that was not resumed: a
# real killed rank, exactly what the host OOM killer leaves behind. Unset in normal runs.
FAIL_AT_STEP_ENV = "SCALETRAIN_FAIL_AT_STEP"
FAIL_RANK_ENV = "SCALETRAIN_FAIL_RANK"


def _injected_failure(step: int, rank: int, resumed: bool) -> None:
    at = os.environ.get(FAIL_AT_STEP_ENV)
    if not at or resumed or step != int(at) or rank != int(os.environ.get(FAIL_RANK_ENV, "0")):
        return
    import signal

    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaletrain.trainer.train",
                                description="scaletrain's bundled causal-LM trainer (run it via accelerate launch)")
    p.add_argument("--run-dir", required=True, help="a run directory written by scaletrain (holds plan.json)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run dir")
    args = p.parse_args(argv)
    # DeepSpeed 0.19 calls torch.distributed APIs that torch 2.13 deprecates, once per collective: keep logs readable
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    try:
        return train(read_run_config(args.run_dir), args.resume)
    except ScaletrainError as e:
        print(f"scaletrain: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

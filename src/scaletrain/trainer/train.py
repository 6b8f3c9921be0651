"""The bundled trainer: `python -m scaletrain.trainer.train --run-dir DIR [--resume]`, started by `accelerate launch`.

Causal-LM fine-tuning (full, LoRA, QLoRA) with accelerate + transformers + peft, driven by the run directory's
plan.json: the plan's micro batch, accumulation, sequence length, precision, attention and checkpointing; the
train options' LR schedule, epochs or max steps, checkpoints and data.

Distribution: DDP runs as accelerate configures it (`Accelerator(cpu=...)` so two gloo ranks work on a CPU host);
FSDP is torch's fully_shard applied here (trainer/fsdp.py: accelerate drops its FSDP plugin on a CPU host), with
DCP-sharded checkpoints. What each rank got (distributed type, wrapper) is checked against the plan's strategy
before the first step, and a mismatch is refused in one line (distributed.check_distribution). ZeRO strategies use
accelerate's DeepSpeed plugin with ds_config.json; on a CPU host accelerate then reports one process on every rank
while torch.distributed (and DeepSpeed) see them all, so rank and world size always come from torch.distributed /
the launcher's environment, and this trainer shards the data itself for every strategy.

Outputs (rank 0): metrics.jsonl (engine.run.metrics), TensorBoard events under tensorboard/, a human line per step on
stdout. Checkpoints: checkpoints/step-<n>/ every train.checkpoint_every steps and at the end, each completed by
trainer_state.json (written last); `--resume` continues from the newest one that loads (a damaged one is passed over)
with the step count going on, after cutting metrics.jsonl back to that step. train.save_checkpoints false writes
none (validation runs); train.keep_checkpoints N keeps the newest N.

Data: the train option's JSONL file, or the bundled demo set; the demo set is repeated when it is too small for
one optimizer step of the plan (synthetic data sized to the plan: a demo run never dies for lack of tokens), while
a user's dataset that is too small stays a one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.metrics import MetricsWriter, StepMetrics, truncate_metrics
from scaletrain.engine.request.options import bundled_demo_dataset
from scaletrain.engine.startup import TRANSFORMERS_STACK, import_stack
from scaletrain.trainer import data as data_mod
from scaletrain.trainer.chunked_loss import causal_lm_loss, compute_dtype_for, output_head
from scaletrain.trainer.checkpoints import prune_checkpoints, resume_from, save_checkpoint
from scaletrain.trainer.config import RunConfig, read_run_config
from scaletrain.trainer.schedules import lr_scheduler
from scaletrain.trainer.batches import TokenTable, token_table
from scaletrain.trainer.distributed import (all_sum, barrier, check_distribution, freeze_without_gradient,
                                            load_deepspeed_cpu_comm_op, make_accelerator, rank_and_world, shutdown,
                                            step_stats)
from scaletrain.trainer.model import build_model, check_capabilities, make_optimizer, make_tokenizer
from scaletrain.trainer.telemetry import RankSampler

EXIT_INTERRUPTED = 130               # shell convention for SIGINT
# The accelerator, the (DDP/DeepSpeed) model and the optimizer, kept alive until the process ends with os._exit:
# freeing them can deadlock a gloo rank (distributed.shutdown).
KEEP_UNTIL_EXIT: list[Any] = []


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


def _weights(model: Any) -> str:
    """What the weights really are, for the header line: dtype → parameter count (bitsandbytes' packed 4-bit
    weights show as uint8), trainable or frozen."""
    counts: dict[str, int] = {}
    for p in model.parameters():
        key = f"{'trainable' if p.requires_grad else 'frozen'} {str(p.dtype).removeprefix('torch.')}"
        counts[key] = counts.get(key, 0) + getattr(p, "ds_numel", p.numel())
    return "weights " + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _trackers(run: RunDir, report_to: tuple[str, ...] = ("tensorboard",)) -> Any:
    """The trackers rank 0 reports to besides metrics.jsonl (trainer/trackers.py): TensorBoard, W&B, none."""
    from scaletrain.trainer.trackers import open_trackers

    return open_trackers(run, report_to)


@dataclass
class Session:
    """What prepare() builds for one rank: the accelerator, the prepared model and optimizer, the LR scheduler, the
    tokenized data and its schedule."""
    cfg: RunConfig
    acc: Any
    model: Any
    optimizer: Any
    scheduler: Any
    blocks: TokenTable
    sched: Schedule
    rank: int
    world: int
    ds: bool                  # DeepSpeed's own engine: it clips, saves and reports the grad norm itself
    dataset_name: str
    telemetry: RankSampler    # this rank's device and step phases, sent with its peaks (issue 23)
    eval_blocks: Any = None   # the eval split (trainer/evaluate.py), None without one
    loss_head: Any = None     # --loss chunked: lm_head, read by trainer/chunked_loss.py (None: the model's loss)
    loss_dtype: Any = None    # the dtype lm_head's matmul runs in under the chunked loss

    @property
    def main(self) -> bool:
        return self.rank == 0


@dataclass
class Progress:
    """Where the step loop is: the optimizer steps done, the last checkpointed one, when the last step ended."""
    step: int
    last_saved: int
    t_last: float
    cpu_last: float = 0.0         # process CPU time when the last step ended


def train(cfg: RunConfig, resume: bool) -> int:
    """Prepare, check a resume, run the step loop, report. Under torchelastic's restart (train.max_restarts) or
    with a --resume-from checkpoint the run resumes without --resume."""
    from scaletrain.engine.launch.elastic import restart_count, restart_line

    import_stack(*stack_modules(cfg))
    restart = restart_count(os.environ)
    if restart and int(os.environ.get("RANK", "0")) == 0:
        print(restart_line(restart, os.environ), flush=True)
    resume = resume or restart > 0 or cfg.train.resume_from is not None
    if cfg.objective != "sft":          # reward / dpo / grpo: TRL's trainers (issue 16)
        import torch

        if cfg.uses_deepspeed and not torch.cuda.is_available():
            load_deepspeed_cpu_comm_op()
        from scaletrain.trainer.objective_run import train_objective

        return train_objective(cfg, resume)
    s = prepare(cfg)
    step = resume_step(s, resume)
    report_start(s, step, resume)
    done = step_loop(s, step, resume)
    if done is None:
        return EXIT_INTERRUPTED
    report_done(s, done)
    return 0


def stack_modules(cfg: RunConfig) -> tuple[str, ...]:
    """The libraries this rank loads anyway, loaded first with the garbage collector paused (engine/startup.py)."""
    return (*TRANSFORMERS_STACK, "accelerate", *(("peft",) if cfg.method != "full" else ()),
            *(("deepspeed",) if cfg.uses_deepspeed else ()), *(("trl",) if cfg.objective != "sft" else ()))


def prepare(cfg: RunConfig) -> Session:
    """The accelerator, the data and its schedule, the model, the optimizer and the LR scheduler, prepared."""
    import torch

    if cfg.uses_deepspeed and not torch.cuda.is_available():
        load_deepspeed_cpu_comm_op()
    demo = not cfg.train.dataset
    dataset = bundled_demo_dataset() if demo else Path(cfg.train.dataset).expanduser()
    check_capabilities(cfg)
    acc = make_accelerator(cfg)
    rank, world = rank_and_world(acc)
    main = rank == 0
    if main and world != cfg.planned_world_size:
        print(f"scaletrain: warning: planned for {cfg.planned_world_size} processes, running {world}",
              file=sys.stderr)

    tok = make_tokenizer(cfg)
    per_step = cfg.micro_batch * cfg.grad_accum * world
    blocks = data_mod.load_blocks(cfg.train.dataset or dataset, tok, cfg.seq_len, packing=cfg.train.packing,
                                  columns=cfg.train.data_columns, min_blocks=per_step if demo else 0)
    if main and blocks.repeats > 1:
        print(f"scaletrain: note: the bundled demo data is repeated {blocks.repeats}× to {len(blocks)} blocks of "
              f"{cfg.seq_len} tokens (one optimizer step needs {per_step}); set the train option dataset for real "
              "data", flush=True)
    train_blocks, eval_blocks = _eval_split(cfg, blocks, tok)
    blocks = token_table(train_blocks)
    sched = make_schedule(cfg, len(blocks), world)
    model = build_model(cfg, acc.device)
    freeze_without_gradient(model, cfg, world)
    if torch.cuda.is_available():
        # building (a random base written out and quantized, tied weights before tying) is not a training step:
        # the peaks the metrics report start here
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(acc.device)
    fsdp = cfg.strategy == "fsdp"
    if fsdp:              # the trainer shards (trainer/fsdp.py says why); accelerate wraps the optimizer only
        from scaletrain.trainer.fsdp import shard_model

        model = shard_model(model, cfg, acc.device)
    optimizer = make_optimizer(cfg, model)               # under FSDP: over the DTensor shards
    scheduler = lr_scheduler(cfg.train.lr_schedule, optimizer, sched.warmup_steps, sched.total_steps)
    head = output_head(model) if cfg.loss == "chunked" else None
    if fsdp:
        optimizer = acc.prepare(optimizer)
    else:
        model, optimizer = acc.prepare(model, optimizer)
    KEEP_UNTIL_EXIT.extend((acc, model, optimizer))
    wrapped = check_distribution(cfg, acc, model, world)      # the run is what the plan says, or nothing runs
    if main:
        print(f"scaletrain: {wrapped}", flush=True)
    ds = cfg.uses_deepspeed and hasattr(model, "save_checkpoint")
    dtype = compute_dtype_for(head.weight, acc.mixed_precision) if head is not None else None
    gpu_index = acc.device.index if acc.device.type == "cuda" else None
    return Session(cfg, acc, model, optimizer, scheduler, blocks, sched, rank, world, ds, dataset.name,
                   RankSampler(0 if gpu_index is None and acc.device.type == "cuda" else gpu_index), eval_blocks,
                   head, dtype)


def resume_step(s: Session, resume: bool) -> int:
    """The step to start at: 0, or with --resume the newest checkpoint's (the run's own, else the plan's
    --resume-from one), refused when the data layout changed; another world size with the same effective batch
    resumes (trainer/reshard.py)."""
    from scaletrain.trainer.reshard import check_layout, resume_candidates

    cfg = s.cfg
    if not resume:
        if s.main and (old := cfg.run.newest_checkpoint()) is not None:
            print(f"scaletrain: note: starting at step 0 although {old} exists; --resume continues from it",
                  flush=True)
        return 0
    found = resume_from(s.acc, s.model, s.scheduler, cfg.run, s.ds, s.main, s.optimizer,
                        candidates=resume_candidates(cfg.run, cfg.train.resume_from), world=s.world, rank=s.rank)
    if found is None:
        if s.main:
            print("scaletrain: no checkpoint to resume from; starting at step 0", flush=True)
        return 0
    ck, state = found
    # [issue 6, relaunch; issue 33] a split of the same effective batch (micro × accum × world) reads exactly the
    # same rows per optimizer step (make_schedule and shard_order depend on the product only), so it may resume.
    resharded = check_layout(ck, state, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, world=s.world,
                             rows=len(s.blocks), strategy=cfg.strategy)
    step = int(state["step"])
    if s.main:
        print(f"scaletrain: resumed from {ck} at step {step}{f' ({resharded})' if resharded else ''}", flush=True)
    return step


def report_start(s: Session, step: int, resume: bool) -> None:
    """Rank 0's header line; on resume, metrics.jsonl cut back to the checkpoint's step."""
    cfg, model = s.cfg, s.model
    if s.main:
        n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3: full size
        sharding = f", DeepSpeed data-parallel over {model.dp_world_size}" if s.ds else ""
        print(f"scaletrain: {cfg.model_id} ({cfg.method}, {cfg.strategy}, {cfg.precision}) on {s.world} "
              f"process(es){sharding}; {len(s.blocks)} blocks × {cfg.seq_len} tokens from {s.dataset_name} "
              f"({s.blocks.source_samples:,} records, {s.blocks.source_tokens:,} tokens); "
              f"{s.sched.steps_per_epoch} steps/epoch, {s.sched.total_steps} steps; {n_params:,} parameters; "
              f"{_weights(model)}, mixed precision {s.acc.mixed_precision}, {cfg.optimizer} "
              f"({cfg.optimizer_impl if cfg.optimizer != 'adamw-8bit' else 'bitsandbytes'})"
              f"{'; loss chunked (lm_head + cross-entropy in token chunks)' if s.loss_head is not None else ''}",
              flush=True)
    if resume and s.main:
        dropped = truncate_metrics(cfg.run.metrics, step)      # steps after the checkpoint are logged again
        if dropped:
            print(f"scaletrain: metrics.jsonl cut back to step {step} ({dropped} later line(s) dropped)", flush=True)


def _eval_split(cfg: RunConfig, blocks: Any, tok: Any) -> tuple[Any, Any]:
    """(training blocks, eval blocks or None): --eval-data read like the data, or eval_fraction held out."""
    from scaletrain.trainer.evaluate import split_eval

    if cfg.train.eval_data:
        return blocks, data_mod.load_blocks(cfg.train.eval_data, tok, cfg.seq_len, packing=cfg.train.packing,
                                            columns=cfg.train.data_columns)
    return split_eval(blocks, cfg.train.eval_fraction)


def _maybe_evaluate(s: Session, p: Progress, rec: StepMetrics) -> StepMetrics:
    """The eval split's loss at this step when one is due (every eval_every steps and at the last); every rank."""
    if s.eval_blocks is None:
        return rec
    every = s.cfg.train.eval_every or s.cfg.train.checkpoint_every
    if p.step % every and p.step != s.sched.total_steps:
        return rec
    from dataclasses import replace

    from scaletrain.trainer.evaluate import evaluate

    loss, secs = evaluate(s.model, s.eval_blocks, s.cfg.micro_batch, s.acc.device, s.rank, s.world,
                          lambda v: all_sum(s.acc, v), loss_of=lambda batch: _loss(s, batch))
    p.t_last = time.perf_counter()            # the next step's time does not include the evaluation
    return replace(rec, eval_loss=loss, eval_seconds=secs)


def step_loop(s: Session, step: int, resume: bool) -> int | None:
    """Optimizer steps from `step` to the schedule's end, epoch by epoch; the last step, or None when interrupted."""
    writer = MetricsWriter(s.cfg.run.metrics) if s.main else None
    trackers = _trackers(s.cfg.run, s.cfg.train.report_to) if s.main else None
    p = Progress(step, step, time.perf_counter(), time.process_time())
    s.model.train()
    try:
        while p.step < s.sched.total_steps:
            _epoch(s, p, writer, trackers, resume)
    except KeyboardInterrupt:
        if s.main:
            print(f"scaletrain: interrupted at step {p.step} (last checkpoint: step {p.last_saved})", flush=True)
        return None
    finally:
        if writer is not None:
            writer.close()
        if trackers is not None:
            trackers.close()
    return p.step


def _epoch(s: Session, p: Progress, writer: MetricsWriter | None, trackers: Any, resume: bool) -> None:
    """The rest of the current epoch's micro-batches (or up to the last step): forward, backward, and at every
    accumulation boundary an optimizer step, its metrics and a checkpoint when due. The loss stays on the device
    through the micro-steps and the tokens are counted on the host: the host waits for the device once per
    optimizer step, in step_stats (a plain loop's pace: no float() per micro-step)."""
    cfg, acc, model = s.cfg, s.acc, s.model
    order = data_mod.shard_order(s.sched.rows, p.step // s.sched.steps_per_epoch, cfg.train.seed, s.rank, s.world)
    first_micro = (p.step % s.sched.steps_per_epoch) * cfg.grad_accum
    loss_sum, tokens = None, 0
    micro_in_step = 0
    for m in range(first_micro, s.sched.steps_per_epoch * cfg.grad_accum):
        s.telemetry.phase("data")
        rows = order[m * cfg.micro_batch:(m + 1) * cfg.micro_batch]
        batch = s.blocks.batch(rows, acc.device)
        micro_in_step += 1
        s.telemetry.phase("compute")
        boundary = micro_in_step == cfg.grad_accum
        acc.sync_gradients = boundary
        with contextlib.nullcontext() if boundary else acc.no_sync(model):
            loss = _loss(s, batch)
            acc.backward(loss)
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        tokens += s.blocks.tokens(rows)
        if not boundary:
            continue
        s.telemetry.phase("optimizer")
        lr, grad_norm = _optimizer_step(s)
        p.step += 1
        rec = _maybe_evaluate(s, p, _step_metrics(s, p, lr, grad_norm, loss_sum, micro_in_step, tokens))
        if s.main:
            _report_step(s, rec, writer, trackers)
        loss_sum, tokens = None, 0
        micro_in_step = 0
        if cfg.train.save_checkpoints and (p.step % cfg.train.checkpoint_every == 0
                                           or p.step == s.sched.total_steps):
            _checkpoint(s, p, rec)
        _injected_failure(p.step, s.rank, resume)
        if p.step >= s.sched.total_steps:
            break


def _loss(s: Session, batch: dict) -> Any:
    """The micro-batch's mean loss over its counted tokens: the model's own (B·S·V logits), or the chunked one."""
    if s.loss_head is None:
        return s.model(**batch).loss
    return causal_lm_loss(s.model, batch, s.loss_head, s.loss_dtype)


def _optimizer_step(s: Session) -> tuple[float, Any]:
    """Clip (unless DeepSpeed does), step the optimizer and the LR schedule: the LR the step used, the grad norm
    (a tensor left on the device, a number from DeepSpeed, or None)."""
    grad_norm = None
    if not s.ds and s.cfg.train.max_grad_norm > 0:
        grad_norm = s.acc.clip_grad_norm_(s.model.parameters(), s.cfg.train.max_grad_norm)
        if s.cfg.strategy == "fsdp":
            from scaletrain.trainer.fsdp import full_norm

            grad_norm = full_norm(grad_norm)         # a DTensor over the shards: its whole value
    lr = float(s.scheduler.get_last_lr()[0])
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    if s.ds:
        grad_norm = s.model.get_global_grad_norm()
    return lr, grad_norm


def _step_metrics(s: Session, p: Progress, lr: float, grad_norm: Any, loss_sum: Any, micro_in_step: int,
                  tokens: Any) -> StepMetrics:
    """The step's metrics summed over every rank (one collective: every rank calls it)."""
    st = step_stats(s.acc, s.world, [loss_sum, float(micro_in_step), tokens], grad_norm, s.telemetry.reading())
    loss_all, micro_all, tok_all = st.sums
    now, cpu = time.perf_counter(), time.process_time()
    step_s, step_cpu = now - p.t_last, cpu - p.cpu_last
    p.t_last, p.cpu_last = now, cpu
    return StepMetrics(step=p.step, total_steps=s.sched.total_steps, epoch=round(p.step / s.sched.steps_per_epoch, 4),
                       loss=loss_all / micro_all, lr=lr, tokens_per_second=tok_all / step_s, step_seconds=step_s,
                       world_size=s.world, time=time.time(), tokens=int(tok_all), grad_norm=st.grad_norm,
                       peak_memory=st.peaks, cpu_seconds=step_cpu)


def _report_step(s: Session, rec: StepMetrics, writer: MetricsWriter | None, trackers: Any) -> None:
    if writer is not None:
        writer.write(rec)
    if trackers is not None:
        scalars = {f"train/{k}": getattr(rec, k) for k in ("loss", "lr", "tokens_per_second", "step_seconds")}
        if rec.eval_loss is not None:
            scalars["eval/loss"] = rec.eval_loss
        trackers.add_scalars(scalars, rec.step)
    ev = (f" eval loss {rec.eval_loss:.4f} ppl {rec.eval_perplexity:.4g} ({rec.eval_seconds:.2f}s)"
          if rec.eval_loss is not None and rec.eval_perplexity is not None else "")
    print(f"step {rec.step}/{s.sched.total_steps} loss {rec.loss:.4f} lr {rec.lr:.3g} "
          f"tok/s {rec.tokens_per_second:.0f} step {rec.step_seconds:.3f}s{ev}", flush=True)


def _checkpoint(s: Session, p: Progress, rec: StepMetrics) -> None:
    cfg = s.cfg
    save_checkpoint(s.acc, s.model, s.scheduler, cfg.run,
                    {"step": p.step, "total_steps": s.sched.total_steps, "epoch": rec.epoch,
                     "micro_batch": cfg.micro_batch, "grad_accum": cfg.grad_accum,
                     "world_size": s.world, "rows": len(s.blocks), "strategy": cfg.strategy,
                     "time": time.time()}, s.rank, s.ds, s.optimizer)
    prune_checkpoints(cfg.run, cfg.train.keep_checkpoints, s.rank)
    p.last_saved = p.step
    p.t_last, p.cpu_last = time.perf_counter(), time.process_time()     # saving is not step time


def report_done(s: Session, step: int) -> None:
    barrier()
    if s.main:
        where = (f"checkpoints in {s.cfg.run.checkpoints}" if s.cfg.train.save_checkpoints
                 else "no checkpoints written (save_checkpoints false)")
        print(f"scaletrain: done, {step} step{'s' if step != 1 else ''}; {where}", flush=True)
    if s.cfg.train.save_checkpoints and s.cfg.train.export_at_end:
        from scaletrain.trainer.export import export_at_end

        export_at_end(s, step)
    s.acc.end_training()
    shutdown()


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


def _exit(code: int) -> None:
    """Flush what the rank wrote and leave without tearing the distributed objects down (distributed.shutdown says
    why): they are held in KEEP_UNTIL_EXIT, so returning from train() frees none of them either."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_as_script() -> None:
    """main(), then os._exit with its code. An exception still ends the process the ordinary way: its traceback is
    what the doctor reads, and a failing rank that lingers is what lets torchelastic name the first failure (its
    peers are stopped by the agent either way)."""
    _exit(main())


if __name__ == "__main__":
    _run_as_script()

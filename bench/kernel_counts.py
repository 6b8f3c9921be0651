"""Ops each training loop dispatches per optimizer step, counted with torch.profiler on tiny models (CPU).

The time model's host term is a cost per dispatched op × the ops a micro-step dispatches; the cost was fitted to
runs of the bundled trainer (engine/estimate/time_constants.py HOST_SECONDS_PER_KERNEL). A loop that dispatches more or
fewer ops around the same model pays more or less host time: this counts them, for the same model, batch and
optimizer, in

  trainer          the bundled trainer's own step loop (trainer/train.py step_loop, on a Session that prepare()
                   builds from a run directory scaletrain wrote): metrics, TensorBoard and all
  accelerate-loop  the accelerate examples' loop: accelerator.accumulate, accelerator.backward, clip, step, zero_grad
  plain            a plain PyTorch loop (bench/plain_loop.py's step)
  hf-trainer       transformers' Trainer (its own dataloader, collation and logging every step)

Counted: every aten op the dispatcher ran in the profiled step ("dispatched", nested calls included: what the host
pays for) and the leaf aten ops ("leaf", about the kernels a GPU would launch). One process, one thread, after two
warm-up steps; cases: a dense model full fine-tuned, and with LoRA; accumulation 1 and 2.

    PYTHONPATH=src .venv/bin/python bench/kernel_counts.py [--machine vm]

Writes bench/results/kernel_counts-<machine>.json; the per-loop ratios to the trainer's count are what
engine/estimate/time_constants.py LOOP_HOST_OPS quotes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from machine import machine  # bench/machine.py

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
WARMUP_STEPS = 2
CASES = (  # (name, extra plan flags)
    ("tiny-qwen2 full", ["--method", "full"]),
    ("tiny-qwen2 lora", ["--method", "lora", "--lora-rank", "8"]),
)
LOOPS = ("trainer", "accelerate-loop", "plain", "hf-trainer")


def write_run(folder: Path, flags: list[str], grad_accum: int) -> Path:
    run = folder / f"run-{len(list(folder.iterdir()))}"
    argv = [sys.executable, "-m", "scaletrain.tui.cli", "--preset", "cpu-tiny", "--gpus", "1xCPU", "--headless",
            "--dry-run", "--run-dir", str(run), "--micro-batch", "4", "--grad-accum", str(grad_accum),
            "--set", "train.save_checkpoints=false", *flags]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return run


def count(prof) -> dict:
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    leaf = [e for e in events if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return {"dispatched": len(events), "leaf": len(leaf)}


def profiled(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return count(prof)


def trainer_counts(run: Path) -> dict:
    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.train import prepare, step_loop

    s = prepare(read_run_config(run))
    step_loop(replace(s, sched=replace(s.sched, total_steps=WARMUP_STEPS)), 0, False)
    return profiled(lambda: step_loop(replace(s, sched=replace(s.sched, total_steps=WARMUP_STEPS + 1)),
                                      WARMUP_STEPS, False))


def _model_and_optimizer(cfg):
    import torch

    from scaletrain.trainer.model import build_model

    model = build_model(cfg, "cpu")
    trainable = [q for q in model.parameters() if q.requires_grad]
    groups = [g for g in ({"params": [q for q in trainable if q.ndim >= 2], "weight_decay": cfg.train.weight_decay},
                          {"params": [q for q in trainable if q.ndim < 2], "weight_decay": 0.0}) if g["params"]]
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    return model, torch.optim.AdamW(groups, lr=cfg.train.lr, **impl[cfg.optimizer_impl])


def _batches(cfg, vocab: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    while True:
        ids = torch.randint(3, vocab, (cfg.micro_batch, cfg.seq_len), generator=gen)
        yield {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}


def plain_counts(run: Path) -> dict:
    import torch

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.model import model_config_dict

    cfg = read_run_config(run)
    model, opt = _model_and_optimizer(cfg)
    data = _batches(cfg, int(model_config_dict(cfg.model_id)["vocab_size"]))
    model.train()

    def step() -> None:
        for _ in range(cfg.grad_accum):
            loss = model(**next(data)).loss / cfg.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(WARMUP_STEPS):
        step()
    return profiled(step)


def accelerate_counts(run: Path) -> dict:
    from accelerate import Accelerator

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.model import model_config_dict

    cfg = read_run_config(run)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    model, opt = _model_and_optimizer(cfg)
    model, opt = acc.prepare(model, opt)
    data = _batches(cfg, int(model_config_dict(cfg.model_id)["vocab_size"]))
    model.train()

    def step() -> None:
        for _ in range(cfg.grad_accum):
            with acc.accumulate(model):
                outputs = model(**next(data))
                acc.backward(outputs.loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
                opt.step()
                opt.zero_grad()

    for _ in range(WARMUP_STEPS):
        step()
    return profiled(step)


def hf_trainer_counts(run: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.model import build_model, model_config_dict

    cfg = read_run_config(run)
    model = build_model(cfg, "cpu")
    data = _batches(cfg, int(model_config_dict(cfg.model_id)["vocab_size"]))
    rows = [{k: v[0] for k, v in next(data).items()} for _ in range(cfg.micro_batch * cfg.grad_accum * 8)]
    got: dict = {}

    class Profile(TrainerCallback):
        prof = None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == WARMUP_STEPS:
                self.prof = profile(activities=[ProfilerActivity.CPU])
                self.prof.__enter__()

        def on_step_end(self, args, state, control, **kw):
            if self.prof is not None and state.global_step == WARMUP_STEPS + 1:
                self.prof.__exit__(None, None, None)
                got.update(count(self.prof))
                self.prof = None

    args = TrainingArguments(output_dir=str(run / "hf"), per_device_train_batch_size=cfg.micro_batch,
                             gradient_accumulation_steps=cfg.grad_accum, max_steps=WARMUP_STEPS + 2,
                             learning_rate=cfg.train.lr, optim="adamw_torch_fused",
                             max_grad_norm=cfg.train.max_grad_norm,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="cosine")
    with contextlib.redirect_stdout(sys.stderr):
        Trainer(model=model, args=args, train_dataset=rows, callbacks=[Profile()]).train()
    return got


COUNTERS = {"trainer": trainer_counts, "accelerate-loop": accelerate_counts, "plain": plain_counts,
            "hf-trainer": hf_trainer_counts}


def one(loop: str, run: Path) -> dict:
    """One count in its own process (each loop builds its own model and accelerate state)."""
    out = subprocess.run([sys.executable, __file__, "--one", loop, str(run)], check=True, capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machine", default="vm")
    p.add_argument("--one", nargs=2, metavar=("LOOP", "RUN_DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(COUNTERS[a.one[0]](Path(a.one[1]))))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="kernel-counts-") as tmp:
        for name, flags in CASES:
            for ga in (1, 2):
                run = write_run(Path(tmp), flags, ga)
                counts = {loop: one(loop, run) for loop in LOOPS}
                base = counts["trainer"]["dispatched"]
                row = {"case": name, "micro_batch": 4, "seq_len": 128, "grad_accum": ga, "counts": counts,
                       "dispatched_ratio_to_trainer": {k: v["dispatched"] / base for k, v in counts.items()}}
                rows.append(row)
                print(json.dumps(row), flush=True)
    from scaletrain.engine.fileio import atomic_write

    doc = {"benchmark": "kernel_counts", "machine": {**machine(), "name": a.machine},
           "command": "PYTHONPATH=src .venv/bin/python bench/kernel_counts.py " + " ".join(sys.argv[1:]),
           "what": "aten ops per optimizer step, one process, one thread, after 2 warm-up steps", "cases": rows}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"kernel_counts-{a.machine}.json"
    atomic_write(out, json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

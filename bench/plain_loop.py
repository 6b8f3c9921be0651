"""The reference a training loop is held against: a plain PyTorch loop, written the way the accelerate/PyTorch DDP
examples are, on exactly what a scaletrain run directory plans (model config, dtype, attention, micro batch,
accumulation, sequence length, AdamW in the plan's implementation with the trainer's parameter groups, gradient
clipping when the plan clips). Random token ids stand in for the data (the step's cost does not depend on their
values). Not part of scaletrain: bench/host_overhead.py runs it beside the bundled trainer.

    python bench/plain_loop.py RUN_DIR --steps 60 --warmup 10 --out result.json        # 1 process
    torchrun --standalone --nproc-per-node 2 bench/plain_loop.py RUN_DIR ...            # 2 processes, DDP over gloo

Writes (rank 0) {"step_seconds": [...], "tokens_per_step": N, "threads": T, "world_size": W} to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import torch
    import torch.distributed as dist

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.model import model_config_dict, random_init

    cfg = read_run_config(a.run_dir)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(cfg.train.seed)
    model = random_init(model_config_dict(cfg.model_id), cfg.attn.hf_implementation, dtype=cfg.weights_dtype)
    model.config.use_cache = False
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.train.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.train.lr, **impl[cfg.optimizer_impl])
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    vocab = int(model_config_dict(cfg.model_id)["vocab_size"])
    gen = torch.Generator().manual_seed(rank)
    model.train()
    times, cpu = [], []
    t_last, c_last = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        for m in range(cfg.grad_accum):
            ids = torch.randint(3, vocab, (cfg.micro_batch, cfg.seq_len), generator=gen)
            batch = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}
            last = m == cfg.grad_accum - 1
            ctx = model.no_sync() if world > 1 and not last else _null()
            with ctx:
                loss = model(**batch).loss / cfg.grad_accum
                loss.backward()
        if cfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        now, c = time.perf_counter(), time.process_time()
        times.append(now - t_last)
        cpu.append(c - c_last)
        t_last, c_last = now, c
    if rank == 0:
        Path(a.out).write_text(json.dumps({
            "step_seconds": times, "cpu_seconds": cpu, "tokens_per_step": cfg.micro_batch * cfg.grad_accum * cfg.seq_len * world,
            "threads": torch.get_num_threads(), "world_size": world, "loss": float(loss.detach())}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()

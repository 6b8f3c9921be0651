"""Ground truth for the library loops: one optimizer step of a real transformers.Trainer or trl.SFTTrainer, profiled.

measure/step.py builds the model (random init, LoRA, checkpointing) exactly as for the bundled trainer's loop;
here the library trains it: `Trainer` (hf-trainer) or `SFTTrainer` (trl, which patches the model with TRL's fused LM
head: per-token log-probs, entropy and top-1 hits computed in tiles, no B·S·V logits) on fixed-length random token
rows, with its own optimizer (`optim` from the plan's implementation), mixed precision (`bf16=True`: accelerate's
autocast), gradient clipping and dataloader. Optimizer step `warmup_steps` (0-based) is profiled from
TrainerCallback.on_step_begin to on_step_end (every micro-step's forward, loss and backward, clipping, the optimizer
step and zero_grad); the peak is the profiler's memory timeline (measure/memory_timeline.py) plus the live storages
it did not see (parameters, buffers, optimizer state and the batches still referenced when the window opens, as
measure.py counts them). torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import weakref
from typing import Any, Callable

from scaletrain.measure.memory_timeline import read_cpu_timeline
from scaletrain.trainer.model import NON_REENTRANT

# transformers' optimizer names for measure/step.py's implementations ("default" is the Trainer's own default)
_OPTIM = {"default": "adamw_torch_fused", "fused": "adamw_torch_fused", "for-loop": "adamw_torch",
          "foreach": "adamw_torch"}
_OPTIM_ARGS = {"for-loop": "foreach=False", "foreach": "foreach=True"}
# the byte-level tokenizer's special ids (trainer/objective_tokenizer.py): random rows avoid pad, bos and eos
_FIRST_ID = 3


class _Probe:
    """A TrainerCallback that profiles optimizer step `at` and records what is live when the window opens."""

    def __init__(self, at: int):
        from transformers import TrainerCallback

        self.at = at
        self.prof: Any = None
        self.live_before: list[Any] = []
        self.grads: list[Any] = []      # the trainable parameters' gradients at the optimizer step
        self.trainer: Any = None
        self.batches: list[Any] = []     # weak references to every batch tensor the collator made
        outer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):   # noqa: ANN001
                if state.global_step == outer.at:
                    outer.start()

            def on_pre_optimizer_step(self, args, state, control, **kw):   # noqa: ANN001
                if outer.prof is not None:
                    outer.grads = [p.grad for p in outer.trainer.model.parameters() if p.grad is not None]

            def on_step_end(self, args, state, control, **kw):     # noqa: ANN001
                if outer.prof is not None and state.global_step == outer.at + 1:
                    outer.prof.__exit__(None, None, None)

        self.callback = _CB()

    def recording(self, collate: Any) -> Any:
        def collate_and_record(features: Any) -> Any:
            batch = collate(features)
            self.batches += [weakref.ref(v) for v in batch.values() if hasattr(v, "untyped_storage")]
            return batch
        return collate_and_record

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        t = self.trainer
        tensors = list(t.model.parameters()) + list(t.model.buffers())
        for st in t.optimizer.state.values():
            tensors += [v for v in st.values() if hasattr(v, "untyped_storage")]
        tensors += [x for x in (r() for r in self.batches) if x is not None]
        self.live_before = tensors
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                            with_stack=True)
        self.prof.__enter__()


def _arguments(loop: str, tmp: str, *, micro_batch: int, grad_accum: int, steps: int, precision: str,
               optimizer_impl: str, grad_ckpt: bool, seq_len: int, seed: int) -> Any:
    common: dict[str, Any] = dict(
        output_dir=tmp, per_device_train_batch_size=micro_batch, gradient_accumulation_steps=grad_accum,
        max_steps=steps, learning_rate=1e-4, optim=_OPTIM[optimizer_impl], bf16=precision in ("bf16", "bf16-autocast"),
        gradient_checkpointing=grad_ckpt, gradient_checkpointing_kwargs=NON_REENTRANT, seed=seed, data_seed=seed,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, remove_unused_columns=False)
    if optimizer_impl in _OPTIM_ARGS:
        common["optim_args"] = _OPTIM_ARGS[optimizer_impl]
    if loop == "trl":
        from trl import SFTConfig

        return SFTConfig(**common, max_length=seq_len, packing=False)
    from transformers import TrainingArguments

    return TrainingArguments(**common)


def _trainer(loop: str, model: Any, args: Any, rows: list[list[int]], vocab: int, probe: _Probe) -> Any:
    from datasets import Dataset

    if loop == "trl":
        from trl import SFTTrainer

        from scaletrain.trainer.objective_tokenizer import byte_level_tokenizer

        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": rows}),
                             processing_class=byte_level_tokenizer(vocab), callbacks=[probe.callback])
    else:
        from transformers import Trainer, default_data_collator

        trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": rows, "labels": rows}),
                          data_collator=default_data_collator, callbacks=[probe.callback])
    trainer.data_collator = probe.recording(trainer.data_collator)
    return trainer


def measure_library_step(setup: Any, *, loop: str, micro_batch: int, seq_len: int, grad_accum: int, precision: str,
                         optimizer_impl: str, grad_ckpt: bool, warmup_steps: int, seed: int,
                         storage_bytes: Callable[[list[Any]], int]) -> dict[str, Any]:
    """Profile optimizer step `warmup_steps` + 1 of `loop` (hf-trainer | trl) training `setup.model` on the CPU; the
    fields of measure.py's MeasuredStep (`storage_bytes`: measure.py's unique_storage_bytes, tied storages once)."""
    import warnings

    import torch

    if setup.device != "cpu":
        raise ValueError(f"loop {loop!r} is measured on the CPU only (got {setup.device})")
    steps = warmup_steps + 1
    g = torch.Generator(device="cpu").manual_seed(seed)
    # one more step of rows than trained: accelerate's dataloader looks one batch ahead
    n = micro_batch * grad_accum * (steps + 1)
    rows = torch.randint(_FIRST_ID, setup.vocab_size, (n, seq_len), generator=g).tolist()
    probe = _Probe(warmup_steps)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), \
            contextlib.redirect_stdout(sys.stderr):   # the Trainer prints its log dicts on stdout
        warnings.simplefilter("ignore")
        args = _arguments(loop, tmp, micro_batch=micro_batch, grad_accum=grad_accum, steps=steps,
                          precision=precision, optimizer_impl=optimizer_impl, grad_ckpt=grad_ckpt, seq_len=seq_len,
                          seed=seed)
        trainer = _trainer(loop, setup.model, args, rows, setup.vocab_size, probe)
        probe.trainer = trainer
        trainer.train()
    reading = read_cpu_timeline(probe.prof)
    live = storage_bytes(probe.live_before)
    untracked = max(0, live - reading.preexisting_bytes)
    cats = dict(reading.peak_by_category)
    if untracked:
        cats["PREEXISTING_UNTRACKED"] = untracked
    seen: dict[int, Any] = {}
    for p in trainer.model.parameters():
        seen.setdefault(id(p), p)
    params = list(seen.values())
    trainable = [p for p in params if p.requires_grad]
    opt_tensors = [v for st in trainer.optimizer.state.values() for v in st.values() if hasattr(v, "untyped_storage")]
    return dict(
        device="cpu", peak_allocated_bytes=reading.peak_bytes + untracked, peak_reserved_bytes=None,
        param_bytes=storage_bytes(params), trainable_param_bytes=storage_bytes(trainable),
        grad_bytes=storage_bytes(probe.grads), optimizer_state_bytes=storage_bytes(opt_tensors),
        params=sum(p.numel() for p in params), trainable_params=sum(p.numel() for p in trainable),
        peak_by_category=cats)

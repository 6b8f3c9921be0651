"""Ground truth for the objectives' memory terms: profile one real TRL step on the CPU.

`measure_objective_step` builds the trainer exactly as a run does (build.py), on synthetic data of exact lengths
(prompt_len + completion_len tokens per sequence; GRPO's completions forced to full length), trains
`warmup_steps` optimizer steps (optimizer state exists, as in steady state), then profiles the next step from
TrainerCallback.on_step_begin to on_step_end: GRPO's generation and reference log-probs, every micro-step's
forward, TRL's log-prob kernel and backward, clipping, the optimizer step and zero_grad. The peak is read from
torch.profiler's memory timeline (measure/memory_timeline.py) plus the live storages it did not see, as
measure/step.py does for supervised steps.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from scaletrain.measure.memory_timeline import read_cpu_timeline
from scaletrain.measure.step import unique_storage_bytes
from scaletrain.trainer.objective_build import ObjectiveRun, build_trainer

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class MeasuredObjectiveStep:
    peak_allocated_bytes: int
    params: int                       # unique parameters of the policy (reference excluded)
    trainable_params: int
    param_bytes: int                  # the policy's parameter storages
    reference_bytes: int              # a separate reference model's storages (0 without one)
    optimizer_state_bytes: int
    peak_by_category: dict[str, int] = field(default_factory=dict)


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(n))


def synthetic_dataset(run: ObjectiveRun, rows: int) -> Any:
    """Rows whose tokenized lengths are exactly the plan's: one byte-level token per character, TRL adds the EOS
    to completions (reward, DPO); GRPO prompts are prompt_len tokens."""
    from datasets import Dataset

    rng = random.Random(run.seed)
    P = run.prompt_len or 0
    C = run.completion
    if run.objective in ("reward", "dpo"):
        data = [{"prompt": _text(rng, P), "chosen": _text(rng, C - 1), "rejected": _text(rng, C - 1)}
                for _ in range(rows)]
    else:
        data = [{"prompt": _text(rng, P)} for _ in range(rows)]
    return Dataset.from_list(data)


def letter_reward(completions: list[str], **_: Any) -> list[float]:
    """Distinct letters in a completion: a cheap, deterministic reward with spread between completions."""
    return [float(len(set(c))) for c in completions]


class _ProfileStep:
    """A TrainerCallback that profiles optimizer step `at` (0-based) from on_step_begin to on_step_end."""

    def __init__(self, at: int):
        from transformers import TrainerCallback

        self.at = at
        self.prof: Any = None
        self.live_before = 0
        self.trainer: Any = None
        outer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):   # noqa: ANN001
                if state.global_step == outer.at:
                    outer.start()

            def on_step_end(self, args, state, control, **kw):     # noqa: ANN001
                if outer.prof is not None and state.global_step == outer.at + 1:
                    outer.prof.__exit__(None, None, None)

        self.callback = _CB()

    def live_tensors(self) -> list[Any]:
        t = self.trainer
        tensors = list(t.model.parameters()) + list(t.model.buffers())
        ref = getattr(t, "ref_model", None)
        if ref is not None:
            tensors += list(ref.parameters()) + list(ref.buffers())
        for st in t.optimizer.state.values():
            tensors += [v for v in st.values() if hasattr(v, "untyped_storage")]
        return tensors

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.live_before = unique_storage_bytes(self.live_tensors())
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                            with_stack=True)
        self.prof.__enter__()


def measure_objective_step(run: ObjectiveRun, warmup_steps: int = 1) -> MeasuredObjectiveStep:
    """Profile optimizer step `warmup_steps` + 1 of `run` on the CPU (one process)."""
    import warnings

    from scaletrain.trainer.objective_tokenizer import byte_level_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        run = replace(run, output_dir=tmp, max_steps=warmup_steps + 1, use_cpu=True, fixed_length=True)
        rows = run.micro_batch * run.grad_accum * (warmup_steps + 1) * 2
        tok = byte_level_tokenizer(int(run.model_config["vocab_size"]))
        probe = _ProfileStep(warmup_steps)
        # the Trainer prints its log dicts on stdout; a measurement's caller (`validate --json`) owns stdout
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            trainer = build_trainer(run, synthetic_dataset(run, rows), tok,
                                    reward_funcs=letter_reward if run.objective == "grpo" else None,
                                    callbacks=[probe.callback])
            probe.trainer = trainer
            trainer.train()
        reading = read_cpu_timeline(probe.prof)
        untracked = max(0, probe.live_before - reading.preexisting_bytes)
        model = trainer.model
        params = {id(p): p for p in model.parameters()}.values()
        ref = getattr(trainer, "ref_model", None)
        opt_tensors = [v for st in trainer.optimizer.state.values() for v in st.values()
                       if hasattr(v, "untyped_storage")]
        cats = dict(reading.peak_by_category)
        if untracked:
            cats["PREEXISTING_UNTRACKED"] = untracked
        return MeasuredObjectiveStep(
            peak_allocated_bytes=reading.peak_bytes + untracked,
            params=sum(p.numel() for p in params),
            trainable_params=sum(p.numel() for p in params if p.requires_grad),
            param_bytes=unique_storage_bytes(list(params)),
            reference_bytes=unique_storage_bytes(list(ref.parameters())) if ref is not None else 0,
            optimizer_state_bytes=unique_storage_bytes(opt_tensors), peak_by_category=cats)

"""CPU ground truth for the memory model: predicted allocated peak vs torch.profiler's measured peak.

For each case: build the HF model from its config (random init), run a warm-up optimizer step, profile one
fp32 AdamW step (measure/step.py), and compare with the engine's `total - overhead` for the same setup.
Model-state bytes are compared exactly. Writes bench/results/cpu_groundtruth.json and prints a Markdown table
(docs/accuracy.md's table comes from this script):

    .venv/bin/python bench/cpu_groundtruth.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from groundtruth_cli import predicted_vs_measured, run_groundtruth
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, catalog_entry
from scaletrain.engine.estimate.setup import TrainingSetup


@dataclass(frozen=True)
class Case:
    model: str
    attn: str = "sdpa"
    method: str = "full"
    grad_ckpt: bool = False
    micro_batch: int = 2
    seq_len: int = 256
    grad_accum: int = 1
    lora_rank: int = 8
    precision: str = "fp32"      # "bf16": 16-bit compute, as the weights below decide
    master_weights: str = "fp32"  # full fine-tuning under bf16: fp32 weights + torch.autocast, or bf16 weights only
    base_bits: int = 16          # LoRA under bf16: a bf16 base (the trainer's, autocast on) or 32 (an fp32 base)
    optimizer_impl: str = "for-loop"   # torch's CPU default; "fused" is what the trainer and HF Trainer run
    overrides: tuple[tuple[str, int], ...] = ()   # config fields changed from the catalog entry
    experts_impl: str = "grouped_mm"   # MoE models: transformers' experts_implementation
    lora_targets: tuple[str, ...] | None = None   # None: the model's own (BLOCK_LINEARS, a traced model's linears);
                                                  # `experts`: the fused experts through peft's target_parameters
    loop: str = "trainer"        # the loop that runs the step (measure/step.py LOOPS) and that the plan is for
    loss: str = "standard"             # "chunked": --loss chunked (trainer/chunked_loss.py)
    strategy: str = "ddp"              # "fsdp": fully_shard on 2 gloo ranks (measure/fsdp_step.py), per-rank peaks
    ranks: int = 1

    @property
    def measure_precision(self) -> str:
        """measure/step.py's name for the regime: which weights, and whether autocast runs."""
        if self.precision == "fp32":
            return "fp32"
        if self.method == "full" or self.master_weights == "bf16":   # LoRA: a bf16 base without autocast
            return "bf16-pure" if self.master_weights == "bf16" else "bf16"
        if self.method == "qlora":
            return "bf16"             # NF4 base + fp32 rest under autocast, as the trainer runs it
        return "bf16" if self.base_bits == 32 else "bf16-autocast"

    @property
    def label(self) -> str:
        m = self.model.split("/")[-1]
        prec = self.precision
        if prec == "bf16":
            prec = {"bf16": "bf16 autocast", "bf16-pure": "bf16 weights", "bf16-autocast": "bf16 base"}[
                self.measure_precision] + (" (fp32 base)" if self.base_bits == 32 else "")
            if self.method == "lora" and self.master_weights == "bf16":
                prec = "bf16 base, no autocast"
            prec = prec.replace("bf16 autocast (fp32 base)", "bf16 autocast, fp32 base")
            if self.method == "qlora":
                prec = "bf16 autocast, NF4 base"
        bits = [m, self.method, prec, self.attn, "ckpt" if self.grad_ckpt else "no-ckpt",
                f"b{self.micro_batch}×s{self.seq_len}"]
        if self.optimizer_impl != "for-loop":
            bits.append(f"{self.optimizer_impl} AdamW")
        if self.grad_accum > 1:
            bits.append(f"ga{self.grad_accum}")
        if self.overrides:
            bits.append("(" + ",".join(f"{k.split('_')[0]}={v}" for k, v in self.overrides) + ")")
        if _is_moe(self.model):
            bits.append(f"experts={self.experts_impl}")
        if self.method != "full" and self.lora_targets not in (None, BLOCK_LINEARS):
            bits.append("targets=" + ",".join(t.removesuffix("_proj") for t in self.lora_targets))
        if self.loop != "trainer":
            bits.append(f"loop={self.loop}")
        if self.loss != "standard":
            bits.append(f"loss={self.loss}")
        if self.strategy != "ddp":
            bits.append(f"{self.strategy}×{self.ranks}")
        return " ".join(bits)


def _is_moe(model: str) -> bool:
    from scaletrain.engine.catalog.moe import MOE_TYPES
    return catalog_entry(model)["config"]["model_type"] in MOE_TYPES


CASES = [
    Case("scaletrain/tiny-llama"),
    Case("scaletrain/tiny-llama", attn="eager"),
    Case("scaletrain/tiny-qwen2", attn="eager", grad_ckpt=True),
    Case("scaletrain/tiny-qwen2", method="lora"),
    Case("scaletrain/tiny-qwen3", grad_ckpt=True),
    Case("scaletrain/tiny-qwen3", method="lora", attn="eager"),
    Case("scaletrain/tiny-gemma3"),
    Case("scaletrain/tiny-gemma3", method="lora", grad_ckpt=True),
    Case("scaletrain/tiny-mistral", attn="eager", micro_batch=4),
    Case("scaletrain/tiny-olmo2"),
    Case("scaletrain/tiny-olmo2", method="lora", attn="eager", grad_ckpt=True),
    Case("scaletrain/tiny-llama", grad_accum=2),
    # activation-dominated: wider blocks and longer sequences than vocabulary
    Case("scaletrain/tiny-llama", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-qwen3", attn="eager", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-gemma3", grad_ckpt=True, seq_len=512, micro_batch=2,
         overrides=(("hidden_size", 256), ("intermediate_size", 1024), ("num_hidden_layers", 4))),
    # mixed precision (CPU autocast stands in for CUDA autocast: same saved-tensor structure for linears)
    Case("scaletrain/tiny-llama", precision="bf16", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-qwen2", precision="bf16", attn="eager"),
    Case("scaletrain/tiny-gemma3", precision="bf16", grad_ckpt=True, seq_len=512,
         overrides=(("hidden_size", 256), ("intermediate_size", 1024), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-olmo2", precision="bf16"),
    # bf16 weights with no fp32 master (--master-weights bf16), and plain HF loops with fused AdamW
    Case("scaletrain/tiny-qwen2", precision="bf16", master_weights="bf16", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-llama", precision="bf16", master_weights="bf16", grad_ckpt=True, optimizer_impl="fused"),
    Case("scaletrain/tiny-gemma3", precision="bf16", master_weights="bf16", attn="eager"),
    Case("scaletrain/tiny-olmo2", precision="bf16", master_weights="bf16", optimizer_impl="fused"),
    Case("scaletrain/tiny-qwen3", precision="bf16", optimizer_impl="fused", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-qwen2", precision="bf16", optimizer_impl="fused", micro_batch=1, seq_len=16),
    Case("scaletrain/tiny-qwen2", precision="bf16", master_weights="bf16", optimizer_impl="fused", micro_batch=1,
         seq_len=16),
    Case("scaletrain/tiny-llama", optimizer_impl="foreach", micro_batch=1, seq_len=16),
    # LoRA as the trainer runs it: a bf16 base under autocast, or an fp32 base under autocast
    Case("scaletrain/tiny-qwen3", method="lora", precision="bf16", optimizer_impl="fused", seq_len=512,
         micro_batch=1, overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-gemma3", method="lora", precision="bf16", grad_ckpt=True, optimizer_impl="fused"),
    Case("scaletrain/tiny-llama", method="lora", precision="bf16", base_bits=32, attn="eager"),
    Case("scaletrain/tiny-olmo2", method="lora", precision="bf16", base_bits=32, grad_ckpt=True),
    # QLoRA: NF4 base (bitsandbytes runs 4-bit layers on the CPU since 0.45), the rest upcast to fp32
    Case("scaletrain/tiny-qwen2", method="qlora", precision="bf16", seq_len=128),
    Case("scaletrain/tiny-qwen3", method="qlora", precision="bf16", grad_ckpt=True, optimizer_impl="fused"),
    # LoRA on a bf16 base with checkpointing, activation-dominated: the peak is the last block's recompute at
    # down_proj (PEFT's fp32 copy of the B·S·I input), with the gradient of the block's output waiting
    Case("scaletrain/tiny-llama", method="lora", precision="bf16", grad_ckpt=True, seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-qwen3", method="lora", precision="bf16", grad_ckpt=True, seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-llama", method="lora", precision="bf16", base_bits=32, grad_ckpt=True, seq_len=512,
         micro_batch=1, overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
]
# MoE (transformers 5.24's fused experts): activation-dominated shapes, every family, full and LoRA, checkpointing
# on and off, grouped_mm (the default) and eager experts; gpt_oss has no sdpa path, so it runs eager attention
_MOE4 = (("num_hidden_layers", 4),)
MOE_CASES = [
    Case("scaletrain/tiny-qwen3-moe", seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-qwen3-moe", method="lora", grad_ckpt=True, experts_impl="eager", overrides=_MOE4),
    Case("scaletrain/tiny-qwen3-moe", precision="bf16", seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-qwen2-moe", attn="eager", experts_impl="eager", overrides=_MOE4),
    Case("scaletrain/tiny-qwen2-moe", method="lora", seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-mixtral", grad_ckpt=True, seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-mixtral", method="lora", experts_impl="eager", overrides=_MOE4),
    Case("scaletrain/tiny-mixtral", precision="bf16", master_weights="bf16", optimizer_impl="fused", overrides=_MOE4),
    Case("scaletrain/tiny-olmoe", experts_impl="eager", seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-olmoe", method="lora", grad_ckpt=True, overrides=_MOE4),
    Case("scaletrain/tiny-olmoe", method="lora", precision="bf16", optimizer_impl="fused", overrides=_MOE4),
    Case("scaletrain/tiny-gpt-oss", attn="eager", overrides=_MOE4),
    Case("scaletrain/tiny-gpt-oss", attn="eager", method="lora", grad_ckpt=True, experts_impl="eager",
         overrides=_MOE4),
    Case("scaletrain/tiny-gpt-oss", attn="eager", precision="bf16", grad_ckpt=True, overrides=_MOE4),
    Case("scaletrain/tiny-qwen2-moe", precision="bf16", grad_ckpt=True, experts_impl="eager", seq_len=512,
         micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-mixtral", method="lora", precision="bf16", base_bits=32, overrides=_MOE4),
    Case("scaletrain/tiny-qwen3-moe", method="qlora", precision="bf16", overrides=_MOE4),
    # every family in full and LoRA with checkpointing on and off (the combinations the rows above leave out)
    Case("scaletrain/tiny-qwen3-moe", grad_ckpt=True, overrides=_MOE4),
    Case("scaletrain/tiny-qwen3-moe", method="lora", seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-mixtral", method="lora", grad_ckpt=True, overrides=_MOE4),
    Case("scaletrain/tiny-olmoe", grad_ckpt=True, seq_len=512, micro_batch=1, overrides=_MOE4),
    Case("scaletrain/tiny-qwen2-moe", grad_ckpt=True, overrides=_MOE4),
    # LoRA on the fused experts through peft's target_parameters (the target `experts`)
    Case("scaletrain/tiny-gpt-oss", attn="eager", method="lora", overrides=_MOE4,
         lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "experts")),
    Case("scaletrain/tiny-qwen2-moe", method="lora", grad_ckpt=True, seq_len=512, micro_batch=1, overrides=_MOE4,
         lora_targets=BLOCK_LINEARS + ("experts",)),
    Case("scaletrain/tiny-gpt-oss", attn="eager", method="lora", precision="bf16", experts_impl="eager",
         optimizer_impl="fused", overrides=_MOE4, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "experts")),
    # issue 28: many tokens per expert at a hidden size twice the expert width (the routing multiply's k·h gradients
    # outgrow the gate/up ones): full, checkpointing, LoRA on the attention projections only
    *[Case("scaletrain/tiny-qwen3-moe", seq_len=1024, micro_batch=2, optimizer_impl="fused", overrides=(
        ("hidden_size", 512), ("num_experts", 32), ("num_experts_per_tok", 8), ("moe_intermediate_size", 256)), **kw)
      for kw in ({}, {"grad_ckpt": True},
                 {"method": "lora", "lora_targets": ("q_proj", "k_proj", "v_proj", "o_proj")})],
    # issue 28: experts far wider than the tokens each sees (32 experts, 64 tokens), LoRA on the fused experts with
    # checkpointing: peft's gradients of the merged weights W + ΔW (E·h·i at down's backward, E·h·2i at gate_up's)
    # outgrow every per-token term; the experts' backward without them was 3.4-3.7 % under
    Case("scaletrain/tiny-olmoe", method="lora", grad_ckpt=True, micro_batch=1, seq_len=64,
         overrides=_MOE4 + (("hidden_size", 128), ("num_experts", 32), ("intermediate_size", 256))),
    Case("scaletrain/tiny-qwen3-moe", method="lora", grad_ckpt=True, micro_batch=1, seq_len=64,
         overrides=_MOE4 + (("hidden_size", 128), ("num_experts", 32), ("moe_intermediate_size", 256))),
    Case("scaletrain/tiny-mixtral", method="lora", grad_ckpt=True, micro_batch=1, seq_len=64,
         overrides=_MOE4 + (("hidden_size", 128), ("num_local_experts", 32), ("intermediate_size", 256))),
    # the same for the other experts implementations: eager's per-expert loop accumulates the merged weights'
    # gradients expert by expert (-18 % without them), batched_mm writes each pair's gathered weight's gradient
    # (-11 %; full fine-tuning -7.5 %)
    *[Case("scaletrain/tiny-olmoe", grad_ckpt=True, micro_batch=1, seq_len=64, experts_impl=impl, method=method,
           overrides=_MOE4 + (("hidden_size", 128), ("num_experts", 32), ("intermediate_size", 256)))
      for impl, method in (("eager", "lora"), ("batched_mm", "lora"), ("batched_mm", "full"))],
    # gpt_oss's eager attention with sinks at 512 tokens (the scores outgrow the rest): the seeds' LoRA on a bf16
    # base with checkpointing (the max's backward: a 16-bit scatter_ on the CPU makes an fp32 buffer; 6.4 % under
    # without it), and full fine-tuning under autocast with and without checkpointing (the forward and the
    # recompute at the probabilities' cast: 6.5 % over as a bound, the forward 0.3 % under)
    Case("scaletrain/tiny-gpt-oss", attn="eager", method="lora", precision="bf16", grad_ckpt=True, seq_len=512,
         micro_batch=1, overrides=_MOE4),
    *[Case("scaletrain/tiny-gpt-oss", attn="eager", precision="bf16", grad_ckpt=ck, seq_len=512, micro_batch=1,
           overrides=_MOE4) for ck in (True, False)],
    # batched_mm under autocast over fp32 expert weights: both weights gathered per token-expert pair in fp32 beside
    # gate_up's 16-bit cast (42 % and 19 % under without them)
    Case("scaletrain/tiny-qwen3-moe", precision="bf16", grad_ckpt=True, experts_impl="batched_mm", overrides=_MOE4),
    *[Case("scaletrain/tiny-gpt-oss", attn="eager", precision="bf16", grad_ckpt=ck, experts_impl="batched_mm",
           overrides=_MOE4) for ck in (True, False)],
]
# traced families (no analytic layout: engine/catalog/traced.py measures a 2-layer slice once, then plans from it)
TRACED = [Case(f"scaletrain/tiny-{fam}", method=method, grad_ckpt=ckpt)
          for fam in ("phi3", "granite", "glm4") for method in ("full", "lora") for ckpt in (False, True)]
TRACED += [   # activation-dominated: eager attention, bf16 autocast, LoRA on a bf16 base
    Case("scaletrain/tiny-phi3", method="lora", attn="eager", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-granite", precision="bf16", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-glm4", method="lora", precision="bf16", grad_ckpt=True, seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    # a sliding window shorter than the sequence (traced as one shorter than the slice's sequences)
    Case("scaletrain/tiny-phi3", overrides=(("sliding_window", 64),)),
    Case("scaletrain/tiny-phi3", method="lora", grad_ckpt=True, overrides=(("sliding_window", 64),)),
]
# the loop the user runs (issue 21): accelerate's examples keep the output object (its logits) alive through backward
# and the optimizer step; transformers' Trainer and TRL's SFTTrainer (its fused LM head) run for real; LoRA on a bf16
# base without autocast (--master-weights bf16), where PEFT's fp32 casts of each adapted input are saved
LOOP_CASES = [
    Case("scaletrain/tiny-llama", loop="accelerate-loop"),
    Case("scaletrain/tiny-qwen3", loop="accelerate-loop", grad_ckpt=True),
    Case("scaletrain/tiny-qwen2", loop="accelerate-loop", precision="bf16", optimizer_impl="fused"),
    Case("scaletrain/tiny-gemma3", loop="accelerate-loop", precision="bf16", grad_ckpt=True),
    Case("scaletrain/tiny-llama", loop="accelerate-loop", precision="bf16", master_weights="bf16",
         optimizer_impl="fused"),
    Case("scaletrain/tiny-qwen2", loop="accelerate-loop", method="lora", precision="bf16", seq_len=512,
         micro_batch=1, overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-llama", loop="hf-trainer", optimizer_impl="fused"),
    Case("scaletrain/tiny-olmo2", loop="hf-trainer", precision="bf16", grad_ckpt=True, optimizer_impl="fused"),
    Case("scaletrain/tiny-qwen2", loop="hf-trainer", method="lora", precision="bf16", optimizer_impl="fused"),
    Case("scaletrain/tiny-llama", loop="trl", optimizer_impl="fused"),
    Case("scaletrain/tiny-qwen3", loop="trl", precision="bf16", grad_ckpt=True, optimizer_impl="fused"),
    Case("scaletrain/tiny-gemma3", loop="trl", method="lora", precision="bf16", optimizer_impl="fused"),
    Case("scaletrain/tiny-llama", method="lora", precision="bf16", master_weights="bf16", optimizer_impl="fused",
         seq_len=512, micro_batch=1, overrides=(("hidden_size", 256), ("intermediate_size", 768),
                                                 ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-qwen3", method="lora", precision="bf16", master_weights="bf16", grad_ckpt=True,
         optimizer_impl="fused", seq_len=512, micro_batch=1,
         overrides=(("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))),
    Case("scaletrain/tiny-gemma3", method="lora", precision="bf16", master_weights="bf16", optimizer_impl="fused"),
    Case("scaletrain/tiny-qwen2", loop="accelerate-loop", method="lora", precision="bf16", master_weights="bf16",
         optimizer_impl="fused"),
]
# --loss chunked (issue 21): the vocabulary-dominated tiny models, full fp32, full bf16 autocast, bf16 weights, LoRA
# (fp32, bf16 base, fp32 base under autocast), with and without checkpointing, tied and untied embeddings
_WIDE = (("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4))
CHUNKED_CASES = [
    Case("scaletrain/tiny-llama", loss="chunked"),
    Case("scaletrain/tiny-qwen2", method="lora", loss="chunked"),
    Case("scaletrain/tiny-qwen3", grad_ckpt=True, loss="chunked"),
    Case("scaletrain/tiny-llama", precision="bf16", seq_len=512, micro_batch=1, overrides=_WIDE, loss="chunked"),
    Case("scaletrain/tiny-qwen2", precision="bf16", attn="eager", loss="chunked"),
    Case("scaletrain/tiny-olmo2", precision="bf16", master_weights="bf16", optimizer_impl="fused", loss="chunked"),
    Case("scaletrain/tiny-gemma3", method="lora", precision="bf16", grad_ckpt=True, optimizer_impl="fused",
         loss="chunked"),
    Case("scaletrain/tiny-llama", method="lora", precision="bf16", base_bits=32, attn="eager", loss="chunked"),
    Case("scaletrain/tiny-qwen3", method="lora", grad_ckpt=True, micro_batch=4, loss="chunked"),
]
# issue 28: every loop kind under mixed precision (fp32 weights + bf16 autocast), checkpointing on and off, at a
# vocabulary where the logits are most of the peak (32k × 64 hidden: B·S·V is ~90 % of it) -- what each loop keeps of
# the logits, in which dtype, decides the plan here
_BIG_VOCAB = (("vocab_size", 32768),)
AMP_LOOP_CASES = [Case("scaletrain/tiny-qwen2", loop=loop, precision="bf16", grad_ckpt=ckpt, optimizer_impl="fused",
                       overrides=_BIG_VOCAB)
                  for loop in ("trainer", "accelerate-loop", "hf-trainer", "trl") for ckpt in (False, True)]
# issue 29: FSDP2 as the trainer applies it (fully_shard per decoder block, then the root) on 2 gloo ranks, each
# rank's peak against the per-GPU plan for --strategy fsdp on 2 GPUs: vocabulary- and activation-dominated, full
# and LoRA, checkpointing on and off, a dense model and an MoE
_FSDP = {"strategy": "fsdp", "ranks": 2}
FSDP_CASES = [
    Case("scaletrain/tiny-llama", **_FSDP),
    Case("scaletrain/tiny-llama", grad_ckpt=True, **_FSDP),
    Case("scaletrain/tiny-llama", method="lora", **_FSDP),
    Case("scaletrain/tiny-llama", method="lora", grad_ckpt=True, **_FSDP),
    Case("scaletrain/tiny-llama", seq_len=512, micro_batch=1, overrides=_WIDE, **_FSDP),
    Case("scaletrain/tiny-llama", grad_ckpt=True, seq_len=512, micro_batch=1, overrides=_WIDE, **_FSDP),
    Case("scaletrain/tiny-llama", method="lora", seq_len=512, micro_batch=1, overrides=_WIDE, **_FSDP),
    Case("scaletrain/tiny-qwen3-moe", seq_len=512, micro_batch=1, overrides=_MOE4, **_FSDP),
    Case("scaletrain/tiny-qwen3-moe", method="lora", grad_ckpt=True, overrides=_MOE4, **_FSDP),
    Case("scaletrain/tiny-qwen3-moe", grad_ckpt=True, seq_len=512, micro_batch=1, overrides=_MOE4, **_FSDP),
]
# CI's FSDP rows (tests/trainer/test_memory_groundtruth.py), small enough for a loaded CI machine: full fine-tuning, and LoRA
# with checkpointing
FSDP_QUICK = [FSDP_CASES[i] for i in (0, 3)]
# sliding windows under sdpa: transformers' boolean mask from a sequence as long as the window on (mistral's 512 at
# 512 tokens), converted to the q dtype and kept by every windowed layer's sdpa; checkpointed, the boolean mask is a
# block input (13 %, 5.8 % and 3.2 % under while one mask was counted, and none at a sequence equal to the window)
WINDOW_CASES = [
    Case("scaletrain/tiny-mistral", seq_len=512, micro_batch=1),
    Case("scaletrain/tiny-mistral", seq_len=512, micro_batch=1, overrides=(("sliding_window", 256),)),
    Case("scaletrain/tiny-mistral", method="lora", precision="bf16", seq_len=512, micro_batch=1),
    Case("scaletrain/tiny-gemma3", method="lora", grad_ckpt=True, seq_len=512, micro_batch=1,
         overrides=(("sliding_window", 128),)),
]
CASES += MOE_CASES + TRACED + LOOP_CASES + CHUNKED_CASES + AMP_LOOP_CASES + FSDP_CASES + WINDOW_CASES
QUICK = [CASES[i] for i in (0, 2, 3, 4, 6, 9, 10, 13, 15, 17, 19, 23, 25, 26, 29, 31, 33)] + [
    MOE_CASES[i] for i in (0, 1, 6, 11, 29, 34, 37)] + [LOOP_CASES[i] for i in (3, 6, 9, 14)] + [
    CHUNKED_CASES[i] for i in (0, 1)] + [WINDOW_CASES[0]]
# CI's subset of AMP_LOOP_CASES (tests/trainer/test_memory_groundtruth.py): every loop kind, checkpointing on and off
AMP_LOOP_QUICK = [AMP_LOOP_CASES[i] for i in (1, 2, 3, 4, 7)]


def config_for(case: Case) -> dict:
    cfg = dict(catalog_entry(case.model)["config"])
    cfg.update(dict(case.overrides))
    if _is_moe(case.model):
        cfg["experts_implementation"] = case.experts_impl
    if "layer_types" in cfg and len(cfg["layer_types"]) != cfg["num_hidden_layers"]:  # Gemma 3 pattern
        pattern = list(cfg["layer_types"])
        cfg["layer_types"] = [pattern[i % len(pattern)] for i in range(cfg["num_hidden_layers"])]
    return cfg


def setup_for(case: Case) -> TrainingSetup:
    from scaletrain.engine.catalog.architectures import arch_from_config
    model = arch_from_config(config_for(case), case.model)
    return TrainingSetup(
        model=model, hardware=parse_gpus(f"{case.ranks}xCPU"), method=case.method,
        lora_rank=case.lora_rank, lora_targets=case.lora_targets or model.default_lora_targets,
        strategy=case.strategy, precision=case.precision,
        master_weights=case.master_weights, base_bits=case.base_bits, optimizer_impl=case.optimizer_impl,
        attn=case.attn, grad_ckpt=case.grad_ckpt, micro_batch=case.micro_batch, grad_accum=case.grad_accum,
        seq_len=case.seq_len, device="cpu", experts_impl=case.experts_impl, loop=case.loop, loss=case.loss,
    )


def run_cases(cases: list[Case]) -> list[dict]:
    """Every case's row, in order; the FSDP cases share one 2-rank process group (measure/fsdp_step.py)."""
    from scaletrain.measure.fsdp_step import measure_fsdp_steps

    fsdp = [c for c in cases if c.strategy == "fsdp"]
    ranks = measure_fsdp_steps([(config_for(c), _fsdp_kwargs(c)) for c in fsdp]) if fsdp else []
    by_case = dict(zip(fsdp, ranks))
    return [_row(c, by_case[c]) if c in by_case else run_case(c) for c in cases]


def _fsdp_kwargs(case: Case) -> dict:
    if case.precision != "fp32" or case.loop != "trainer" or case.loss != "standard" or case.grad_accum != 1:
        raise ValueError(f"{case.label}: the FSDP rows measure fp32 trainer steps")
    return dict(method=case.method, lora_rank=case.lora_rank, lora_alpha=2 * case.lora_rank,
                lora_targets=setup_for(case).lora_targets, micro_batch=case.micro_batch, seq_len=case.seq_len,
                grad_ckpt=case.grad_ckpt, attn=case.attn, optimizer_impl=case.optimizer_impl, grad_accum=1, seed=0,
                warmup_steps=1)


def _row(case: Case, ranks: list) -> dict:
    """The FSDP row: the per-GPU plan against the largest rank's peak (every rank's peak recorded)."""
    s = setup_for(case)
    worst = max(ranks, key=lambda m: m.peak_allocated_bytes)
    return {**_row_head(case), "ranks_peak_bytes": [m.peak_allocated_bytes for m in ranks],
            **predicted_vs_measured(s, estimate_memory(s), worst)}


def _row_head(case: Case) -> dict:
    return {
        "case": case.label, "model": case.model, "method": case.method, "attn": case.attn,
        "precision": case.precision, "measure_precision": case.measure_precision,
        "optimizer_impl": case.optimizer_impl,
        "grad_ckpt": case.grad_ckpt, "micro_batch": case.micro_batch, "seq_len": case.seq_len,
        "grad_accum": case.grad_accum, "loop": case.loop, "strategy": case.strategy, "ranks": case.ranks,
    }


def run_case(case: Case) -> dict:
    from scaletrain.measure.step import measure_step

    if case.strategy == "fsdp":
        return run_cases([case])[0]
    s = setup_for(case)
    mem = estimate_memory(s)
    measured = measure_step(
        config_for(case), method=case.method, lora_rank=case.lora_rank,
        lora_alpha=2 * case.lora_rank, lora_targets=s.lora_targets, micro_batch=case.micro_batch,
        seq_len=case.seq_len, grad_ckpt=case.grad_ckpt, attn=case.attn, precision=case.measure_precision,
        optimizer="adamw", grad_accum=case.grad_accum, device="cpu", optimizer_impl=case.optimizer_impl,
        loop=case.loop, loss=case.loss)
    return {**_row_head(case), **predicted_vs_measured(s, mem, measured)}


def markdown(rows: list[dict]) -> str:
    from readme_tables import groundtruth_table
    return groundtruth_table(rows)


def main(argv: list[str] | None = None) -> int:
    return run_groundtruth(argv, cases=CASES, quick=QUICK, run_case=run_case, run_cases=run_cases, markdown=markdown,
                           out_name="cpu_groundtruth.json", command="python bench/cpu_groundtruth.py")


if __name__ == "__main__":
    sys.exit(main())

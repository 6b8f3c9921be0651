"""One declaration per plan field: its flag, argparse group, kind and parser, help, bounds, and the words the
wizard and the `--plain` prompts use. Every front end derives its part from FIELDS: the CLI's flags
(`tui/cli/plan_args.py`), which flags are PlanRequest fields (`args.py`), the whole-number bounds (`checks.py`),
the wizard's labels, hints and initial values (`tui/wizard/screen_batch.py`) and the plain prompts
(`tui/wizard/plain.py`).

Adding a plan field: its words in `engine/vocabulary.py` (when it is a choice), one PlanField here, the
PlanRequest field (`request.py`), and what it changes in the setup and the models (`engine/model/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from scaletrain.engine.catalog.hardware import inter_node_gbit_s
from scaletrain.engine.vocabulary import (Attention, ExpertsImpl, Generation, Loop, LossImpl, MasterWeights, Method,
                                          Objective, Offload, Optimizer, OptimizerImpl, Precision, RefModel, Strategy)

RESIDENT_BITS = ("16", "8", "4")


def parse_csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


DATA_COLUMN_NAMES = ("text", "prompt", "completion", "messages")


def parse_columns(text: str) -> dict[str, str]:
    """--data-columns prompt=question,completion=answer: TRL's column name = the data's."""
    out = {}
    for item in parse_csv(text):
        ours, eq, theirs = item.partition("=")
        if not eq or ours.strip() not in DATA_COLUMN_NAMES or not theirs.strip():
            raise ValueError(f"{item!r}: give NAME=COLUMN with NAME one of {', '.join(DATA_COLUMN_NAMES)}")
        out[ours.strip()] = theirs.strip()
    if not out:
        raise ValueError("no NAME=COLUMN pair")
    return out


def parse_resident(text: str) -> tuple[str, int]:
    """--resident MODEL[:BITS] (bits 16, 8 or 4; default 16)."""
    model, _, bits = text.rpartition(":") if text.rsplit(":", 1)[-1] in RESIDENT_BITS else (text, "", "16")
    return (model, int(bits))


@dataclass(frozen=True)
class PlanField:
    """One knob the user sets. `owner` says where its value lives: a PlanRequest field of the same name
    ("request"), a TrainOptions field `attr` ("train": --weights, --data, resolved by args.py), or only the
    parsed arguments ("args": --resident, a PlanRequest's `residents` through args.py). `parse` is the flag's argparse type (None: text); `kind` "flag" is --X/--no-X, "append"
    a repeatable flag."""

    name: str
    group: str | None                      # argparse group; None: no flag of its own
    owner: str = "request"
    parse: Callable[[str], Any] | None = None
    kind: str = "value"                    # value | flag | append
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    help: str | None = None
    bounds: tuple[int, int] | None = None  # whole numbers: (smallest, largest) accepted
    label: str | None = None               # the wizard's label (and the word its parse errors use)
    hint: str | None = None                # the wizard's hint under the label
    prompt: str | None = None              # the --plain question
    optional: bool = False                 # the wizard's field may stay empty
    attr: str | None = None                # the TrainOptions field ("train" owner) when the name differs
    form: str | None = None                # the wizard's field id when it differs from the name

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def form_name(self) -> str:
        return self.form or self.name

    def value_in(self, request: Any, train: Any) -> Any:
        """The field's current value in a PlanRequest / TrainOptions pair (None for an args-only field)."""
        if self.owner == "request":
            return getattr(request, self.name)
        if self.owner == "train":
            return getattr(train, self.attr or self.name)
        return None


_WHAT, _OBJ, _HW, _HOW, _BATCH = ("what to train", "objective (TRL: reward, dpo, grpo)", "hardware", "how",
                                  "batch and data")

FIELDS: tuple[PlanField, ...] = (
    PlanField("model", _WHAT, help="catalog id (scaletrain models), config.json path or folder, or HF cache id",
              label="model", hint="catalog id, config.json path or folder, or a local HF cache id",
              prompt="Model (catalog id, config.json path, or HF cache id)"),
    PlanField("method", _WHAT, choices=Method.values(), prompt="Method"),
    PlanField("lora_rank", _WHAT, parse=int, bounds=(1, 1 << 16), label="LoRA rank",
              hint="adapter rank r (e.g. 8, 16, 64)", prompt="LoRA rank"),
    PlanField("lora_targets", _WHAT, parse=parse_csv, help="comma list, default all block linears; "
              "experts: an MoE's fused experts (peft target_parameters)",
              label="LoRA targets", hint="comma list: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
              prompt="LoRA targets (comma list, 'all' = every block linear)"),
    PlanField("base_bits", _WHAT, parse=int, choices=(4, 8, 16, 32),
              help="frozen base for lora/qlora: 4/8 quantized, 16 (bf16, default), 32 (fp32 under autocast)",
              label="frozen base bits", hint="16, 8 or 4"),
    PlanField("weights", _WHAT, owner="train", attr="model_source", metavar="HF_ID|PATH|random-init",
              help="the weights the run starts from (default: the model's own pretrained weights; random-init "
                   "for config-only models, testing only)",
              label="weights", hint="starting weights: HF id (org/name), a local model folder, or random-init "
                                    "(testing only)",
              prompt="Weights (HF id, local model folder, or random-init for testing)"),
    PlanField("data", _WHAT, owner="train", attr="dataset", metavar="PATH|HF_DATASET_ID",
              help="training data: JSONL/JSON/Parquet/CSV file or folder, or an HF dataset id in the local "
                   "cache; its row count is the dataset size unless --dataset-size is given",
              label="data", hint="JSONL file or HF dataset id; empty: the bundled demo data"),
    PlanField("report_to", _WHAT, owner="train", parse=parse_csv, metavar="tensorboard,wandb|none",
              help="where the trainer reports besides metrics.jsonl: tensorboard (default), wandb (offline unless "
                   "WANDB_MODE or WANDB_API_KEY say otherwise; the plan is its config), none"),
    PlanField("data_columns", _WHAT, owner="train", parse=parse_columns, metavar="prompt=COL,completion=COL",
              help="--data's column names when they differ from TRL's (text, prompt, completion, messages), e.g. "
                   "prompt=question,completion=answer or prompt=instruction,completion=output"),
    PlanField("eval_data", _WHAT, owner="train", metavar="PATH|HF_DATASET_ID",
              help="an eval split, evaluated every eval_every steps (default: checkpoint_every) and at the end: eval "
                   "loss and perplexity in metrics.jsonl and the monitor's chart"),
    PlanField("eval_fraction", _WHAT, owner="train", parse=float, metavar="F",
              help="instead of --eval-data: hold out this share of --data's blocks (the last ones) for evaluation"),
    PlanField("resident", _WHAT, owner="args", parse=parse_resident, kind="append", metavar="MODEL[:BITS]",
              help="an extra inference-only model kept on every GPU (reference policy, evaluator)",
              label="resident models", hint="MODEL[:BITS], … inference-only (reference policy, evaluator)",
              form="residents", prompt="Extra resident models (MODEL[:BITS], comma list, or none)"),
    PlanField("objective", _OBJ, choices=Objective.values(),
              help="sft (default), reward (preference model), dpo or grpo; --micro-batch counts pairs for "
                   "reward/dpo and completions for grpo, as TRL's per_device_train_batch_size",
              prompt="Objective"),
    PlanField("prompt_len", _OBJ, parse=int, help="dpo/grpo: prompt tokens (dpo default: half of --seq-len)",
              label="prompt length", prompt="Prompt length in tokens (default: half the sequence)"),
    PlanField("completion_len", _OBJ, parse=int,
              help="grpo: completion tokens (default 512); the sequence is prompt + completion",
              label="completion length", prompt="Completion length in tokens (default = TRL's)"),
    PlanField("num_generations", _OBJ, parse=int, metavar="G", help="grpo: completions per prompt (default 8)",
              label="num-generations", prompt="Completions per prompt (--num-generations; default = TRL's)"),
    PlanField("ref_model", _OBJ, choices=RefModel.values(),
              help="reference policy: same (frozen copy; LoRA: adapters disabled), none, precomputed (dpo); "
                   "default same for dpo, none for grpo (TRL's beta 0)",
              prompt="Reference model"),
    PlanField("generation", _OBJ, choices=Generation.values(),
              help="grpo: generate in the training process (train, default), with vLLM colocated (a share of "
                   "the card), or on separate GPUs (server)"),
    PlanField("generation_memory", _OBJ, parse=float, metavar="F",
              help="grpo colocate: vLLM's share of the card (default 0.3, TRL's vllm_gpu_memory_utilization)"),
    PlanField("gpus", _HW, help="auto | 4xH200 | 8xRTX4090 | 2x8xH100 (nodes × GPUs per node)"),
    PlanField("nodes", _HW, parse=int, bounds=(1, 1 << 14), label="nodes", prompt="Nodes"),
    PlanField("inter_node_gbps", _HW, parse=inter_node_gbit_s, metavar="GBPS|LINK",
              help="inter-node link per node, Gb/s or a name: edr, hdr, ndr, xdr, 10gbe … 400gbe "
                   "(default 200, one HDR InfiniBand port)"),
    PlanField("strategy", _HOW, choices=Strategy.values()),
    PlanField("offload", _HOW, choices=Offload.values()),
    PlanField("precision", _HOW, choices=Precision.values()),
    PlanField("master_weights", _HOW, choices=MasterWeights.values(),
              help="full fine-tuning: fp32 master weights (mixed precision, default) or bf16 weights only "
                   "(a model loaded in bf16 with AdamW on it, no fp32 copy; DDP or FSDP)"),
    PlanField("optimizer", _HOW, choices=Optimizer.values()),
    PlanField("optimizer_impl", _HOW, choices=OptimizerImpl.values(),
              help="torch's optimizer implementation (default fused, as the bundled trainer and HF Trainer run)"),
    PlanField("attn", _HOW, choices=Attention.values()),
    PlanField("experts_impl", _HOW, choices=ExpertsImpl.values(),
              help="MoE models: transformers' experts implementation (grouped_mm, the default; eager: a loop over "
                   "the experts; batched_mm: the experts' weights gathered per token)"),
    PlanField("loop", _HOW, choices=Loop.values(),
              help="the training loop the numbers are for: trainer (bundled, default), hf-trainer, trl (SFTTrainer), "
                   "accelerate-loop (a hand-written loop that keeps the model's outputs through backward)"),
    PlanField("loss", _HOW, choices=LossImpl.values(),
              help="causal-LM loss: standard (B·S·V logits) or chunked (lm_head + cross-entropy in token chunks, "
                   "recomputed in backward: liger-kernel on CUDA, pure torch elsewhere)"),
    PlanField("grad_ckpt", _HOW, kind="flag"),
    PlanField("headroom", _HOW, parse=float, help="safety fraction of card memory kept free (default 0.10)"),
    PlanField("micro_batch", _BATCH, parse=int, bounds=(1, 1 << 16)),
    PlanField("grad_accum", _BATCH, parse=int, bounds=(1, 1 << 24)),
    PlanField("effective_batch", _BATCH, parse=int, bounds=(1, 1 << 30), label="effective batch",
              hint="samples per optimizer step, all GPUs together",
              prompt="Effective batch (samples per optimizer step, all GPUs)"),
    PlanField("seq_len", _BATCH, parse=int, bounds=(1, 1 << 24), label="sequence length",
              hint="tokens per sample (packed)", prompt="Sequence length"),
    PlanField("dataset_size", _BATCH, parse=int, help="samples", bounds=(1, 1 << 48), label="samples",
              hint="sample count for the estimate; empty: counted from a local data file", form="dataset"),
    PlanField("epochs", _BATCH, parse=float, label="epochs", hint="passes over the data (fractions allowed)",
              prompt="Epochs"),
    PlanField("tokens_per_sample", _BATCH, parse=int, bounds=(1, 1 << 24)),
    PlanField("base_lr", _BATCH, parse=float, label="base LR", hint="optional: an LR tuned at another batch…",
              optional=True),
    PlanField("base_batch", _BATCH, parse=int, bounds=(1, 1 << 30), label="base batch",
              hint="…and that batch: the LR rules scale it", optional=True),
    PlanField("lr", None, owner="train", parse=float, label="learning rate", hint="peak LR the run uses",
              prompt="Learning rate"),
)
FIELD: dict[str, PlanField] = {f.name: f for f in FIELDS}
FORM_FIELD: dict[str, PlanField] = {f.form_name: f for f in FIELDS}

# The flags whose value is the PlanRequest field of the same name (--resident becomes `residents`, in args.py).
REQUEST_FLAGS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.owner == "request" and f.group is not None
                                       and f.kind != "append")
# Whole-number fields: (smallest, largest accepted). A real job is orders of magnitude inside these.
INT_LIMITS: dict[str, tuple[int, int]] = {f.name: f.bounds for f in FIELDS if f.bounds is not None}

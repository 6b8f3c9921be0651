"""One declaration per plan field: its flag, argparse group, kind and parser, help, bounds, and the words the
wizard and the `--plain` prompts use. Every front end derives its part from FIELDS: the CLI's flags
(`tui/cli/plan_args.py`), which flags are PlanRequest fields (`args.py`), the whole-number bounds (`checks.py`),
the wizard's labels, hints and initial values (`tui/wizard/screen_batch.py`) and the plain prompts
(`tui/wizard/plain.py`).

Adding a plan field: README.md's "Adding a plan field" lists every place (a choice of how the run computes is
declared in `engine/choices.py` RunChoices instead, and `choice_fields` makes its PlanField).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from scaletrain.engine.catalog.hardware import inter_node_gbit_s
from scaletrain.engine.choices import HOW_GROUP, RunChoices, choice_kind
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.vocabulary import (Generation, LossImpl, Method, Objective, Offload, RefModel, Strategy,
                                          Vocabulary)

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
        if ours.strip() in out:
            raise ValueError(f"{ours.strip()} is mapped twice ({ours.strip()}={out[ours.strip()]} and {item}); map "
                             "each name once")
        if not theirs.strip().isprintable():
            raise ValueError(f"{ascii(theirs)[:80]}: a column name holds a control character")
        out[ours.strip()] = theirs.strip()
    if not out:
        raise ValueError("no NAME=COLUMN pair")
    return out


def parse_resident(text: str) -> tuple[str, int]:
    """--resident MODEL[:BITS] (bits 16, 8 or 4; default 16)."""
    model, _, bits = text.rpartition(":") if text.rsplit(":", 1)[-1] in RESIDENT_BITS else (text, "", "16")
    return (model, int(bits))


# --job-spec: what engine/run/jobspecs.py writes for each kind.
JOB_SPEC_KINDS = ("slurm", "skypilot", "kubeflow")


def parse_job_specs(text: str) -> tuple[str, ...]:
    """--job-spec slurm,skypilot,kubeflow: the kinds in the order given, each once."""
    kinds = [k.strip().lower() for k in str(text).split(",") if k.strip()]
    if not kinds or any(k not in JOB_SPEC_KINDS for k in kinds):
        raise ScaletrainError(f"--job-spec {str(text)[:60]!r} is not accepted; give a comma list of "
                              f"{', '.join(JOB_SPEC_KINDS)}")
    return tuple(dict.fromkeys(kinds))


GPU_PRICE_FLAG = "--gpu-price"
MAX_GPU_PRICE = 1000.0            # per GPU-hour: far above any offer; a larger number is a typo (cents for dollars)


def parse_gpu_price(text: str) -> float:
    """--gpu-price: a positive number of USD per GPU-hour, at most MAX_GPU_PRICE."""
    accepted = f"a price in USD per GPU-hour, more than 0 and at most {MAX_GPU_PRICE:,.0f} (e.g. 2.49)"
    try:
        value = float(str(text).strip().lstrip("$"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_GPU_PRICE):
        raise ScaletrainError(f"{GPU_PRICE_FLAG} {str(text)[:40]!r} is not accepted; give {accepted}")
    return value


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
    default: str | None = None             # the default in words, where the dataclass default (None) does not say it
    relaunch: bool = False                 # a relaunch may change it and still resume the checkpoint
    search: bool = False                   # the planner chooses it when the request leaves it free (None)
    hardware: bool = False                 # names the machines: changing it is a new run directory, not a relaunch
    screen: tuple[str, int] | None = None  # (the wizard step whose text fields hold it, its place there)

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


def choice_fields(record: type = RunChoices) -> tuple[PlanField, ...]:
    """A record's fields (engine/choices.py RunChoices) as plan fields: the declaration's help, group, relaunch rule
    and kind (its words as choices, a bool as --x/--no-x, a number with its parser and bounds)."""
    out = []
    for f in dataclasses.fields(record):
        kind, meta = choice_kind(f.name, record), f.metadata
        if isinstance(kind, type) and issubclass(kind, Vocabulary):
            how: dict[str, Any] = dict(choices=kind.values())
        elif kind is bool:
            how = dict(kind="flag")
        else:
            how = dict(parse=kind, bounds=meta["bounds"], metavar=meta["metavar"])
        out.append(PlanField(f.name, meta["group"], help=meta["help"], relaunch=meta["relaunch"], **how))
    return tuple(out)


_WHAT, _OBJ, _HW, _HOW, _BATCH = ("what to train", "objective (TRL: reward, dpo, grpo)", "hardware", HOW_GROUP,
                                  "batch and data")
_RUN = "run directory"

FIELDS: tuple[PlanField, ...] = (
    PlanField("model", _WHAT, help="catalog id (scaletrain models), config.json path or folder, or a Hugging Face "
              "id (its config.json from the HF cache, else the Hub)",
              default="none: required, unless --preset gives it",
              label="model", hint="catalog id, config.json path or folder, or an HF id (from the cache or the Hub)",
              prompt="Model (catalog id, config.json path, or HF id)"),
    PlanField("method", _WHAT, choices=Method.values(), prompt="Method",
              help="full fine-tuning, LoRA adapters, or QLoRA (LoRA on a 4-bit base)"),
    PlanField("lora_rank", _WHAT, parse=int, bounds=(1, 1 << 16), label="LoRA rank", metavar="R",
              help="lora/qlora: the adapters' rank r",
              hint="adapter rank r (e.g. 8, 16, 64)", prompt="LoRA rank"),
    PlanField("lora_targets", _WHAT, parse=parse_csv, metavar="a,b", help="lora/qlora: the modules that get adapters, a comma list; "
              "experts: an MoE's fused experts (peft target_parameters)", default="every block linear",
              label="LoRA targets", hint="comma list: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
              prompt="LoRA targets (comma list, 'all' = every block linear)"),
    PlanField("base_bits", _WHAT, parse=int, choices=(4, 8, 16, 32),
              help="frozen base for lora/qlora: 4/8 quantized, 16 (bf16), 32 (fp32 under autocast)",
              default="16 for lora, 4 for qlora",
              label="frozen base bits", hint="16, 8 or 4"),
    PlanField("weights", _WHAT, owner="train", attr="model_source", metavar="HF_ID|PATH|random-init",
              help="the weights the run starts from (random-init: testing only)",
              default="the model's own pretrained weights; random-init for config-only models",
              label="weights", hint="starting weights: HF id (org/name), a local model folder, or random-init "
                                    "(testing only)",
              prompt="Weights (HF id, local model folder, or random-init for testing)"),
    PlanField("data", _WHAT, owner="train", attr="dataset", screen=("batch", 2), metavar="PATH|HF_DATASET_ID",
              help="training data: JSONL/JSON/Parquet/CSV file or folder, or an HF dataset id in the local "
                   "cache; its row count is the dataset size unless --dataset-size is given",
              default="the bundled demo data",
              label="data", hint="JSONL file or HF dataset id; empty: the bundled demo data"),
    PlanField("report_to", _WHAT, owner="train", parse=parse_csv, metavar="tensorboard,wandb|none",
              help="where the trainer reports besides metrics.jsonl: tensorboard, wandb (offline unless "
                   "WANDB_MODE or WANDB_API_KEY say otherwise; the plan is its config), none"),
    PlanField("data_columns", _WHAT, owner="train", parse=parse_columns, metavar="prompt=COL,completion=COL",
              help="--data's column names when they differ from TRL's (text, prompt, completion, messages), e.g. "
                   "prompt=question,completion=answer or prompt=instruction,completion=output",
              default="TRL's names"),
    PlanField("eval_data", _WHAT, owner="train", metavar="PATH|HF_DATASET_ID",
              help="an eval split, evaluated every eval_every steps (checkpoint_every unless set) and at the end: eval "
                   "loss and perplexity in metrics.jsonl and the monitor's chart", default="none"),
    PlanField("eval_fraction", _WHAT, owner="train", parse=float, metavar="F",
              help="instead of --eval-data: hold out this share of --data's blocks (the last ones) for evaluation"),
    PlanField("resident", _WHAT, owner="args", parse=parse_resident, kind="append", metavar="MODEL[:BITS]",
              help="an extra inference-only model kept on every GPU (reference policy, evaluator); repeatable",
              default="none",
              label="resident models", hint="MODEL[:BITS], … inference-only (reference policy, evaluator)",
              form="residents", prompt="Extra resident models (MODEL[:BITS], comma list, or none)"),
    PlanField("objective", _OBJ, choices=Objective.values(),
              help="sft, reward (preference model), dpo or grpo; --micro-batch counts pairs for "
                   "reward/dpo and completions for grpo, as TRL's per_device_train_batch_size",
              prompt="Objective"),
    PlanField("prompt_len", _OBJ, parse=int, bounds=(1, 1 << 24), metavar="T", help="dpo/grpo: prompt tokens",
              default="dpo: half of --seq-len; grpo: --seq-len less the completion",
              label="prompt length", prompt="Prompt length in tokens (default: half the sequence)"),
    PlanField("completion_len", _OBJ, parse=int, bounds=(1, 1 << 24),
              metavar="T", help="grpo: completion tokens; the sequence is prompt + completion", default="512 (TRL's)",
              label="completion length", prompt="Completion length in tokens (default = TRL's)"),
    PlanField("num_generations", _OBJ, parse=int, bounds=(1, 1 << 16), metavar="G", help="grpo: completions per prompt", default="8 (TRL's)",
              label="num-generations", prompt="Completions per prompt (--num-generations; default = TRL's)"),
    PlanField("ref_model", _OBJ, choices=RefModel.values(),
              help="reference policy: same (frozen copy; LoRA: adapters disabled), none, precomputed (dpo)",
              default="same for dpo, none for grpo (TRL's beta 0)",
              prompt="Reference model"),
    PlanField("generation", _OBJ, choices=Generation.values(),
              help="grpo: generate in the training process (train), with vLLM colocated (a share of "
                   "the card), or on separate GPUs (server)"),
    PlanField("generation_memory", _OBJ, parse=float, metavar="F",
              help="grpo colocate: vLLM's share of the card (TRL's vllm_gpu_memory_utilization)"),
    PlanField("gpus", _HW, hardware=True, metavar="G", help="auto | 4xH200 | 8xRTX4090 | 2x8xH100 (nodes × GPUs per node) | 2xCPU",
              default="auto (this machine's GPUs, through NVML)"),
    PlanField("nodes", _HW, hardware=True, parse=int, bounds=(1, 1 << 14), label="nodes", prompt="Nodes", metavar="N",
              help="nodes with --gpus per node each", default="1, or the first count of --gpus NxMxGPU"),
    PlanField("inter_node_gbps", _HW, hardware=True, parse=inter_node_gbit_s, metavar="GBPS|LINK",
              help="inter-node link per node, Gb/s or a name: edr, hdr, ndr, xdr, 10gbe … 400gbe",
              default="200 (one HDR InfiniBand port)"),
    PlanField("host_ram", _HW, parse=float, metavar="GIB",
              help="host RAM per node, GiB, that the verdict weighs offloaded states and the end-of-run export "
                   "against",
              default="this node's RAM for --gpus auto and CPU plans; not checked for named GPUs"),
    PlanField("gpu_price", _HW, owner="args", parse=parse_gpu_price, metavar="USD_PER_GPU_HOUR",
              help="on-demand price of one of the plan's GPUs per hour, for the plan's cost",
              default="the bundled price table (engine/catalog/prices.yaml, dated), or your "
                      "$XDG_CONFIG_HOME/scaletrain/prices.yaml"),
    PlanField("job_spec", _RUN, owner="args", parse=parse_job_specs, metavar="slurm,skypilot,kubeflow",
              help="job specs written into the run directory: slurm (sbatch.sh), skypilot (skypilot.yaml, "
                   "skypilot-managed.yaml), kubeflow (trainjob.yaml, pytorchjob.yaml)",
              default="slurm for multi-node plans, none for one node"),
    PlanField("max_restarts", _RUN, owner="train", parse=int, metavar="N",
              help="run under torchrun's elastic agent: after a rank dies every rank is restarted, up to N times, "
                   "resuming from the newest checkpoint (c10d rendezvous)", default="0: no restart"),
    PlanField("resume_from", _RUN, owner="train", metavar="RUN_DIR|CHECKPOINT",
              help="start from another run's checkpoint (its newest, or one checkpoints/step-N/), also one written "
                   "by another number of GPUs: the same strategy and effective batch continue its steps, LR "
                   "schedule and data order", default="none: step 0"),
    PlanField("strategy", _HOW, search=True, choices=Strategy.values(),
              help="data parallel, DeepSpeed ZeRO stage 1/2/3, or PyTorch FSDP", default="the planner chooses"),
    PlanField("offload", _HOW, search=True, relaunch=True, choices=Offload.values(),
              help="states kept in host RAM: none, the optimizer's, or the parameters too",
              default="the planner chooses (none unless needed to fit)"),
    *choice_fields(),             # precision … loop: engine/choices.py RunChoices
    PlanField("loss", _HOW, choices=LossImpl.values(),
              help="causal-LM loss: standard (B·S·V logits) or chunked (lm_head + cross-entropy in token chunks, "
                   "recomputed in backward: liger-kernel on CUDA, pure torch elsewhere)",
              default="the planner chooses (standard unless chunked lets more fit)"),
    PlanField("grad_ckpt", _HOW, search=True, relaunch=True, kind="flag", help="gradient checkpointing on (--grad-ckpt) or off (--no-grad-ckpt)",
              default="the planner chooses; on for reward, dpo and grpo"),
    PlanField("headroom", _HOW, parse=float, metavar="F", help="safety fraction of card memory kept free"),
    PlanField("micro_batch", _BATCH, search=True, relaunch=True, parse=int, bounds=(1, 1 << 16), metavar="B",
              help="samples per GPU per forward/backward", default="the planner chooses"),
    PlanField("grad_accum", _BATCH, search=True, relaunch=True, parse=int, bounds=(1, 1 << 24), metavar="A",
              help="micro batches per optimizer step", default="the planner chooses"),
    PlanField("effective_batch", _BATCH, screen=("batch", 0), parse=int, bounds=(1, 1 << 30), label="effective batch", metavar="E",
              help="samples per optimizer step, all GPUs together (micro × accum × GPUs)",
              default="none: the largest micro batch that fits, accum 1",
              hint="samples per optimizer step, all GPUs together",
              prompt="Effective batch (samples per optimizer step, all GPUs)"),
    PlanField("seq_len", _BATCH, screen=("batch", 1), parse=int, bounds=(1, 1 << 24), label="sequence length", metavar="S",
              help="tokens per sample (packed blocks)",
              hint="tokens per sample (packed)", prompt="Sequence length"),
    PlanField("dataset_size", _BATCH, screen=("batch", 3), parse=int, help="samples in the data, for steps, epoch and total time",
              default="--data's row count; unknown without --data", metavar="N", bounds=(1, 1 << 48), label="samples",
              hint="sample count for the estimate; empty: the data's rows (or the bundled data's)", form="dataset"),
    PlanField("epochs", _BATCH, screen=("batch", 4), parse=float, label="epochs", metavar="K", help="passes over the data", hint="passes over the data (fractions allowed)",
              prompt="Epochs"),
    PlanField("tokens_per_sample", _BATCH, parse=int, bounds=(1, 1 << 24), metavar="T",
              help="real tokens per sample when samples are shorter than --seq-len (unpacked)",
              default="--seq-len (packed)"),
    PlanField("base_lr", _BATCH, screen=("batch", 6), parse=float, label="base LR", metavar="LR",
              help="an LR tuned at --base-batch: the plan scales it to the effective batch", default="none", hint="optional: an LR tuned at another batch…",
              optional=True),
    PlanField("base_batch", _BATCH, screen=("batch", 7), parse=int, bounds=(1, 1 << 30), label="base batch", metavar="B",
              help="the batch --base-lr was tuned at", default="none",
              hint="…and that batch: the LR rules scale it", optional=True),
    PlanField("lr", None, owner="train", screen=("batch", 5), parse=float, label="learning rate", hint="peak LR the run uses",
              prompt="Learning rate", help="the peak learning rate the run uses"),
    # keys only a preset or --set gives (no flag of their own): `scaletrain plan --keys` lists them with the above
    PlanField("name", None, help="the plan's name (run directory names, reports)", default="the preset's name"),
    PlanField("device", None, help="cuda or cpu", default="cpu for --gpus NxCPU, else cuda"),
    PlanField("lr_schedule", None, owner="train", help="learning-rate schedule: cosine, linear or constant "
              "(after warm-up)"),
    PlanField("warmup_ratio", None, owner="train", help="share of the steps spent warming the LR up"),
    PlanField("weight_decay", None, owner="train", help="AdamW's weight decay"),
    PlanField("max_grad_norm", None, owner="train", help="gradient clipping norm (0: off)"),
    PlanField("max_steps", None, owner="train", help="stop after this many optimizer steps (overrides epochs)",
              default="none: the epochs decide"),
    PlanField("checkpoint_every", None, owner="train", help="optimizer steps between checkpoints (and a final one)"),
    PlanField("save_checkpoints", None, owner="train", help="write checkpoints at all (false: not even the final one)"),
    PlanField("keep_checkpoints", None, owner="train", help="keep only the newest N complete checkpoints",
              default="none: keep every one"),
    PlanField("export_at_end", None, owner="train", help="rank 0 exports the last checkpoint as a model folder "
              "(export/step-N), checked against the trained model's logits"),
    PlanField("seed", None, owner="train", help="random seed (data order, init, dropout)"),
    PlanField("packing", None, owner="train", help="pack samples into --seq-len blocks (false: pad each sample)"),
    PlanField("eval_every", None, owner="train", help="optimizer steps between evaluations",
              default="checkpoint_every"),
    PlanField("lora_alpha", None, owner="train", help="LoRA's alpha (scale = alpha / rank)", default="2 × rank"),
    PlanField("lora_dropout", None, owner="train", help="LoRA's dropout"),
    PlanField("script", None, owner="train", help="user-script mode: run this script under the run's configs "
              "instead of the bundled trainer", default="none: the bundled trainer"),
    PlanField("script_args", None, owner="train", help="the user script's arguments (a list)", default="none"),
)
FIELD: dict[str, PlanField] = {f.name: f for f in FIELDS}
FORM_FIELD: dict[str, PlanField] = {f.form_name: f for f in FIELDS}

# The flags whose value is the PlanRequest field of the same name (--resident becomes `residents`, in args.py).
REQUEST_FLAGS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.owner == "request" and f.group is not None
                                       and f.kind != "append")
# Whole-number fields: (smallest, largest accepted). A real job is orders of magnitude inside these.
INT_LIMITS: dict[str, tuple[int, int]] = {f.name: f.bounds for f in FIELDS if f.bounds is not None}

# The field lists other modules used to keep by hand, now properties of the declarations above.
HARDWARE_FIELDS: frozenset[str] = frozenset(f.name for f in FIELDS if f.hardware)
SEARCH_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.search)      # FIELDS order: the search's
RESUMABLE_FIELDS: frozenset[str] = frozenset(f.name for f in FIELDS if f.relaunch)
PIN_FIELDS: tuple[str, ...] = (*SEARCH_FIELDS, "loss")    # what a plan pins: the search's choices and the loss


def screen_fields(step: str) -> tuple[str, ...]:
    """The wizard step's text fields (their form names), in their order on the screen."""
    on = sorted((f.screen[1], f.form_name) for f in FIELDS if f.screen is not None and f.screen[0] == step)
    return tuple(name for _, name in on)

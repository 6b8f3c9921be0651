"""PlanRequest: what the user fixed (CLI flags, a preset, the wizard). None means "let the planner choose".

`base_setup(request)` resolves the hardware and the model and holds the fixed choices in a TrainingSetup with
neutral defaults for the free ones; planner.make_plan fills those in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from scaletrain.engine.choices import carries, choices_of
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import Hardware, inter_node_gbit_s, parse_gpus
from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, load_model
from scaletrain.engine.estimate.setup import ResidentModel, TrainingSetup
from scaletrain.engine.request.checks import check_values
from scaletrain.engine.vocabulary import Vocabulary


TRL_OBJECTIVES = ("reward", "dpo", "grpo")
GRPO_COMPLETION_LEN = 512      # TRL GRPOConfig.max_completion_length
GRPO_NUM_GENERATIONS = 8       # TRL GRPOConfig.num_generations


@dataclass(frozen=True)
@carries(after="offload")           # precision … loop: RunChoices (engine/choices.py), as text
class PlanRequest:
    model: str
    gpus: str = "auto"
    nodes: int | None = None
    method: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] | None = None
    base_bits: int | None = None
    strategy: str | None = None
    offload: str | None = None
    loss: str | None = None          # None: the planner decides (standard unless chunked lets more fit)
    grad_ckpt: bool | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    effective_batch: int | None = None
    seq_len: int = 2048
    dataset_size: int | None = None
    epochs: float = 1.0
    tokens_per_sample: int | None = None
    residents: tuple[tuple[str, int], ...] = ()   # (model id, bits)
    headroom: float = 0.10
    inter_node_gbps: float | None = None
    base_lr: float | None = None
    base_batch: int | None = None
    device: str | None = None        # None → "cpu" for --gpus NxCPU, else "cuda"
    objective: str = "sft"
    prompt_len: int | None = None    # dpo: default half of seq_len; grpo: default seq_len − completion_len
    completion_len: int | None = None  # grpo: default 512 (TRL's max_completion_length); seq_len = prompt + completion
    num_generations: int | None = None  # grpo: default 8 (TRL)
    ref_model: str | None = None     # dpo: default same; grpo: default none (TRL's beta 0)
    generation: str = "train"        # grpo: train | colocate | server
    generation_memory: float = 0.3   # grpo colocate: vLLM's share of the card
    name: str = "plan"
    host_ram: float | None = None    # GiB per node the verdict weighs host needs against (None: detected or unknown)

    def __post_init__(self) -> None:
        # what the user typed, as text: a Strategy/Offload/... handed back from a setup is stored as its spelling
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Vocabulary):
                object.__setattr__(self, f.name, v.value)
        if self.grad_ckpt is None and self.objective in TRL_OBJECTIVES:
            object.__setattr__(self, "grad_ckpt", True)     # TRL's configs turn checkpointing on by default

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def with_(self, **changes: Any) -> "PlanRequest":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        out["residents"] = [list(r) for r in self.residents]
        return out


def resolve_hardware(req: PlanRequest) -> Hardware:
    """The request's hardware; --inter-node-gbps (Gb/s or a link name such as ndr) reaches Hardware as Gb/s."""
    link = None if req.inter_node_gbps is None else inter_node_gbit_s(req.inter_node_gbps)
    if (req.gpus or "").strip().lower() == "auto":
        from scaletrain.engine.devices.detect import hardware_from_detection
        return hardware_from_detection(nodes=req.nodes, inter_node_gbps=link)
    return parse_gpus(req.gpus, nodes=req.nodes, inter_node_gbps=link)


def base_setup(req: PlanRequest, hardware: Hardware | None = None) -> TrainingSetup:
    """A TrainingSetup with the request's fixed choices and neutral defaults for the free ones."""
    check_values(req)                  # every whole-number field within its PlanField bounds, and the rest
    if not 0.0 <= req.headroom < 1.0:
        raise ScaletrainError(f"--headroom must be a fraction in [0, 1) (got {req.headroom})")
    hw = hardware or resolve_hardware(req)
    model = load_model(req.model)
    residents = tuple(ResidentModel(load_model(mid), int(bits)) for mid, bits in req.residents)
    base_bits = req.base_bits if req.base_bits is not None else (4 if req.method == "qlora" else 16)
    seq_len, prompt_len = objective_lengths(req)
    return TrainingSetup(
        model=model, hardware=hw, method=req.method, lora_rank=req.lora_rank,
        lora_targets=tuple(req.lora_targets) if req.lora_targets else BLOCK_LINEARS, base_bits=base_bits,
        strategy=req.strategy or _default_strategy(req), offload=req.offload or "none",
        **choices_of(req), loss=req.loss or "standard", grad_ckpt=bool(req.grad_ckpt),
        micro_batch=req.micro_batch or 1, grad_accum=req.grad_accum or 1, seq_len=seq_len,
        residents=residents, dataset_size=req.dataset_size, epochs=req.epochs,
        tokens_per_sample=req.tokens_per_sample,
        device=req.device or ("cpu" if hw.gpu.key == "CPU" else "cuda"),
        objective=req.objective, prompt_len=prompt_len,
        num_generations=req.num_generations or GRPO_NUM_GENERATIONS,
        ref_model=req.ref_model or ("same" if req.objective == "dpo" else "none"),
        generation=req.generation, generation_memory=req.generation_memory,
    )


def objective_lengths(req: PlanRequest) -> tuple[int, int | None]:
    """(seq_len, prompt_len) the objective trains on. GRPO's sequences are prompt + completion; DPO's prompt is
    half the sequence unless given; reward and SFT read seq_len alone."""
    if req.completion_len is not None and req.objective != "grpo":
        raise ScaletrainError(f"--completion-len applies to grpo (got --objective {req.objective}); "
                              "give --seq-len (and --prompt-len for dpo)")
    if req.objective == "grpo":
        completion = req.completion_len or GRPO_COMPLETION_LEN
        prompt = req.prompt_len if req.prompt_len is not None else req.seq_len - completion
        if prompt < 1:
            raise ScaletrainError(f"--completion-len {completion} leaves no room for a prompt in --seq-len "
                                  f"{req.seq_len}; give --prompt-len (seq_len becomes prompt + completion)")
        return prompt + completion, prompt
    if req.objective == "dpo":
        return req.seq_len, req.prompt_len if req.prompt_len is not None else max(1, req.seq_len // 2)
    return req.seq_len, req.prompt_len


def _default_strategy(req: PlanRequest) -> str:
    """Neutral strategy for a free field: DDP, unless a fixed offload needs ZeRO (the planner searches anyway)."""
    return {"all": "zero3", "optimizer": "zero2"}.get(req.offload or "none", "ddp")


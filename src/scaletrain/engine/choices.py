"""RunChoices: the run's implementation choices, each declared once and carried as it is from the request to the
trainer.

A field here is declared once: its type (a Vocabulary, so its accepted words), its default, its help, its argparse
group, whether a relaunch may change it and whether a plan.json must hold it. Every record of a run carries these
fields as they are, spliced in by `carries` at the place their JSON has always put them:

    PlanRequest (engine/request/request.py)  what the user asked: the words as text
    TrainingSetup (engine/estimate/setup.py)    what the memory and time models read: the words as Vocabulary
    TrainingSection (engine/run/plan_document.py)  plan.json's "training", as the trainer's RunConfig reads it
    ObjectiveRun (trainer/objective_build.py)  one TRL run (reward, DPO, GRPO) or measured TRL step

and one codec writes and reads them: `choices_json` (a record → JSON words), `read_choices` (a plan.json section →
typed values, defaults for a plan written before the field existed), `recorded_choices` (a section → request
fields), `coerce_words` (any record's Vocabulary-typed fields, checked and typed in one line each). The CLI flag,
`--set` key and reference entry come from the same declaration (engine/request/fields.py `choice_fields`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Callable, Mapping, TypeVar, get_type_hints

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.vocabulary import (Attention, ExpertsImpl, Loop, MasterWeights, Optimizer, OptimizerImpl,
                                          Precision, Vocabulary)

HOW_GROUP = "how"          # the argparse group these flags are listed under


def choice(default: Any, help: str, *, relaunch: bool = False, required: bool = False,
           bounds: tuple[int, int] | None = None, metavar: str | None = None) -> Any:
    """A record field: a Vocabulary (its words are the accepted values), a bool (a --x/--no-x flag) or a number
    (`bounds`: the whole numbers accepted, checked with the request's; `metavar`: the flag's placeholder).
    `relaunch`: a relaunch may change it and still resume the checkpoint (the data order and the weights stay);
    `required`: a plan.json "training" section without it is not a plan (every plan ever written held it), else a
    plan written before it existed reads as the default."""
    return field(default=default, metadata={"help": help, "relaunch": relaunch, "required": required,
                                            "group": HOW_GROUP, "bounds": bounds, "metavar": metavar})


@dataclass(frozen=True)
class RunChoices:
    """How the run computes: the declaration every carrier splices in (see the module docstring)."""

    precision: Precision = choice(Precision.BF16, "compute precision (mixed precision for 16-bit)", required=True)
    master_weights: MasterWeights = choice(
        MasterWeights.FP32, "full fine-tuning: fp32 master weights (mixed precision, default) or bf16 weights only "
        "(a model loaded in bf16 with AdamW on it, no fp32 copy; DDP or FSDP)")
    optimizer: Optimizer = choice(Optimizer.ADAMW, "AdamW, bitsandbytes' 8-bit AdamW, or SGD", required=True)
    optimizer_impl: OptimizerImpl = choice(
        OptimizerImpl.FUSED, "torch's optimizer implementation (fused: as the bundled trainer and HF Trainer run)")
    attn: Attention = choice(Attention.SDPA, "attention implementation: eager, torch SDPA, or flash-attn 2",
                             relaunch=True, required=True)
    experts_impl: ExpertsImpl = choice(
        ExpertsImpl.GROUPED_MM, "MoE models: transformers' experts implementation (grouped_mm; eager: a loop over "
        "the experts; batched_mm: the experts' weights gathered per token)")
    loop: Loop = choice(
        Loop.TRAINER, "the training loop the numbers are for: trainer (bundled), hf-trainer, trl (SFTTrainer), "
        "accelerate-loop (a hand-written loop that keeps the model's outputs through backward)")


CHOICES: tuple[dataclasses.Field, ...] = fields(RunChoices)
CHOICE_NAMES: tuple[str, ...] = tuple(f.name for f in CHOICES)


@cache
@cache
def vocabulary_fields(cls: type) -> tuple[tuple[str, type[Vocabulary]], ...]:
    """(name, Vocabulary type) of every field of a dataclass whose annotation is a Vocabulary (read once per class:
    every setup the planner's search builds coerces its fields)."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls)
                 if isinstance(hints.get(f.name), type) and issubclass(hints[f.name], Vocabulary))


def choice_kind(name: str, record: type = RunChoices) -> type:
    """A record field's type: a Vocabulary, bool, int or float."""
    return get_type_hints(record)[name]


def _is_words(kind: type) -> bool:
    return isinstance(kind, type) and issubclass(kind, Vocabulary)


T = TypeVar("T")


def carries(after: str) -> Callable[[type[T]], type[T]]:
    """Splice RunChoices' fields into a dataclass-to-be right after its field `after` (before @dataclass runs):
    the record declared once, and each carrier's field order (its JSON's key order) as it always was."""

    def splice(cls: type[T]) -> type[T]:
        own = dict(cls.__dict__.get("__annotations__", {}))
        clash = sorted(set(own) & set(CHOICE_NAMES))
        if clash or after not in own:
            raise TypeError(f"{cls.__name__}: RunChoices fields {clash} are declared twice" if clash
                            else f"{cls.__name__} has no field {after!r} to carry RunChoices after")
        hints = get_type_hints(RunChoices)
        ann: dict[str, Any] = {}
        for name, kind in own.items():
            ann[name] = kind
            if name == after:
                for f in CHOICES:
                    ann[f.name] = hints[f.name]
                    setattr(cls, f.name, field(default=f.default, metadata=f.metadata))
        cls.__annotations__ = ann
        return cls

    return splice


def coerce_words(record: Any, skip: tuple[str, ...] = ()) -> None:
    """Every Vocabulary-typed field of a frozen dataclass (but `skip`), as its Vocabulary; one line for a word it
    does not accept ("--attn 'x' is not accepted; use one of: eager, sdpa, flash")."""
    for name, kind in vocabulary_fields(type(record)):
        if name in skip:
            continue
        value = getattr(record, name)
        if type(value) is kind:             # already the word (a setup copied by with_): nothing to check
            continue
        if value not in kind.values():
            raise ScaletrainError(f"--{name.replace('_', '-')} {value!r} is not accepted; use one of: "
                                  f"{', '.join(kind.values())}")
        object.__setattr__(record, name, kind(value))


def choices_of(record: Any) -> dict[str, Any]:
    """A carrier's choices as they are: what one carrier hands the next (request → setup, section → TRL run)."""
    return {name: getattr(record, name) for name in CHOICE_NAMES}


def choices_json(record: Any) -> dict[str, str]:
    """A carrier's choices as plan.json words, in declaration order."""
    return {name: (str(v) if isinstance(v, Vocabulary) else v) for name in CHOICE_NAMES
            for v in (getattr(record, name),)}


def read_choices(section: Mapping[str, Any]) -> dict[str, Any]:
    """A plan.json "training" section's choices, typed: a required one missing raises KeyError, a bad word
    ValueError (the reader's "missing or bad field" line); an optional one missing is its default."""
    out: dict[str, Vocabulary] = {}
    for f in CHOICES:
        kind = choice_kind(f.name)
        raw = section[f.name] if f.metadata["required"] else section.get(f.name)
        if _is_words(kind):
            out[f.name] = kind(raw or f.default)
        else:
            out[f.name] = f.default if raw is None else raw
            if not isinstance(out[f.name], kind) or isinstance(out[f.name], bool) != (kind is bool):
                raise ValueError(f"{f.name} {raw!r} is not a {kind.__name__}")
    return out


def recorded_choices(section: Mapping[str, Any]) -> dict[str, Any]:
    """A plan.json "training" section's choices as request fields: the required ones (KeyError when missing),
    and the optional ones the section holds (a plan from before a field existed leaves the request's default)."""
    return {f.name: section[f.name] for f in CHOICES
            if f.metadata["required"] or section.get(f.name) is not None}


def relaunch_choices() -> frozenset[str]:
    """The choices a relaunch may change and still resume."""
    return frozenset(f.name for f in CHOICES if f.metadata["relaunch"])

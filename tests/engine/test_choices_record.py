"""One record of the run's choices (engine/choices.py RunChoices): declared once, carried as it is by the request,
the setup, plan.json's "training" section and the trainer's RunConfig, written and read by one codec."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
import json
from pathlib import Path

import pytest

import scaletrain
from scaletrain.engine.choices import CHOICE_NAMES, RunChoices, carries, choices_json, read_choices, recorded_choices
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.fields import (FIELD, HARDWARE_FIELDS, PIN_FIELDS, RESUMABLE_FIELDS, SEARCH_FIELDS,
                                              screen_fields)
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.plan_document import PlanDocument, TrainingSection
from scaletrain.engine.vocabulary import Attention, ExpertsImpl, Loop, MasterWeights, OptimizerImpl

SRC = Path(scaletrain.__file__).resolve().parent


def declaring_classes(name: str) -> list[str]:
    """Every class under src/ whose body annotates `name` (a dataclass field declaration)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out += [f"{path.relative_to(SRC)}:{node.name}" for stmt in node.body
                        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.target.id == name]
    return out


@pytest.mark.parametrize("name", ["experts_impl", "optimizer_impl", "master_weights"])
def test_each_choice_is_declared_in_exactly_one_record_class(name):
    assert declaring_classes(name) == ["engine/choices.py:RunChoices"]


def test_the_declaration_scan_sees_a_second_declaration():
    """The scan above counts class annotations: a class that declares `loss` is found wherever it is."""
    assert len(declaring_classes("loss")) >= 2


@pytest.mark.parametrize("cls", [PlanRequest, TrainingSetup, TrainingSection])
def test_every_carrier_holds_the_whole_record(cls):
    names = [f.name for f in dataclasses.fields(cls)]
    assert set(CHOICE_NAMES) <= set(names)
    start = names.index(CHOICE_NAMES[0])          # spliced together, in declaration order
    assert tuple(names[start:start + len(CHOICE_NAMES)]) == CHOICE_NAMES


def test_the_trainers_config_is_plan_jsons_section_as_it_is():
    from scaletrain.trainer.config import RunConfig

    assert issubclass(RunConfig, TrainingSection)


def test_a_second_declaration_is_refused():
    with pytest.raises(TypeError, match="declared twice"):
        @carries(after="a")
        class Twice:
            a: int
            attn: str


def test_the_request_keeps_text_and_the_setup_the_vocabulary():
    req = PlanRequest(model="tiny-llama", gpus="1xCPU", experts_impl=ExpertsImpl.EAGER)
    assert type(req.experts_impl) is str and req.experts_impl == "eager"
    assert type(req.attn) is str and req.attn == "sdpa"
    setup = make_plan(req).setup
    assert setup.experts_impl is ExpertsImpl.EAGER and setup.master_weights is MasterWeights.FP32
    assert choices_json(setup) == {n: str(getattr(req, n)) for n in CHOICE_NAMES}


def test_the_codec_reads_old_plans_and_refuses_bad_words():
    old = {"precision": "bf16", "optimizer": "adamw", "attn": "eager"}   # a plan written before issue 12
    got = read_choices(old)
    assert got["attn"] is Attention.EAGER and got["optimizer_impl"] is OptimizerImpl.FUSED
    assert got["loop"] is Loop.TRAINER and got["master_weights"] is MasterWeights.FP32
    assert recorded_choices(old) == old                       # the request keeps its defaults for the rest
    with pytest.raises(KeyError):
        read_choices({"optimizer": "adamw", "attn": "sdpa"})    # precision: every plan ever written holds it
    with pytest.raises(ValueError):
        read_choices({**old, "loop": "nonsense"})


def test_a_plan_json_round_trips_through_the_codec(tmp_path):
    from scaletrain.engine.request.options import TrainOptions

    req = PlanRequest(model="tiny-llama", gpus="2xCPU", optimizer_impl="foreach", loop="hf-trainer", attn="eager",
                      micro_batch=1, grad_accum=1)
    doc = PlanDocument.build(make_plan(req), req, TrainOptions())
    back = PlanDocument.from_json(json.loads(doc.dumps()))
    tr = back.training
    assert {n: getattr(tr, n) for n in CHOICE_NAMES} == {n: getattr(make_plan(req).setup, n) for n in CHOICE_NAMES}
    again, _ = back.replan()
    assert {n: getattr(again, n) for n in CHOICE_NAMES} == {n: getattr(req, n) for n in CHOICE_NAMES}


def test_field_facts_are_properties_of_the_declaration():
    assert SEARCH_FIELDS == ("strategy", "offload", "grad_ckpt", "micro_batch", "grad_accum")
    assert PIN_FIELDS == (*SEARCH_FIELDS, "loss")
    assert HARDWARE_FIELDS == {"gpus", "nodes", "inter_node_gbps"}
    assert RESUMABLE_FIELDS == {"micro_batch", "grad_accum", "grad_ckpt", "offload", "attn"}
    assert screen_fields("batch") == ("effective_batch", "seq_len", "data", "dataset", "epochs", "lr", "base_lr",
                                      "base_batch")
    for f in dataclasses.fields(RunChoices):        # the flag's help and choices come from the declaration
        assert FIELD[f.name].help == f.metadata["help"]
        assert FIELD[f.name].relaunch == f.metadata["relaunch"]


OLD_PLAN = Path(__file__).resolve().parents[1] / "fixtures" / "plan_written_by_12eadae.json"
ADDED_SINCE_ISSUE_12 = ("master_weights", "optimizer_impl", "experts_impl", "loop", "loss")


@pytest.mark.parametrize("older", [False, True])
def test_a_plan_json_written_before_the_record_still_reads(tmp_path, older):
    """plan.json as the code before RunChoices wrote it (`scaletrain --preset cpu-tiny --headless --run-dir D
    --dry-run` at commit 12eadae), and the same without the fields issues 12–21 added (an older plan): the trainer
    reads it, and the re-plan writes the same "training" section back."""
    from scaletrain.engine.run.layout import RunDir
    from scaletrain.trainer.config import read_run_config

    data = json.loads(OLD_PLAN.read_text())
    want = dict(data["training"])
    if older:
        for key in ADDED_SINCE_ISSUE_12:
            data["training"].pop(key, None)
            data["request"].pop(key, None)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.plan.write_text(json.dumps(data))
    cfg = read_run_config(run.path)
    assert (cfg.precision, cfg.optimizer, cfg.attn, cfg.optimizer_impl, cfg.master_weights, cfg.loop, cfg.loss) == (
        "fp32", "adamw", "sdpa", "fused", "fp32", "trainer", "standard")
    _req, plan = PlanDocument.from_json(data).replan()
    assert plan.setup.to_json() == want


def test_a_number_or_a_switch_is_declared_the_same_way():
    """The next knobs (a parallel degree, an on/off) are one `choice(...)` line too: a number gets its parser and
    bounds (checked with the request's), a bool a --x/--no-x flag, a word its Vocabulary's choices."""
    from scaletrain.engine.choices import choice
    from scaletrain.engine.request.fields import choice_fields

    @dataclass(frozen=True)
    class Next:
        tensor_parallel: int = choice(1, "GPUs one layer is split across", bounds=(1, 64), metavar="N")
        compile: bool = choice(False, "torch.compile the model", relaunch=True)
        attn: Attention = choice(Attention.SDPA, "attention implementation")

    tp, comp, attn = choice_fields(Next)
    assert (tp.flag, tp.parse, tp.bounds, tp.metavar, tp.kind) == ("--tensor-parallel", int, (1, 64), "N", "value")
    assert (comp.flag, comp.kind, comp.relaunch, comp.choices) == ("--compile", "flag", True, None)
    assert attn.choices == Attention.values() and attn.parse is None

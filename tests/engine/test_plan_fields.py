"""The field table (engine/request/fields.py) is the one declaration of a plan knob: every PlanRequest field a
user sets has a flag from it, the parser the CLI builds has exactly its flags, and the bounds, the wizard's words
and the plain questions come from it."""

from __future__ import annotations

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.checks import check_values
from scaletrain.engine.request.fields import FIELDS, FORM_FIELD, INT_LIMITS, REQUEST_FLAGS
from scaletrain.engine.request.request import PlanRequest
from scaletrain.tui.cli.parser import build_parser, parse_args
from scaletrain.tui.wizard.state import BATCH_FIELDS, form_parser

# PlanRequest fields no flag sets directly: the plan's name (a preset's), the device (from the hardware), and the
# resident models (--resident, repeatable).
NOT_A_FLAG = {"name", "device", "residents"}


def test_every_user_set_request_field_is_declared_once():
    assert set(PlanRequest.field_names()) - set(REQUEST_FLAGS) == NOT_A_FLAG
    assert len({f.name for f in FIELDS}) == len(FIELDS)


def test_the_cli_has_exactly_the_tables_flags():
    options = {o for a in build_parser()._actions for o in a.option_strings}
    declared = {f.flag for f in FIELDS if f.group is not None}
    declared |= {"--no-" + f.flag[2:] for f in FIELDS if f.kind == "flag"}
    assert declared <= options
    assert {o for o in options if o.startswith("--")} - declared == {
        "--help", "--version", "--headless", "--dry-run", "--detach", "--run-dir", "--plain", "--main-process-ip",
        "--save-preset", "--overwrite", "--preset", "--set"}


def test_flags_parse_as_the_table_says():
    args = parse_args(["--lora-targets", "q_proj, v_proj", "--resident", "a/b:8", "--resident", "c/d",
                       "--no-grad-ckpt", "--micro-batch", "3", "--epochs", "1.5"])
    assert args.lora_targets == ("q_proj", "v_proj")
    assert args.resident == [("a/b", 8), ("c/d", 16)]
    assert args.grad_ckpt is False and args.micro_batch == 3 and args.epochs == 1.5


@pytest.mark.parametrize("name", sorted(INT_LIMITS))
def test_bounds_come_from_the_table(name):
    lo, hi = INT_LIMITS[name]
    with pytest.raises(ScaletrainError, match=f"--{name.replace('_', '-')} must be a whole number from {lo} to {hi:,}"):
        check_values(PlanRequest(model="x", **{name: hi + 1}))


def test_the_wizards_batch_fields_and_parsers_come_from_the_table():
    for name in BATCH_FIELDS:
        f = FORM_FIELD[name]
        assert f.label and f.hint
    assert form_parser("seq_len")("2,048") == 2048
    assert form_parser("base_lr")("") is None                      # optional in the form
    with pytest.raises(ScaletrainError, match="sequence length is empty"):
        form_parser("seq_len")("")

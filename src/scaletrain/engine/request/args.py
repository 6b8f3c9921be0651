"""From parsed front-end arguments (an argparse Namespace, or anything with the same attributes) to what the user
asks: PlanRequest fields, TrainOptions, the data and the weights. A preset's fields come first, then `--set`
overrides, then explicit flags; the preset is read once (`Asked`). The flags are declared once, in
`fields.py` (the CLI's argparse wiring derives from it); this module needs no argparse.
"""

from __future__ import annotations


from dataclasses import dataclass, replace
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.fields import REQUEST_FLAGS
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.vocabulary import Loop

@dataclass(frozen=True)
class Asked:
    """What the arguments ask, the preset (if any) read once: PlanRequest fields (the model may be missing), the
    trainer's options, the data spec and the weights the user gave (None: the model's own)."""
    fields: dict[str, Any]
    train: TrainOptions
    data: str | None
    weights_given: str | None
    profile: Any = None             # engine/request/data_profile.DataProfile of --data, when given

    def request(self) -> PlanRequest:
        """The PlanRequest; a model is required."""
        if not self.fields.get("model"):
            raise ScaletrainError("--model is required (a catalog id, a config.json, or --preset NAME)")
        return PlanRequest(**{"gpus": "auto", **self.fields})

    def weights(self, request: PlanRequest) -> dict[str, Any]:
        """The weights a run of this request starts from, as the engine resolves them, with its warning and
        problem (for `plan` output: text and --json)."""
        from scaletrain.engine.request.weights import (resolve_weights, weights_download, weights_problem,
                                                       weights_warning)

        source = resolve_weights(self.weights_given, request.model)
        files, note = weights_download(source)
        out = {"source": source, "default": self.weights_given is None, "warning": weights_warning(source),
               "problem": weights_problem(request.method, request.base_bits, source), "note": note}
        if files is not None:                     # what the launch downloads (only when it downloads)
            out["download"] = files.to_json()
        return out


def asked_from_args(args: Any) -> Asked:
    """Preset fields, then --set overrides, then explicit flags; --data's row count is the dataset size unless one
    is given. Presets (pydantic) load only when --preset is given: `scaletrain plan` stays fast."""
    preset_name = getattr(args, "preset", None)
    overrides = getattr(args, "set", None) or []
    fields: dict[str, Any] = {}
    preset = None
    if preset_name:
        from scaletrain.engine.request.presets import apply_overrides, load_preset

        preset = load_preset(preset_name)
        fields = apply_overrides(preset.request_fields(), overrides)
    elif overrides:
        raise ScaletrainError("--set overrides preset fields; give --preset NAME too")
    for name in REQUEST_FLAGS:
        v = getattr(args, name, None)
        if v is not None:
            fields[name] = v
    if getattr(args, "resident", None):
        fields["residents"] = tuple(args.resident)
    if "seq_len" not in fields and fields.get("model"):
        fields.update(_within_positions(str(fields["model"])))
    train = _train(args, preset, overrides)
    if train.script and not fields.get("loop"):
        # a user script's loop is unknown: plan the safe side, a loop that keeps its outputs through backward
        fields["loop"] = Loop.ACCELERATE_LOOP.value
    data = str(args.data) if getattr(args, "data", None) else (train.dataset if preset_name else None)
    weights = str(args.weights) if getattr(args, "weights", None) else (train.model_source if preset_name else None)
    _fetch_data(data, train)
    _check_records(data, train, fields)
    profile = None
    if data is not None and fields.get("dataset_size") is None:
        from scaletrain.engine.request.data_source import resolve_data

        fields["dataset_size"] = resolve_data(data).rows      # the plan's steps and epochs follow the real data
        if getattr(args, "data", None) and fields.get("model"):
            profile = _profile(data, fields, weights, train)
            if profile.blocks == 0 and "tokens" in profile.data:       # the trainer's refusal, said now
                from scaletrain.engine.request.records import no_blocks

                raise ScaletrainError(no_blocks(resolve_data(data).spec, profile.data["seq_len"], train.packing))
            if profile.blocks and not profile.error:           # the trainer's rows: blocks of seq_len tokens
                from scaletrain.engine.request.data_profile import trained_blocks

                fields["dataset_size"] = trained_blocks(profile.blocks, train.eval_fraction)   # less the eval split
    return Asked(fields, train, data, weights, profile)


def _within_positions(model: str) -> dict[str, int]:
    """{"seq_len": rows} when the model's learned position table holds fewer rows than the default sequence length
    (gpt2's 1024): a default the model cannot run comes down to what it can, and the plan says why (model_notes).
    A length the user gave is never changed (TrainingSetup refuses one past the table). Nothing when the model
    does not resolve: the plan says why, as before."""
    from scaletrain.engine.catalog.architectures import load_model
    from scaletrain.engine.catalog.traced import position_limit

    try:
        limit = position_limit(load_model(model).trace)
    except ScaletrainError:
        return {}
    return {"seq_len": limit} if limit is not None and limit < PlanRequest.seq_len else {}


def _fetch_data(data: str | None, train: TrainOptions) -> None:
    """An HF dataset id not in the cache is downloaded now when the hub can be asked (its rows are the plan's
    dataset size; a progress bar on a terminal): the launch then finds it here (and fetches it on other nodes)."""
    from scaletrain.engine.request.data_source import fetch_dataset, is_hub_dataset

    for spec in (data, train.eval_data):
        if is_hub_dataset(spec):
            fetch_dataset(str(spec))


def _check_records(data: str | None, train: TrainOptions, fields: dict[str, Any]) -> None:
    """--data and --eval-data read and checked as the trainer will for this objective (engine/request/records.py,
    the trainer's reader): a malformed record is the trainer's own line here, at plan time."""
    from scaletrain.engine.request.records import check_data

    from scaletrain.engine.request.options import check_seed

    objective = str(fields.get("objective") or "sft")
    check_seed(train.seed, objective)
    for spec in (data, train.eval_data):
        if spec is not None:
            check_data(spec, objective, train.data_columns)


def _profile(data: str, fields: dict[str, Any], weights: str | None, train: TrainOptions) -> Any:
    """--data read, tokenized and blocked as the trainer will (engine/request/data_profile.py, a subprocess); its
    errors are errors (only a tokenizer missing on this machine is a note, said by the profile)."""
    from scaletrain.engine.request.data_profile import profile_data
    from scaletrain.engine.request.remote_code import check_no_remote_code
    from scaletrain.engine.request.weights import resolve_weights

    seq_len = int(fields.get("seq_len") or 2048)
    source = resolve_weights(weights, fields["model"])
    check_no_remote_code(source)          # before the profile's child loads the tokenizer: an error, not a note
    return profile_data(data, fields["model"], source, seq_len, packing=train.packing, columns=train.data_columns)


def _train(args: Any, preset: Any, overrides: list[str]) -> TrainOptions:
    """The preset's train section with `--set train.KEY=VALUE` overrides (defaults without a preset), then
    --weights and --data."""
    if preset is not None:
        from scaletrain.engine.request.presets import train_options

        train = train_options(preset, overrides)
    else:
        train = TrainOptions()
    if getattr(args, "weights", None):
        train = replace(train, model_source=str(args.weights))
    elif preset is not None and getattr(args, "model", None) and args.model != preset.model:
        train = replace(train, model_source=None)     # a preset's weights belong to its model: the new one's own
    if getattr(args, "data", None):
        train = replace(train, dataset=str(args.data))
    if getattr(args, "data_columns", None):
        train = replace(train, data_columns=dict(args.data_columns))
    if getattr(args, "eval_data", None):
        train = replace(train, eval_data=str(args.eval_data))
    if getattr(args, "eval_fraction", None) is not None:
        train = replace(train, eval_fraction=float(args.eval_fraction))
    if getattr(args, "report_to", None) is not None:
        from scaletrain.engine.request.options import check_report_to

        check_report_to(tuple(args.report_to))
        train = replace(train, report_to=tuple(args.report_to))
    if getattr(args, "max_restarts", None) is not None:
        train = replace(train, max_restarts=int(args.max_restarts))
    if getattr(args, "resume_from", None):
        train = replace(train, resume_from=str(args.resume_from))
    train.check()                      # `plan` refuses what the trainer would (one line), not only --dry-run
    return train

"""The plan's keys in words, from the one field table (fields.py): each field's default (said in the field, or the
PlanRequest / TrainOptions dataclass default), the help a flag shows, and every key a preset or `--set` takes with
its meaning (`scaletrain plan --keys`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scaletrain.engine.request.fields import FIELD, FIELDS, PlanField
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.request import PlanRequest

# Preset keys outside the request and train sections (engine/request/presets.py PresetSchema).
PRESET_TOP_KEYS: tuple[tuple[str, str, str], ...] = (
    ("name", "the preset's name (must match its file name when found by name)", "the file name"),
    ("description", "one line saying what the preset reproduces", "none: required"),
    ("weights", FIELD["weights"].help or "", FIELD["weights"].default or ""),
    ("data", FIELD["data"].help or "", FIELD["data"].default or ""),
)


def _dataclass_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:       # type: ignore[misc]
                return f.default_factory()                          # type: ignore[misc]
    return None


def _words(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value) if value else "none"
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def default_text(f: PlanField) -> str:
    """The field's default in words: what the field says, else its dataclass default."""
    if f.default is not None:
        return f.default
    if f.owner == "request":
        return _words(_dataclass_default(PlanRequest, f.name))
    if f.owner == "train":
        return _words(_dataclass_default(TrainOptions, f.attr or f.name))
    return "none"


def flag_help(f: PlanField) -> str:
    """A flag's help: the field's meaning and its default."""
    meaning = f.help or f.hint or f.label or f.name.replace("_", " ")
    return f"{meaning} (default: {default_text(f)})"


@dataclass(frozen=True)
class PlanKey:
    """One key a preset (or `--set`) takes: where it goes, its meaning, its default, the flag that sets it too."""

    section: str             # "request" | "train" | "" (the preset's top level)
    key: str
    meaning: str
    default: str
    flag: str | None

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "key": self.key, "meaning": self.meaning, "default": self.default,
                "flag": self.flag}


def _field_for(section: str, key: str) -> PlanField | None:
    if section == "request" and key == "residents":
        return FIELD["resident"]
    for f in FIELDS:
        if section == "request" and f.owner == "request" and f.name == key:
            return f
        if section == "train" and f.owner == "train" and (f.attr or f.name) == key:
            return f
    return None


def plan_keys() -> list[PlanKey]:
    """Every key a preset or `--set` takes, in the dataclasses' order; each one's meaning from the field table."""
    out = [PlanKey("", k, meaning, default, f"--{k}" if k in ("weights", "data") else None)
           for k, meaning, default in PRESET_TOP_KEYS]
    for section, cls in (("request", PlanRequest), ("train", TrainOptions)):
        for dc_field in dataclasses.fields(cls):
            f = _field_for(section, dc_field.name)          # every key has one (tests/frontends/test_cli_ecosystem.py)
            if f is None:
                out.append(PlanKey(section, dc_field.name, "", _words(_dataclass_default(cls, dc_field.name)), None))
                continue
            out.append(PlanKey(section, dc_field.name, f.help or f.hint or "", default_text(f),
                               f.flag if f.group is not None else None))
    return out

"""Presets: a named PlanRequest + TrainOptions in YAML, validated with pydantic into one-line errors.

    name: h200x4-fast                 # optional; must match the file name when found by name
    description: one line
    weights: Qwen/Qwen2.5-7B-Instruct | /path/to/folder | random-init   # optional (TrainOptions.model_source)
    data: /path/to/train.jsonl | ORG/DATASET                           # optional (TrainOptions.dataset)
    request: {model: ..., gpus: 4xH200, micro_batch: 16, ...}    # PlanRequest fields
    train: {lr: 3.0e-4, ...}                                        # TrainOptions fields

`weights:` and `data:` are the same TrainOptions fields as `train: model_source:` and `train: dataset:` (kept as
aliases); a preset giving both spellings with different values is refused.

The schemas are generated from the PlanRequest and TrainOptions dataclasses, so a field added there is accepted
here without a second list to keep in sync. Lookup order for a name: ./presets-local/NAME.yaml (saved with
--save-preset), then the bundled presets/NAME.yaml; anything ending in .yaml/.yml or holding a path separator is a
file path.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import reprlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, get_type_hints

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model, field_validator

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.fileio import atomic_write, not_regular, read_text_bounded, writing
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.yamlsafe import MAX_YAML_BYTES, YamlLimitError, load_yaml

LOCAL_DIR_NAME = "presets-local"
PRESET_SUFFIXES = (".yaml", ".yml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SECTIONS = ("request", "train")


def bundled_dir() -> Path:
    import scaletrain.presets as pkg

    return Path(pkg.__file__).parent


def local_dir() -> Path:
    return Path.cwd() / LOCAL_DIR_NAME


# ---- schemas -----------------------------------------------------------------------------------------------------
def _section_model(dc: type, model_name: str) -> type[BaseModel]:
    """A strict-keyed pydantic model with the dataclass's fields, types and defaults."""
    hints = get_type_hints(dc)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()                   # type: ignore[misc]
        else:
            default = ...
        spec[f.name] = (hints[f.name], default)
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **spec)


RequestSchema = _section_model(PlanRequest, "request")
TrainSchema = _section_model(TrainOptions, "train")
_SCHEMAS: dict[str, type[BaseModel]] = {"request": RequestSchema, "train": TrainSchema}


class PresetSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str
    seed: str | None = None             # what the seed guide it reproduces claimed (memory, time), one line
    weights: str | None = None          # → train.model_source
    data: str | None = None             # → train.dataset
    request: RequestSchema      # type: ignore[valid-type]
    train: TrainSchema = TrainSchema()   # type: ignore[valid-type]

    @field_validator("description", "seed")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        if not v or "\n" in v:
            raise ValueError("must be one non-empty line")
        return v


def _short(value: object, limit: int = 80) -> str:
    """repr of a value for a one-line message, cut to `limit` characters (an expanded YAML bomb is gigabytes)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother = 2, 4, 4, limit, limit
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _accepted(loc: tuple) -> list[str]:
    if loc and loc[0] in _SCHEMAS:
        return sorted(_SCHEMAS[loc[0]].model_fields)
    return sorted(PresetSchema.model_fields)


NEAREST_KEYS = 3    # an unknown key names this many near spellings, not every accepted key (a 600-character line)


def nearest_keys(key: str, accepted: Iterable[str]) -> str:
    """ "did you mean a, b?" for the closest accepted spellings, or where the list of keys is."""
    near = difflib.get_close_matches(str(key), list(accepted), n=NEAREST_KEYS, cutoff=0.5)
    return f"did you mean {', '.join(near)}?" if near else "`scaletrain plan --help` lists the plan fields"


def _validation_line(e: ValidationError, where: str, prefix: tuple = ()) -> str:
    errs = e.errors()
    first = errs[0]
    loc = prefix + tuple(first["loc"])
    dotted = ".".join(str(x) for x in loc)
    if first["type"] == "extra_forbidden":
        msg = f"unknown key {dotted!r}; {nearest_keys(loc[-1], _accepted(loc[:-1]))}"
    elif first["type"] == "missing":
        msg = f"{dotted} is required"
    else:
        msg = f"{dotted}: {first['msg'].rstrip('.')} (got {_short(first.get('input'))})"
    more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
    return f"{where}: {msg}{more}"


def _normalize(section: str, data: dict[str, Any]) -> dict[str, Any]:
    """Friendly YAML/--set spellings: "q_proj,v_proj" for lists, "MODEL:BITS" strings for residents."""
    out = dict(data)
    if section == "request":
        if isinstance(out.get("lora_targets"), str):
            out["lora_targets"] = [t.strip() for t in out["lora_targets"].split(",") if t.strip()]
        res = out.get("residents")
        if isinstance(res, str):
            res = [r for r in res.split(",") if r.strip()]
        if isinstance(res, list):
            out["residents"] = [_resident(r) for r in res]
    if section == "train" and isinstance(out.get("script_args"), str):
        out["script_args"] = out["script_args"].split()
    if section == "train" and isinstance(out.get("report_to"), str):
        out["report_to"] = [t.strip() for t in out["report_to"].split(",") if t.strip()]
    return out


def _resident(item: Any) -> Any:
    if isinstance(item, str):
        model, _, bits = item.strip().rpartition(":")
        return [model, int(bits)] if model and bits in ("16", "8", "4") else [item.strip(), 16]
    if isinstance(item, dict) and "model" in item:
        return [item["model"], item.get("bits", 16)]
    return item


def validate_section(section: str, data: dict[str, Any], where: str) -> dict[str, Any]:
    """Validated fields of one section, only the keys given (defaults stay with the dataclass)."""
    try:
        m = _SCHEMAS[section].model_validate(_normalize(section, data))
    except ValidationError as e:
        raise ScaletrainError(_validation_line(e, where, (section,))) from None
    return m.model_dump(exclude_unset=True)


# ---- presets -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    path: Path
    request: dict[str, Any]          # validated PlanRequest fields the preset sets
    train_fields: dict[str, Any]     # validated TrainOptions fields the preset sets
    seed: str | None = None          # what the seed guide it reproduces claimed, one line (None: no seed)

    def request_fields(self) -> dict[str, Any]:
        """Keyword arguments for PlanRequest; the plan is named after the preset unless it says otherwise."""
        d = dict(self.request)
        d.setdefault("name", self.name)
        return d

    @property
    def train(self) -> TrainOptions:
        return TrainOptions(**self.train_fields)

    @property
    def hardware(self) -> str:
        gpus = str(self.request.get("gpus", "auto"))
        nodes = self.request.get("nodes")
        return f"{nodes}x{gpus}" if nodes and nodes > 1 and gpus.count("x") < 2 else gpus

    @property
    def model(self) -> str:
        return str(self.request["model"])

    @property
    def source(self) -> str:
        if self.path.parent == bundled_dir():
            return "bundled"
        return "local" if self.path.parent == local_dir() else str(self.path)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "hardware": self.hardware, "model": self.model,
                "source": self.source, "path": str(self.path)}


def _is_path(spec: str) -> bool:
    return spec.endswith(PRESET_SUFFIXES) or os.sep in spec or (os.altsep is not None and os.altsep in spec)


def _search_dirs() -> list[Path]:
    return [local_dir(), bundled_dir()]


def preset_names() -> list[str]:
    names: set[str] = set()
    for d in _search_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.iterdir() if p.suffix in PRESET_SUFFIXES and p.is_file())
    return sorted(names)


MAX_PRESET_SPEC_CHARS = 4096


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):       # a name too long for the filesystem, a NUL byte
        return False


def find_preset(spec: str) -> Path:
    if not spec or not spec.strip():
        raise ScaletrainError("--preset is empty; give a preset name (scaletrain presets) or a .yaml path")
    spec = spec.strip()
    if len(spec) > MAX_PRESET_SPEC_CHARS:
        raise ScaletrainError(f"--preset is {len(spec):,} characters long; give a preset name or a .yaml path")
    if _is_path(spec):
        p = Path(spec).expanduser()
        if not _is_file(p):
            problem = not_regular(p, "preset file")        # a FIFO, a device: said as such
            if problem and not p.is_dir():
                raise ScaletrainError(problem)
            raise ScaletrainError(f"preset file {_short(spec)} " + ("is not a file" if p.is_dir() else
                                                                    "does not exist"))
        return p
    for d in _search_dirs():
        for suffix in PRESET_SUFFIXES:
            p = d / f"{spec}{suffix}"
            if _is_file(p):
                return p
    names = preset_names()
    folded = {n.casefold(): n for n in names}
    if spec.casefold() in folded:            # names are case-insensitive: H200x4-Fast is h200x4-fast
        return find_preset(folded[spec.casefold()])
    near = difflib.get_close_matches(spec.casefold(), list(folded), n=1, cutoff=0.6)
    hint = f"did you mean {folded[near[0]]}? " if near else ""
    raise ScaletrainError(f"unknown preset {_short(spec)}; {hint}available: {', '.join(names) or 'none'} "
                          "(see `scaletrain presets`), or give a path to a .yaml file")


def load_preset_file(path: Path, *, by_name: bool = False) -> Preset:
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise ScaletrainError(f"preset file {path} is {path.stat().st_size:,} bytes; a preset is a few KiB "
                                  f"(at most {MAX_YAML_BYTES >> 10} KiB)")
        text = read_text_bounded(path, MAX_YAML_BYTES, "preset file")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        raise ScaletrainError(f"cannot read preset file {path} ({why})") from None
    try:
        data = load_yaml(text)
    except YamlLimitError as e:
        raise ScaletrainError(f"preset file {path} is refused: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or e.__class__.__name__
        raise ScaletrainError(f"preset file {path} is not valid YAML{where} ({problem})") from None
    if not isinstance(data, dict):
        raise ScaletrainError(f"preset file {path} must be a mapping with description, request and train")
    for section in SECTIONS:
        if isinstance(data.get(section), dict):
            data[section] = _normalize(section, data[section])
    try:
        m = PresetSchema.model_validate(data)
    except ValidationError as e:
        raise ScaletrainError(_validation_line(e, f"preset file {path}")) from None
    name = m.name or path.stem
    if by_name and name != path.stem:
        raise ScaletrainError(f"preset file {path} says name {name!r}; rename the file or the name to match")
    train_fields = m.train.model_dump(exclude_unset=True)
    for key, field in (("weights", "model_source"), ("data", "dataset")):
        value = getattr(m, key)
        if value is None:
            continue
        if train_fields.get(field) not in (None, value):
            raise ScaletrainError(f"preset file {path}: {key} {value!r} and train.{field} {train_fields[field]!r} "
                                  f"disagree; give {key} only")
        train_fields[field] = value
    return Preset(name=name, description=m.description, path=path,
                  request=m.request.model_dump(exclude_unset=True), train_fields=train_fields, seed=m.seed)


def load_preset(name_or_path: str) -> Preset:
    """A preset by name (./presets-local, then bundled; any letter case) or by .yaml path, validated."""
    path = find_preset(name_or_path)
    return load_preset_file(path, by_name=not _is_path(name_or_path.strip()))


def list_presets() -> list[Preset]:
    """Every preset visible from here: local ones first shadow bundled ones of the same name."""
    seen: dict[str, Preset] = {}
    for d in _search_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix in PRESET_SUFFIXES and p.is_file() and p.stem not in seen:
                seen[p.stem] = load_preset_file(p, by_name=True)
    return [seen[k] for k in sorted(seen)]


# ---- --set overrides ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _field_names(section: str) -> frozenset[str]:
    return frozenset(_SCHEMAS[section].model_fields)


def split_override_key(key: str) -> tuple[str, str]:
    """`micro_batch` / `request.micro_batch` → request; `train.lr` (or a bare train-only name like `lr`) → train."""
    sec, dot, name = key.partition(".")
    if dot:
        if sec not in SECTIONS:
            raise ScaletrainError(f"--set {key}: unknown section {sec!r}; use request.KEY, train.KEY or a bare KEY")
    else:
        name = key
        sec = "request" if name in _field_names("request") else "train" if name in _field_names("train") else ""
    if not sec or name not in _field_names(sec):
        names = _field_names(sec) if sec else _field_names("request") | _field_names("train")
        raise ScaletrainError(f"--set {key}: unknown key; {nearest_keys(name, names)} (a bare KEY, request.KEY or "
                              "train.KEY)")
    return sec, name


def _parse_value(raw: str) -> Any:
    """YAML scalars (numbers, true/false, null, lists); anything YAML cannot read stays a string."""
    try:
        return load_yaml(raw)
    except YamlLimitError as e:
        raise ScaletrainError(f"--set value {raw[:40]!r}{'…' if len(raw) > 40 else ''} is refused: {e}") from None
    except yaml.YAMLError:
        return raw


def _check_value(section: str, name: str, value: Any) -> None:
    """Type-check one override of the other section now, so a bad `--set train.lr=x` fails in `plan` too."""
    ann = _SCHEMAS[section].model_fields[name].annotation
    try:
        TypeAdapter(ann).validate_python(_normalize(section, {name: value})[name])
    except ValidationError as e:
        first = e.errors()[0]
        raise ScaletrainError(f"--set: {section}.{name}: {first['msg'].rstrip('.')} (got {_short(value)})") from None


def apply_overrides(fields: dict[str, Any], overrides: Iterable[str] | None, section: str = "request") -> dict[str, Any]:
    """Apply `--set KEY=VALUE` items that belong to `section` to its fields and validate the result.

    Every item's key is checked (an unknown key is an error whichever section is being built); items of the other
    section are left for its own call, so `--set train.lr=1e-4` reaches TrainOptions and not PlanRequest.
    """
    if section not in SECTIONS:
        raise ValueError(f"section must be one of {SECTIONS}")
    out = dict(fields)
    changed = False
    for sec, name, value in _override_items(overrides):
        if sec == section:
            out[name] = value
            changed = True
        else:
            _check_value(sec, name, value)
    if not changed:
        return out
    return validate_section(section, out, "--set")


def _override_items(overrides: Iterable[str] | None) -> Iterator[tuple[str, str, Any]]:
    """(section, key, value) of each `--set KEY=VALUE` item, its key checked and its value read as YAML."""
    for item in overrides or ():
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScaletrainError(f"--set expects KEY=VALUE, e.g. micro_batch=4 or train.lr=1e-4 (got {item!r})")
        sec, name = split_override_key(key)
        yield sec, name, _parse_value(raw.strip())


def override_changes(overrides: Iterable[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items as a relaunch's changes (engine/launch/relaunch.py): plan fields by name, trainer
    options as train.<name>, each value type-checked as a preset's is."""
    out: dict[str, Any] = {}
    for sec, name, value in _override_items(overrides):
        _check_value(sec, name, value)
        out[name if sec == "request" else f"train.{name}"] = value
    return out


def apply_train_overrides(train: TrainOptions, overrides: Iterable[str] | None) -> TrainOptions:
    """TrainOptions with `--set train.KEY=VALUE` (or bare train-only keys) applied and validated."""
    return TrainOptions.from_json(apply_overrides(train.to_json(), overrides, "train"))


def train_options(preset: Preset | None, overrides: Iterable[str] | None = ()) -> TrainOptions:
    """The trainer's options: the preset's train section, then `--set train.*` overrides."""
    base = dict(preset.train_fields) if preset is not None else {}
    return TrainOptions(**apply_overrides(base, overrides, "train"))


# ---- saving ------------------------------------------------------------------------------------------------------
def _pinned_request(request: PlanRequest, plan: Any | None) -> dict[str, Any]:
    """The request as YAML-ready fields; with a plan, the planner's choices are pinned so a replay is identical."""
    req = request
    if plan is not None:
        s = plan.setup
        req = request.with_(gpus=s.hardware.describe(), nodes=None, effective_batch=s.effective_batch,
                            device=s.device, **plan.pins())
    defaults = {f.name: f.default for f in dataclasses.fields(PlanRequest)}
    out: dict[str, Any] = {}
    for k, v in req.to_json().items():
        if v is None and defaults.get(k) is None:
            continue
        out[k] = v
    if out.get("residents"):
        out["residents"] = [f"{m}:{b}" for m, b in out["residents"]]
    else:
        out.pop("residents", None)
    return out


def save_preset(name: str, request: PlanRequest, train: TrainOptions, path: str | os.PathLike[str] | None = None,
                *, plan: Any | None = None, description: str | None = None) -> Path:
    """Write a preset YAML (default ./presets-local/NAME.yaml); returns where it went (see write_preset)."""
    return write_preset(name, request, train, path, plan=plan, description=description)[0]


def write_preset(name: str, request: PlanRequest, train: TrainOptions, path: str | os.PathLike[str] | None = None,
                 *, plan: Any | None = None, description: str | None = None) -> tuple[Path, Path | None]:
    """save_preset, also returning the backup of a different file it replaced (None when there was none).

    The document is validated before anything is written; an existing different file is copied to .bak first.
    """
    if not _NAME_RE.match(name or ""):
        raise ScaletrainError(f"preset name {name!r} is not accepted; use letters, digits, '.', '_' or '-'")
    if path is None:
        if (bundled_dir() / f"{name}.yaml").exists():
            raise ScaletrainError(f"{name!r} is a bundled preset; save under another name")
        target = local_dir() / f"{name}.yaml"
    else:
        target = Path(path).expanduser()
        if target.is_dir():
            target = target / f"{name}.yaml"
        elif target.suffix not in PRESET_SUFFIXES:
            raise ScaletrainError(f"--save-preset path {path} must end in .yaml or be a folder")
    req = _pinned_request(request.with_(name=name), plan)
    desc = description or f"{req['model']} on {req.get('gpus', 'auto')}, saved from {request.name!r}"
    train_doc = train.to_json()
    doc = {"name": name, "description": desc, "weights": train_doc.pop("model_source"),
           "data": train_doc.pop("dataset"), "request": req, "train": train_doc}
    doc = {k: v for k, v in doc.items() if v is not None}
    try:
        PresetSchema.model_validate(doc)
    except ValidationError as e:
        raise ScaletrainError(_validation_line(e, f"preset {name!r}")) from None
    text = (f"# saved by scaletrain --save-preset; replay with: scaletrain --preset {name} --headless\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
    with writing(f"preset {target}"):
        backup = atomic_write(target, text, backup=True)
    return target, backup

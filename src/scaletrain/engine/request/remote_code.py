"""Weights that would run code (issue 29): nothing from a model folder is ever executed.

transformers runs a model folder's own Python when its config.json, tokenizer_config.json or processor config names
custom code (`auto_map`) and the caller says trust_remote_code=True, or, with the default, after asking "run the
custom code? [y/N]" on stdin. scaletrain passes trust_remote_code=False everywhere and gives its children no stdin,
and it refuses such weights before anything loads them, in one line, with this check: the files are read as JSON
(bounded, regular files only), never imported. A config.json whose model_type the installed transformers does not
know is refused too: only custom code could build it. The plan can still count such a model from its config.json
(--model); only starting from its weights is refused.

    remote_code_problem(source)    one line when the weights at `source` need custom code, else None
    check_no_remote_code(source)   the same as a ScaletrainError
    known_model_types()            the model types the installed transformers builds natively (its own table, read
                                   as source text: transformers is not imported here), or None when unreadable
"""

from __future__ import annotations

import ast
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_CONFIG_BYTES, read_text_bounded

# The files transformers' Auto classes read an `auto_map` from (configuration, tokenizer, processor, image processor).
CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
# transformers' own table of model_type → config class: generated (5.x) or in configuration_auto (4.x)
_MAPPING_SOURCES = ("models/auto/auto_mappings.py", "models/auto/configuration_auto.py")
_MAPPING_NAME = "CONFIG_MAPPING_NAMES"
ACCEPTED = ("give the weights of an architecture transformers builds itself (a save_pretrained folder without "
            "auto_map), or random-init")


def _folder(source: str) -> Path | None:
    """The folder holding the weights' config files: a local folder (or a file in it), or the HF cache snapshot of
    an id; None when neither is on this machine (nothing here can run then)."""
    p = Path(source).expanduser()
    try:
        if p.exists():
            return p if p.is_dir() else p.parent
    except (OSError, ValueError):
        return None
    from scaletrain.engine.catalog.hub import HF_ID, cached_file

    if not HF_ID.match(source):
        return None
    for name in CODE_FILES:
        hit = cached_file(source, name)
        if hit is not None:
            return hit.parent
    return None


def _read(path: Path, source: str) -> object:
    try:
        return json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, f"--weights {source}:"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        raise ScaletrainError(f"--weights {source}: {path.name} cannot be read as JSON ({why}); give a "
                              "save_pretrained folder") from None


def remote_code_problem(source: str | None) -> str | None:
    """One line when the weights at `source` name custom code or an architecture transformers does not know."""
    if not source or source == "random-init":
        return None
    folder = _folder(source)
    if folder is None:
        return None
    shown = source if len(source) <= 160 else source[:160] + "…"
    try:
        docs = {name: _read(folder / name, shown) for name in CODE_FILES if _exists(folder / name)}
    except ScaletrainError as e:
        return str(e)
    for name, doc in docs.items():
        if isinstance(doc, dict) and "auto_map" in doc:
            return (f"--weights {shown}: {name} names custom code (auto_map), which scaletrain never runs; "
                    f"{ACCEPTED}")
    cfg = docs.get("config.json")
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    known = known_model_types()
    if isinstance(cfg, dict) and known is not None and model_type not in known:
        what = f"model_type {str(model_type)[:60]!r}" if model_type is not None else "no model_type"
        return (f"--weights {shown}: config.json has {what}, which the installed transformers does not build "
                f"(only custom code could, and scaletrain never runs it); {ACCEPTED}")
    return None


def check_no_remote_code(source: str | None) -> None:
    """remote_code_problem as a ScaletrainError (one line, exit 2)."""
    problem = remote_code_problem(source)
    if problem:
        raise ScaletrainError(problem)


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):
        return False


@lru_cache(maxsize=1)
def known_model_types() -> frozenset[str] | None:
    """The model types transformers' AutoConfig maps to its own config classes, read from the installed package's
    source as a literal (ast: nothing is imported or run); None when transformers is absent or its table moved."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    types: set[str] = set()
    for rel in _MAPPING_SOURCES:
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        types |= _mapping_keys(tree)
    return frozenset(types) if len(types) > 50 else None


def _mapping_keys(tree: ast.AST) -> set[str]:
    """Keys of `CONFIG_MAPPING_NAMES = OrderedDict([(k, v), ...] or **{k: v}, k=v)` and of
    `CONFIG_MAPPING_NAMES.update({k: v})`, wherever they are assigned."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == _MAPPING_NAME
                                                for t in node.targets):
            value = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == _MAPPING_NAME):
            value = node
        if isinstance(value, ast.Call):
            keys |= {kw.arg for kw in value.keywords if kw.arg}
            for part in [*value.args, *(kw.value for kw in value.keywords if kw.arg is None)]:
                keys |= _literal_keys(part)
    return keys


def _literal_keys(node: ast.expr) -> set[str]:
    """The string keys of a dict literal, or the first items of a list of pairs; nothing for anything else."""
    try:
        literal = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return set()
    items = literal.keys() if isinstance(literal, dict) else [kv[0] for kv in literal
                                                               if isinstance(kv, tuple) and kv] \
        if isinstance(literal, list) else []
    return {k for k in items if isinstance(k, str)}

"""Traced model families: what the engine knows of a model_type that has no analytic layout, measured once.

A model_type outside the analytic table (catalog/architectures.py `_FAMILIES`) is not assumed to be laid out like
any other: `python -m scaletrain.trainer.trace` (torch) builds it and answers in JSON (see that module) with
  - its structure: exact parameter count, embedding/head sizes, one block's nn.Linear shapes, tensors and norms;
  - per regime (method, LoRA rank/targets, dtypes, attention kernel), what a 2-layer slice at the real widths
    saves for backward, per block half, fitted as c0 + c1·S + c2·S².
The answers are cached as JSON, one file per (config, regime, scaletrain/transformers/torch versions), under
$SCALETRAIN_CACHE, else $XDG_CACHE_HOME/scaletrain/traces, else ~/.cache/scaletrain/traces, written atomically.
A cache hit runs no subprocess and imports no torch, so planning stays fast after the first trace.

This module is torch-free and imports nothing of the engine's model (architectures.py imports it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Mapping

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write

# Must match trainer/trace.py TRACE_FORMAT: a cached answer of another format is traced again.
TRACE_FORMAT = 1
# A trace imports transformers (~10 s on a loaded 2-core machine) and builds a slice at the real widths (a
# 9B model's two layers: a few seconds more); anything past this is stuck.
TRACE_TIMEOUT_S = 600
MAX_ERROR_CHARS = 300
# model configs traced (a subprocess ran) in this process, by cache key of their structure: `source()` says
# "traced" for these and "traced (cached)" for the rest
_RAN: set[str] = set()


def cache_dir() -> Path:
    env = os.environ.get("SCALETRAIN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "scaletrain" / "traces"


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("scaletrain", "transformers", "torch", "peft"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def cache_key(config: Mapping[str, Any], regime: Mapping[str, Any] | None) -> str:
    text = json.dumps({"format": TRACE_FORMAT, "config": dict(config), "regime": dict(regime) if regime else None,
                       "versions": _versions()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(config: Mapping[str, Any], key: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(config.get("model_type", "model")))
    return cache_dir() / f"{safe[:60]}-{key}.json"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("format") == TRACE_FORMAT else None


def _fail(model_type: str, why: str, accepted: str) -> ScaletrainError:
    head = f"model_type {model_type[:40]!r} has no analytic layout and could not be traced ("
    tail = f"); accepted: {accepted}, or a model_type transformers can build with the 'train' extra"
    room = MAX_ERROR_CHARS - len(head) - len(tail)
    why = " ".join(why.split())
    if len(why) > room:
        why = why[:max(room - 1, 0)] + "…"
    return ScaletrainError((head + why + tail)[:MAX_ERROR_CHARS])


def _describe(regime: Mapping[str, Any]) -> str:
    windowed = ", windowed" if regime.get("windowed") else ""
    return f"{regime.get('method')}, {regime.get('precision')}, {regime.get('attn')}{windowed}"


def _run_trace(config: Mapping[str, Any], regime: Mapping[str, Any] | None, accepted: str,
               regimes: list | None = None) -> dict[str, Any]:
    model_type = str(config.get("model_type", "?"))
    if find_spec("torch") is None or find_spec("transformers") is None:
        raise _fail(model_type, "torch/transformers are not installed: install the 'train' extra", accepted)
    body: dict[str, Any] = {"config": dict(config), "regime": dict(regime) if regime else None}
    if regimes:
        body["regimes"] = [dict(r) for r in regimes]
    request = json.dumps(body)
    what = "" if regime is None else f" ({_describe(regime)})"
    what += f" ({'; '.join(_describe(r) for r in regimes)})" if regimes else ""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "scaletrain.trainer.trace"], input=request,
                              capture_output=True, text=True, timeout=TRACE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise _fail(model_type, f"the trace ran past {TRACE_TIMEOUT_S} s", accepted) from None
    except OSError as e:
        raise _fail(model_type, f"cannot start {sys.executable}: {e.strerror or e}", accepted) from None
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        raise _fail(model_type, lines[-1] if lines else f"the trace exited {proc.returncode}", accepted)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise _fail(model_type, "the trace printed no JSON answer", accepted) from None
    print(f"tracing {model_type}{what} … {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return data


def trace(config: Mapping[str, Any], regime: Mapping[str, Any] | None, accepted: str) -> tuple[dict, bool]:
    """The trace answer for `config` (+ `regime`), and whether it came from the cache."""
    key = cache_key(config, regime)
    path = _cache_path(config, key)
    hit = _read(path)
    if hit is not None and (regime is None or "activations" in hit):
        return hit, True
    data = _run_trace(config, regime, accepted)
    if data.get("format") != TRACE_FORMAT or "structure" not in data:
        raise _fail(str(config.get("model_type")), "the trace answered in another format", accepted)
    _RAN.add(cache_key(config, None))
    _store(config, regime, data)
    if regime is not None:           # the structure is in every answer: cache it too
        _store(config, None, {k: data[k] for k in ("format", "model_type", "structure") if k in data})
    return data, False


def _store(config: Mapping[str, Any], regime: Mapping[str, Any] | None, data: Mapping[str, Any]) -> None:
    try:
        atomic_write(_cache_path(config, cache_key(config, regime)), json.dumps(data, sort_keys=True), backup=False)
    except (OSError, ScaletrainError):
        pass      # an unwritable cache costs a trace next time, not this plan


def prefetch(config: Mapping[str, Any], regimes: list[Mapping[str, Any]], accepted: str,
             runner: Callable[[dict], dict] | None = None) -> int:
    """Trace the structure and every regime not cached yet in ONE subprocess (one transformers import), and cache
    them; returns how many regimes were traced. For a planner or a benchmark that knows its regimes up front.
    `runner`: trainer/trace.py's `run`, called in this process instead (a caller that has imported torch anyway)."""
    missing = [r for r in regimes if _read(_cache_path(config, cache_key(config, r))) is None]
    if not missing:
        return 0
    if runner is None:
        data = _run_trace(config, None, accepted, regimes=missing)
    else:
        data = runner({"config": dict(config), "regimes": [dict(r) for r in missing]})
    answers = data.get("activations_by_regime")
    if not isinstance(answers, list) or len(answers) != len(missing):
        raise _fail(str(config.get("model_type")), "the trace answered in another format", accepted)
    _RAN.add(cache_key(config, None))
    head = {k: data[k] for k in ("format", "model_type", "structure") if k in data}
    _store(config, None, head)
    for regime, act in zip(missing, answers):
        _store(config, regime, {**head, "activations": act})
    return len(missing)


def structure(config: Mapping[str, Any], accepted: str) -> dict[str, Any]:
    """The real model's parameters and one block's modules (regime-free)."""
    return trace(config, None, accepted)[0]["structure"]


def activations(config: Mapping[str, Any], regime: Mapping[str, Any], accepted: str) -> dict[str, Any]:
    """What a slice saves for backward in `regime` (trainer/trace.py's `activations` answer)."""
    return trace(config, regime, accepted)[0]["activations"]


def source(config: Mapping[str, Any]) -> str:
    """"traced" when this process ran the trace, "traced (cached)" when every answer came from the cache."""
    return "traced" if cache_key(config, None) in _RAN else "traced (cached)"


def pattern_period(types: list) -> int:
    """Smallest period of a layer_types list (the whole list when it has none shorter)."""
    n = len(types)
    for p in range(1, n + 1):
        if all(types[i] == types[i % p] for i in range(n)):
            return p
    return n


def slice_layers(config: Mapping[str, Any]) -> int:
    """Decoder layers of the traced slice: a first layer (which also receives the embedding's output and the
    rotary tables), then one of each position in the layer_types pattern, or one more layer without one."""
    types = config.get("layer_types")
    return 1 + pattern_period(list(types)) if isinstance(types, list) and types else 2


def at(coeffs: list[int] | tuple[int, ...], batch: int, seq_len: int) -> int:
    """Bytes of a fitted term c0 + c1·S + c2·S² (traced at micro-batch 1) for `batch` sequences of `seq_len`:
    the per-token and per-S² parts scale with the batch, the constant does not."""
    c0, c1, c2 = (int(x) for x in coeffs)
    return c0 + batch * (c1 * seq_len + c2 * seq_len * seq_len)

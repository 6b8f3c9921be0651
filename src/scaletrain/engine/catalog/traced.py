"""Traced model families: what the engine knows of a model_type that has no analytic layout, measured once.

A model_type outside the analytic table (catalog/architectures.py `_FAMILIES`) is not assumed to be laid out like
any other: measure/trace.py (torch) builds it and answers in JSON (see that module) with
  - its structure: exact parameter count, embedding/head sizes, its decoder layers grouped into kinds by their
    module tree (dense or MoE, mamba or attention, sliding or full), each kind's count, parameters and linears;
  - per regime (method, LoRA rank/targets, dtypes, attention kernel, checkpointing), what a slice holding one layer
    of each kind saves for backward and how far live memory rises while each kind runs forward and backward,
    fitted as c0 + c1·S + c2·S² with non-negative coefficients and checked at a fourth length;
  - peft's own LoRA count for the run's targets.
All of it comes from one `python -m scaletrain.measure.probe trace --serve` process per planning process (transformers
imported once). The answers are cached as JSON, one file per (config, regime, scaletrain/transformers/torch/peft
versions), under $SCALETRAIN_CACHE, else $XDG_CACHE_HOME/scaletrain/traces, else ~/.cache/scaletrain/traces, written
atomically. A cache hit starts no process and imports no torch, so planning stays fast after the first trace.

This module is torch-free and imports nothing of the engine's model (architectures.py imports it).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Mapping

from scaletrain.engine.dist_versions import installed_version
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.probes import TRACE_FORMAT, probe_argv   # a cached answer of another format: traced again
from scaletrain.engine.probes import TRACE_OUT_OF_MEMORY      # a served answer: out of memory at its cap

# A trace imports transformers (~10 s on a loaded 2-core machine) and builds a slice at the real widths (a
# 9B model's two layers: a few seconds more); anything past this is stuck.
TRACE_TIMEOUT_S = 600
# A kernel chunk a config names up to this length is a scan's tile the trace lengths are multiples of (mamba2's
# chunk_size); a longer one is an attention chunk (llama4's attention_chunk_size), traced as a short window when
# the planned sequences exceed it (measure/trace.py).
MAX_GRANULE = 1024
# The gated delta rule's torch kernel pads every sequence to a multiple of its 64-token chunk
# (transformers/models/qwen3_next/modeling_qwen3_next.py torch_chunk_gated_delta_rule(chunk_size=64)); 64 is also a
# multiple of every smaller power-of-two tile.
BASE_GRANULE = 64
# The longest trace length is under this many granules (measure/trace_structure.py TRACE_MULTIPLES, + a residue)
LENGTHS_PER_GRANULE = 5
# config.json's spellings of the positions a model has learned embeddings for (a longer sequence cannot run)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")
MAX_ERROR_CHARS = 480
MAX_REASON_CHARS = 240      # of it, why the trace failed (transformers' own words can run to thousands)
# model configs traced (a subprocess ran) in this process, by cache key of their structure: `source()` says
# "traced" for these and "traced (cached)" for the rest
_RAN: set[str] = set()
# One trace at a time per planning process: the trace process answers its pipe in order, and the wizard plans from
# threads (a solve per keystroke; the model step's warm-up). Two threads asking at once read each other's answers
# ("the trace answered in another format", or a regime's bytes filed under another's key). Held from the cache check
# to the cache write, so a thread that waited finds the answer cached instead of tracing it again.
_LOCK = threading.RLock()


def _one_at_a_time(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)
    return locked


# the trace running now: (what, time.monotonic() at its start), for a front end to say why a plan waits
_ACTIVE: tuple[str, float] | None = None


def cache_dir() -> Path:
    env = os.environ.get("SCALETRAIN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "scaletrain" / "traces"


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str | None]:
    return {dist: installed_version(dist) for dist in ("scaletrain", "transformers", "torch", "peft")}


def cache_key(config: Mapping[str, Any], regime: Mapping[str, Any] | None) -> str:
    text = json.dumps({"format": TRACE_FORMAT, "config": dict(config), "regime": dict(regime) if regime else None,
                       "versions": _versions()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(config: Mapping[str, Any], key: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(config.get("model_type", "model")))
    return cache_dir() / f"{safe[:60]}-{key}.json"


# answers read or written by this process, by cache file: a planner reads the same few thousands of times
_MEMO: dict[str, dict[str, Any]] = {}


def _read(path: Path) -> dict[str, Any] | None:
    hit = _MEMO.get(str(path))
    if hit is not None:
        return hit
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(data, dict) and data.get("format") == TRACE_FORMAT):
        return None
    _MEMO[str(path)] = data
    return data


def _fail(model_type: str, why: str, accepted: str) -> ScaletrainError:
    """One line: why the trace failed gets the room first (the slice's size and the limit, transformers' own
    words), then what is accepted, cut if it must be (a 300-character cap left the reason 70: "the 4-layer slice
    of qwen3_next that holds each …")."""
    head = f"model_type {model_type[:40]!r} has no analytic layout and could not be traced ("
    tail = f"); accepted: {accepted} (analytic), or a model_type the trace measures (docs/accuracy.md lists them)"
    why = " ".join(why.split())
    if len(why) > MAX_REASON_CHARS:
        why = why[:MAX_REASON_CHARS - 1] + "…"
    line = head + why + tail
    return ScaletrainError(line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 1] + "…")


def _describe(regime: Mapping[str, Any]) -> str:
    extra = "".join(f", {word}" for key, word in (("grad_ckpt", "checkpointed"), ("windowed", "windowed"),
                                                  ("chunked", "chunked"), ("loss", "chunked loss")) if regime.get(key))
    return f"{regime.get('method')}, {regime.get('precision')}, {regime.get('attn')}{extra}"


class _Worker:
    """The one `python -m scaletrain.measure.probe trace --serve` process of this planning process: transformers is
    imported once, whatever a plan traces (structure, regimes, LoRA counts). Ended when this process exits."""

    proc: subprocess.Popen | None = None
    errors: Any = None

    @_one_at_a_time          # one question and its answer at a time on the pipe
    def ask(self, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        import selectors

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout_s)
        sel.close()
        if not ready:
            self.stop()
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=10)
            raise ChildProcessError(self._last_error() or f"the trace process exited {code}")
        return json.loads(line)

    def _start(self) -> None:
        import tempfile

        self.errors = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.proc = subprocess.Popen(probe_argv("trace", "--serve"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True,
                                     encoding="utf-8", bufsize=1)

    def _last_error(self) -> str:
        """The exception a dead trace process printed last (its warnings are not the reason it died)."""
        try:
            self.errors.seek(0)
            lines = [x for x in self.errors.read().splitlines() if x.strip()]
        except (OSError, ValueError):
            return ""
        errors = [x for x in lines if "Error" in x or "Exception" in x or x.startswith("Killed")]
        return errors[-1] if errors else ""

    def stop(self, now: bool = False) -> None:
        """End the trace process: after its answer (stdin closed), or `now` (terminated mid-trace)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if now:
                proc.terminate()
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


_WORKER = _Worker()
# at exit nobody reads an answer: a trace under way is ended, not waited for (Ctrl-C on a first plan waited 5 s)
atexit.register(_WORKER.stop, now=True)


def _run_trace(config: Mapping[str, Any], regime: Mapping[str, Any] | None, accepted: str,
               regimes: list | None = None, question: Mapping[str, Any] | None = None) -> dict[str, Any]:
    model_type = str(config.get("model_type", "?"))
    if not isinstance(config.get("model_type"), str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,63}", model_type):
        # transformers' model types are lower-case identifiers: anything else cannot be built, said without
        # starting the trace process (torch's import alone takes seconds)
        raise _fail(model_type, "no model_type transformers could know", accepted)
    if find_spec("torch") is None or find_spec("transformers") is None:
        raise _fail(model_type, "torch/transformers are not installed: install the 'train' extra", accepted)
    body: dict[str, Any] = {"config": dict(config), "regime": dict(regime) if regime else None}
    if regimes:
        body["regimes"] = [dict(r) for r in regimes]
    body.update(question or {})          # a peft question: {"lora_targets": …} or {"peft_refuses": …}
    what = "" if regime is None else f" ({_describe(regime)})"
    what += f" ({'; '.join(_describe(r) for r in regimes)})" if regimes else ""
    t0 = time.perf_counter()
    global _ACTIVE
    _ACTIVE = (f"{model_type}{what}", time.monotonic())
    try:
        answer = _WORKER.ask(body, TRACE_TIMEOUT_S)
    except TimeoutError:
        raise _fail(model_type, f"the trace ran past {TRACE_TIMEOUT_S} s", accepted) from None
    except ChildProcessError as e:
        raise _fail(model_type, str(e), accepted) from None
    except OSError as e:
        raise _fail(model_type, f"cannot start {sys.executable}: {e.strerror or e}", accepted) from None
    except ValueError:
        raise _fail(model_type, "the trace printed no JSON answer", accepted) from None
    finally:
        _ACTIVE = None
    if not isinstance(answer, dict) or "ok" not in answer:
        why = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(answer, dict) and answer.get("code") == TRACE_OUT_OF_MEMORY:   # at its cap: the process ends
            _WORKER.stop()
        raise _fail(model_type, str(why or "the trace answered in another format"), accepted)
    print(f"tracing {model_type}{what} … {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return answer["ok"]


# (id of the config, the regime, where the cache is) → (the config, its answer): a planner asks the same few answers
# hundreds of times, and hashing the whole config for each took most of a cached traced plan. The config (a
# ModelArch's read-only mapping) is kept in the entry, so its id is not reused while the entry lives.
_HOT: dict[tuple[int, str, tuple[str | None, ...]], tuple[Mapping[str, Any], dict]] = {}


def trace(config: Mapping[str, Any], regime: Mapping[str, Any] | None, accepted: str) -> tuple[dict, bool]:
    """The trace answer for `config` (+ `regime`), and whether it came from the cache."""
    hot_key = (id(config), json.dumps(regime, sort_keys=True, default=str),
               tuple(os.environ.get(k) for k in ("SCALETRAIN_CACHE", "XDG_CACHE_HOME", "HOME")))
    hot = _HOT.get(hot_key)
    if hot is not None and hot[0] is config:
        return hot[1], True
    data, cached = _trace(config, regime, accepted)
    _HOT[hot_key] = (config, data)
    return data, cached


@_one_at_a_time
def _trace(config: Mapping[str, Any], regime: Mapping[str, Any] | None, accepted: str) -> tuple[dict, bool]:
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
        _store_lora(config, regime, data.get("activations") or {})
    return data, False


def _store(config: Mapping[str, Any], regime: Mapping[str, Any] | None, data: Mapping[str, Any]) -> None:
    path = _cache_path(config, cache_key(config, regime))
    _MEMO[str(path)] = dict(data)
    try:
        atomic_write(path, json.dumps(data, sort_keys=True), backup=False)
    except (OSError, ScaletrainError):
        pass      # an unwritable cache costs a trace next time, not this plan


@_one_at_a_time
def prefetch(config: Mapping[str, Any], regimes: list[Mapping[str, Any]], accepted: str,
             runner: Callable[[dict], dict] | None = None) -> int:
    """Trace the structure and every regime not cached yet in ONE subprocess (one transformers import), and cache
    them; returns how many regimes were traced. For a planner or a benchmark that knows its regimes up front.
    `runner`: measure/trace.py's `run`, called in this process instead (a caller that has imported torch anyway)."""
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
        _store_lora(config, regime, act)
    return len(missing)


def _store_lora(config: Mapping[str, Any], regime: Mapping[str, Any] | None, act: Mapping[str, Any]) -> None:
    """A LoRA regime's answer carries peft's count for its targets: cached as `lora` would cache it."""
    if regime is not None and isinstance(act.get("lora"), dict):
        targets = regime.get("lora_targets")
        _store(config, {"lora_targets": sorted(targets) if targets else None},
               {"format": TRACE_FORMAT, "model_type": config.get("model_type"), "lora": act["lora"]})


def tracing_now() -> tuple[str, float] | None:
    """The trace this process runs now, (what: model_type and regimes, seconds since it started); None when none
    runs. For a front end whose plan waits on it (the wizard's solver says so instead of "solving…")."""
    active = _ACTIVE
    return None if active is None else (active[0], time.monotonic() - active[1])


def shutdown() -> None:
    """End this process's trace process now, mid-trace if it is tracing: a front end that quits does not wait for
    a trace nobody will read (a plan waiting on it gets the trace's one-line refusal)."""
    _WORKER.stop(now=True)


def warm(config: Mapping[str, Any]) -> bool:
    """Start this process's trace process and build `config` in it, without waiting for a plan: transformers and
    the family's modelling code are imported (most of a first plan's wait: about 7 s of a 12 s first plan of
    tiny-phi3 on 2 cores), so the plan that follows traces only its regimes. For a front end that knows the model
    before the plan (the wizard, when a model is picked); run it off the UI thread. Nothing is done when the trace
    process runs already or this family's structure is cached (traced here before: its plans read the cache).
    Returns whether it traced; a refusal is the plan's to say, not raised here."""
    try:
        with _LOCK:
            running = _WORKER.proc is not None and _WORKER.proc.poll() is None
            if running or _read(_cache_path(config, cache_key(config, None))) is not None:
                return False
            _trace(config, None, "")
            return True
    except ScaletrainError:
        return False


def structure(config: Mapping[str, Any], accepted: str) -> dict[str, Any]:
    """The real model's parameters and one block's modules (regime-free)."""
    return trace(config, None, accepted)[0]["structure"]


def activations(config: Mapping[str, Any], regime: Mapping[str, Any], accepted: str) -> dict[str, Any]:
    """What a slice saves for backward in `regime` (measure/trace.py's `activations` answer)."""
    return trace(config, regime, accepted)[0]["activations"]


def source(config: Mapping[str, Any]) -> str:
    """"traced" when this process ran the trace, "traced (cached)" when every answer came from the cache."""
    return "traced" if cache_key(config, None) in _RAN else "traced (cached)"


def lora(config: Mapping[str, Any], targets: Any, accepted: str) -> dict[str, int]:
    """peft's count of LoRA on the real model for `targets` (None: all linears): trainable parameters per unit of
    rank and adapted modules (measure/trace.py `lora_count`), cached per target set."""
    return _peft_answer(config, {"lora_targets": sorted(targets) if targets else None}, "lora", dict, accepted)


@_one_at_a_time
def _peft_answer(config: Mapping[str, Any], question: dict[str, Any], field: str, kind: type, accepted: str) -> Any:
    """The trace process's answer to one peft question (its `field`, of type `kind`), cached per question: the
    cache is read first, and only LoRA plans ask (a full plan never imports peft)."""
    hit = _read(_cache_path(config, cache_key(config, question)))
    if hit is not None and isinstance(hit.get(field), kind):
        return hit[field]
    data = _run_trace(config, None, accepted, question=question)
    if not isinstance(data.get(field), kind):
        raise _fail(str(config.get("model_type")), "the trace answered in another format", accepted)
    _store(config, question, {"format": TRACE_FORMAT, "model_type": data.get("model_type"), field: data[field]})
    return data[field]


def config_positions(config: Mapping[str, Any]) -> list[int]:
    """The position counts config.json names (POSITION_KEYS), in ascending order, each once."""
    return sorted({v for k in POSITION_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool)
                   and v > 0})


def granule(config: Mapping[str, Any]) -> int:
    """The tile every padding kernel of `config` rounds a sequence up to: the gated delta rule's chunk and every
    kernel chunk the config names (mamba2's chunk_size), their least common multiple. Trace lengths lie in the
    planned length's residue class modulo it, so what pads and what does not are both exact in one fit. A model
    with fewer learned positions than the trace lengths need (blenderbot's 128) is traced at a finer tile."""
    chunks = 1
    for k, v in config.items():
        if "chunk" in k and isinstance(v, int) and not isinstance(v, bool) and 1 < v <= MAX_GRANULE:
            chunks = chunks * v // math.gcd(chunks, v)
    g = BASE_GRANULE * chunks // math.gcd(BASE_GRANULE, chunks)
    positions = config_positions(config)
    fits = 1 << max((min(positions) // LENGTHS_PER_GRANULE).bit_length() - 1, 0) if positions else g
    return fits if fits < g and fits % chunks == 0 else g


def peft_refuses(config: Mapping[str, Any], names: list[str], accepted: str) -> list[str]:
    """The block linears of `names` peft will not adapt in this model (measure/trace_structure.py `peft_refuses`),
    cached per name set: asked by LoRA plans only, so a full plan never imports peft."""
    return _peft_answer(config, {"peft_refuses": sorted(names)}, "peft_refuses", list, accepted)


def position_limit(trace: Mapping[str, Any] | None) -> int | None:
    """The longest sequence a model can run: the rows of a learned position table its trace found (gpt2's 1024),
    or None where positions are computed (rotary, ALiBi: every analytic family, no trace) and a sequence past the
    config's max_position_embeddings still runs."""
    limit = (trace or {}).get("position_table")
    return int(limit) if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def at(coeffs: list[int] | tuple[int, ...], batch: int, seq_len: int, granule: int = 1) -> int:
    """Bytes of a fitted term c0 + c1·S + c2·S² (traced at micro-batch 1) for `batch` sequences of `seq_len`:
    the per-token and per-S² parts scale with the batch, the constant does not. A fit made at lengths of another
    residue modulo the kernels' chunk (`granule` > 1) is read at the sequence rounded up to it: every padded
    tensor then counts, and the unpadded ones on the safe side."""
    c0, c1, c2 = coeffs
    S = -(-seq_len // max(granule, 1)) * max(granule, 1)
    if all(isinstance(c, int) for c in coeffs):
        return c0 + batch * (c1 * S + c2 * S * S)
    return math.ceil(c0 + batch * (c1 * S + c2 * S * S))

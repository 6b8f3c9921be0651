"""Your data, profiled with the run's own tokenizer before you train (issue 22).

`python -m scaletrain.measure.probe data-profile` (the trainer's reading, tokenizing and blocking) runs as a subprocess:
planning never imports transformers or torch. Its answer is cached by the files' sizes and times, the model and
weights, the sequence length, packing and column renames (beside the traces: catalog/traced.cache_dir), so the
wizard and `plan` ask again for free. The plan's dataset size is the blocks the trainer will make, so steps per
epoch follow the packed token count instead of one record per sample.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from scaletrain.engine.catalog.hub import HF_ID, unavailable
from scaletrain.engine.catalog.traced import cache_dir
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_CONFIG_BYTES, atomic_write, read_text_bounded
from scaletrain.engine.probes import PROFILE_FORMAT, probe_argv
from scaletrain.engine.request.remote_code import check_no_remote_code
from scaletrain.engine.request.data_source import resolve_data
from scaletrain.engine.units import fmt_count

PROFILE_TIMEOUT_S = 600     # a tokenizer load and a large file on a busy machine


def trained_blocks(blocks: int, eval_fraction: float) -> int:
    """The blocks left to train on when train.eval_fraction of them is held out (trainer/evaluate.py takes
    ceil(fraction × blocks) for eval); what a plan counts as its samples."""
    return blocks - (math.ceil(eval_fraction * blocks) if eval_fraction else 0)


@dataclass(frozen=True)
class DataProfile:
    data: dict[str, Any]

    @property
    def blocks(self) -> int | None:
        return self.data.get("blocks")

    @property
    def error(self) -> str | None:
        """Why the data could not be profiled (the plan then counts rows, and says so)."""
        return self.data.get("error")

    def lines(self) -> list[str]:
        """`plan`'s words: format and records; token statistics; what the trainer makes of them."""
        d = self.data
        if self.error:
            return [f"no token statistics ({self.error[:200]}); the plan counts one sample per row"]
        out = [f"{fmt_count(d['records'])} records ({d['data_format']})"]
        if "tokens" not in d:
            return out + [d.get("note", "")]
        t = d["tokens"]
        out.append(f"tokens per record p50 {fmt_count(t['p50'])} · p95 {fmt_count(t['p95'])} · max "
                   f"{fmt_count(t['max'])}; {d['truncated_share']:.0%} longer than {d['seq_len']}")
        how = "packed into" if d["packing"] else "padded to"
        if not d["blocks"]:
            return out + [f"no block of {d['seq_len']} tokens: the data is shorter than one sequence; the trainer "
                          "will refuse it (turn packing off, or a shorter --seq-len)"]
        out.append(f"{fmt_count(d['blocks'])} blocks {how} {d['seq_len']} tokens "
                   f"({fmt_count(d['trained_tokens'])} trained tokens): the plan's samples")
        return out


def _key(spec: str, model: str, weights: str | None, seq_len: int, packing: bool,
         columns: dict[str, str] | None) -> str:
    src = resolve_data(spec)
    files = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in src.files]
    text = json.dumps({"format": PROFILE_FORMAT, "files": files, "model": model, "weights": weights,
                       "seq_len": seq_len, "packing": packing, "columns": columns}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def profile_data(spec: str, model: str, weights: str | None, seq_len: int, packing: bool = True,
                 columns: dict[str, str] | None = None) -> DataProfile:
    """The profile of --data for this model's tokenizer (cached; one line on failure)."""
    check_no_remote_code(weights)            # the child loads the tokenizer: nothing of the folder may run
    path = cache_dir().parent / "data" / f"{_key(spec, model, weights, seq_len, packing, columns)}.json"
    try:
        data = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, "data profile"))
        if data.get("format") == PROFILE_FORMAT:
            return DataProfile(data)
    except (OSError, ValueError, ScaletrainError):
        pass
    argv = probe_argv("data-profile", "--data", spec, "--model", model, "--seq-len", str(seq_len),
                      "--columns", json.dumps(columns or {}))
    if weights:
        argv += ["--weights", weights]
    if not packing:
        argv.append("--no-packing")
    source = weights or model                # where the tokenizer comes from
    hub_off = _hub_off(source)
    env = None if hub_off is None else dict(os.environ, HF_HUB_OFFLINE="1")
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=PROFILE_TIMEOUT_S, env=env)
        data = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except (subprocess.TimeoutExpired, ValueError, OSError) as e:
        raise ScaletrainError(f"profiling --data {spec} failed ({e.__class__.__name__})") from None
    if "error" in data:
        raise ScaletrainError(data["error"])
    if data.get("format") != PROFILE_FORMAT:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ScaletrainError(f"profiling --data {spec} failed: {tail}")
    if hub_off is not None and data.get("no_tokenizer"):
        # not cached: once the hub answers, the same request gets its token statistics
        data["note"] = (f"no token statistics (the tokenizer of {source} is not in this machine's HF "
                        f"cache and {hub_off}); the plan counts one sample per record")
        return DataProfile(data)
    atomic_write(path, json.dumps(data) + "\n", backup=False)
    return DataProfile(data)


def _hub_off(source: str) -> str | None:
    """Why the probe must not ask the hub for `source`'s tokenizer (HF_HUB_OFFLINE, an unreachable endpoint), or
    None. Without it an offline machine waits out huggingface_hub's five retries (about 47 s) before the note."""
    if source == "random-init" or not HF_ID.match(source) or os.path.exists(source):
        return None
    return unavailable()

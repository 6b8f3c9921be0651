"""Before any rank starts: the run's hub weights and datasets on this node, and a tokenizer that really tokenizes.

Why here, once per node: N ranks downloading one model race over one cache and fail late, after the ranks started
(and a gated repository would fail in every rank's log). So the launcher downloads what the run loads
(engine/request/hub_files.py: only those files, resumable, a progress bar on a terminal) when the hub can be asked,
refuses a gated, missing or unauthorised repository in one line, and then starts the ranks with HF_HUB_OFFLINE=1:
they read exactly the snapshot checked here, with no request per rank and file. Offline (HF_HUB_OFFLINE, or the
hub unreachable) nothing is asked: the ranks load from the cache as before, and weights or a dataset not cached
are the plan's own line ("… huggingface-cli download …"), said here instead of in every rank's log.

Then the tokenizer: transformers 5 can return an empty tokenizer (one token, encoding every text to nothing) for a
source whose tokenizer files are missing, and a run would train on end-of-sequence tokens alone. The trainer's own
check (trainer/tokenizer_check.py) runs here in a probe subprocess (measure/probe.py; transformers stays out of the
launcher), so such a run is one line before any rank starts. A user script loads what it loads: none of this runs for
one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.probes import probe_argv
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.units import fmt_bytes

TOKENIZER_CHECK_TIMEOUT_SECONDS = 600.0       # transformers' import plus a large tokenizer.json, on a busy node
RANKS_OFFLINE = {"HF_HUB_OFFLINE": "1"}
ERROR_PREFIX = "scaletrain: error: "          # the check's one line (trainer/tokenizer_check.py main)


@dataclass(frozen=True)
class Prefetched:
    env: dict[str, str] = field(default_factory=dict)     # added to the ranks' environment
    notes: tuple[str, ...] = ()                           # what was downloaded, one line each


def prefetch(train: TrainOptions, progress: bool | None = None) -> Prefetched:
    """The run's hub datasets and weights on this node (downloaded when the hub can be asked), then its tokenizer
    checked; one line (ScaletrainError) for anything refused."""
    from scaletrain.engine.catalog.hub import unavailable
    from scaletrain.engine.request.data_source import fetch_dataset, is_hub_dataset, resolve_data
    from scaletrain.engine.request.weights import RANDOM_INIT

    if train.script:
        return Prefetched()
    source = train.model_source
    hub_weights = bool(source) and source != RANDOM_INIT and _hub_id(str(source))
    datasets = [str(spec) for spec in (train.dataset, train.eval_data) if is_hub_dataset(spec)]
    online = (hub_weights or bool(datasets)) and unavailable() is None      # the hub is probed only when needed
    notes: list[str] = []
    for spec in datasets:
        if online:
            fetch_dataset(spec, progress)
        resolve_data(spec)                         # offline and not cached: plan time's one line
    env: dict[str, str] = {}
    if hub_weights:
        if online:
            notes += _fetch_weights(str(source), progress)
            env.update(RANKS_OFFLINE)
        else:
            from scaletrain.engine.request.weights import weights_note

            missing = weights_note(str(source))         # offline and not cached: the plan's note, now before the ranks
            if missing:
                raise ScaletrainError(missing)
    if source and source != RANDOM_INIT:
        from scaletrain.engine.request.remote_code import check_no_remote_code

        check_no_remote_code(source)               # the files just fetched: custom code is refused, never run
        check_tokenizer(source, env)
    return Prefetched(env, tuple(notes))


def _hub_id(source: str) -> bool:
    from scaletrain.engine.catalog.hub import HF_ID

    try:
        return bool(HF_ID.match(source)) and not os.path.exists(os.path.expanduser(source))
    except (OSError, ValueError):
        return False


def _fetch_weights(source: str, progress: bool | None) -> list[str]:
    """The files of `source` the run loads into the HF cache; a note when anything was downloaded."""
    from scaletrain.engine.catalog.hub import cache_roots
    from scaletrain.engine.request.hub_files import download, hub_files

    files = hub_files(source, "model")
    if not files.missing:
        return []
    root = cache_roots()[0]
    free = _free_bytes(root)
    if free is not None and files.missing_bytes > free:
        raise ScaletrainError(f"the weights of {source} need {fmt_bytes(files.missing_bytes)} in the HF cache at "
                              f"{root}, which has {fmt_bytes(free)} free; free space, or point HF_HUB_CACHE at a "
                              "bigger disk")
    download(files, progress)
    n = len(files.missing)
    return [f"downloaded {fmt_bytes(files.missing_bytes)} ({n} file{'s' if n != 1 else ''}) of {source} into {root}"]


def _free_bytes(path: os.PathLike[str] | str) -> int | None:
    p = os.fspath(path)
    while p and not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def check_tokenizer(source: str, env: dict[str, str] | None = None) -> None:
    """The trainer's tokenizer check of `source` in a probe subprocess (`python -m scaletrain.measure.probe
    tokenizer-check`): its one line when the tokenizer cannot be loaded, is empty, or tokenizes a probe sentence to
    almost nothing."""
    argv = probe_argv("tokenizer-check", source)
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=TOKENIZER_CHECK_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise ScaletrainError(f"the tokenizer of {source} did not load within {TOKENIZER_CHECK_TIMEOUT_SECONDS:.0f} s"
                              ) from None
    except OSError as e:
        raise ScaletrainError(f"cannot check the tokenizer of {source} ({e.strerror or e})") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        line = next((ln[len(ERROR_PREFIX):] for ln in reversed(lines) if ln.startswith(ERROR_PREFIX)), None)
        raise ScaletrainError(line or f"the tokenizer of {source} cannot be loaded (exit {proc.returncode}: "
                                      f"{(lines or ['no output'])[-1][:200]})")

"""--data: where a run's training records come from, and how many there are (the plan's dataset size).

A local file (JSONL, JSON, Parquet, CSV), a folder of them, or an HF dataset id: read from the hub cache
(<cache>/datasets--ORG--NAME/snapshots/<rev>/...), where the CLI's plan and the launcher first download its data
files when the hub can be asked (fetch_dataset, engine/request/hub_files.py); offline, it must be cached. Counting
rows here is torch-free and cheap (JSONL lines, Parquet metadata, CSV rows, a JSON array's length) so
`scaletrain plan --data` stays fast; the trainer reads the same files through the `datasets` library
(trainer/data.py), so one resolution serves both.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.data_files import DATA_SUFFIXES, cached_dataset, pick_data_files
from scaletrain.engine.fileio import MAX_DATA_BYTES, not_regular, read_text_bounded

ACCEPTED = "a JSONL/JSON/Parquet/CSV file, a folder of them, or an HF dataset id (org/name)"


@dataclass(frozen=True)
class DataSource:
    """What --data names: the spec as recorded in plan.json (absolute path or HF id), the files the trainer reads
    (one format), and their row count."""

    spec: str
    files: tuple[Path, ...]
    builder: str                 # the datasets builder that reads them: json | parquet | csv
    rows: int


def _data_files(folder: Path) -> list[Path]:
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return [folder / n for n in pick_data_files(names)]


_ROW_COUNTS: dict[tuple[str, int, int], int] = {}


def count_rows(path: Path) -> int:
    """Records in one file, without reading it into memory as records (Parquet: its metadata); cached by path, size
    and mtime, since the wizard asks again as fields are edited."""
    try:
        st = path.stat()
    except OSError as e:
        raise ScaletrainError(f"dataset {path} cannot be read ({e.strerror or e.__class__.__name__})") from None
    problem = not_regular(path, "dataset")           # a FIFO named data.jsonl would block every reader
    if problem:
        raise ScaletrainError(problem)
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _ROW_COUNTS:
        _ROW_COUNTS[key] = _count_rows(path)
    return _ROW_COUNTS[key]


def _count_rows(path: Path) -> int:
    kind = DATA_SUFFIXES.get(path.suffix)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        if kind == "csv":
            old = csv.field_size_limit()
            csv.field_size_limit(max(old, MAX_DATA_BYTES))      # a long text field is data (records.py reads it)
            try:
                with path.open(newline="", encoding="utf-8-sig") as f:
                    return max(0, sum(1 for row in csv.reader(f) if row) - 1)
            finally:
                csv.field_size_limit(old)
        if path.suffix == ".json":
            with path.open(encoding="utf-8") as f:
                first = next((c for c in iter(lambda: f.read(1), "") if not c.isspace()), "")
            if first == "[":                             # one JSON array of records (else JSON lines)
                data = json.loads(read_text_bounded(path, MAX_DATA_BYTES, "dataset"))
                return len(data) if isinstance(data, list) else 0
        with path.open(encoding="utf-8") as f:          # JSON lines
            return sum(1 for line in f if line.strip())
    except UnicodeDecodeError:
        raise ScaletrainError(f"dataset {path} is not UTF-8 text; give UTF-8 records") from None
    except (OSError, ValueError, csv.Error) as e:
        raise ScaletrainError(f"dataset {path} cannot be read ({getattr(e, 'strerror', None) or e.__class__.__name__})"
                              ) from None
    except Exception as e:                               # pyarrow's own errors: not a Parquet file
        raise ScaletrainError(f"dataset {path} cannot be read ({str(e).splitlines()[0][:120]})") from None


def _from_files(spec: str, files: list[Path], where: str) -> DataSource:
    if not files:
        raise ScaletrainError(f"dataset {where} holds no data files ({', '.join(DATA_SUFFIXES)})")
    kinds = {DATA_SUFFIXES[p.suffix] for p in files}
    if len(kinds) > 1:
        raise ScaletrainError(f"dataset {where} mixes formats ({', '.join(sorted(kinds))}); keep one format per "
                              "dataset")
    rows = sum(count_rows(p) for p in files)
    if rows == 0:
        raise ScaletrainError(f"dataset {where} holds no records")
    return DataSource(spec, tuple(files), kinds.pop(), rows)


def resolve_data(spec: str, fetch: bool = False) -> DataSource:
    """The files and row count --data names; one line saying why not (missing, unknown format, not cached).
    fetch: an HF dataset id not in the cache is downloaded when the hub can be asked (fetch_dataset)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ScaletrainError(f"--data is empty; give {ACCEPTED}")
    p = Path(spec).expanduser()
    try:
        exists = p.exists()
    except (OSError, ValueError):
        exists = False
    if exists:
        p = p.resolve()
        if p.is_dir():
            return _from_files(str(p), _data_files(p), str(p))
        if p.suffix not in DATA_SUFFIXES:
            raise ScaletrainError(f"dataset {spec}: unknown format {p.suffix or '(no suffix)'}; give {ACCEPTED}")
        return _from_files(str(p), [p], str(p))
    from scaletrain.engine.catalog.hub import HF_ID, cache_roots

    if not HF_ID.match(spec) or spec.startswith((".", "/", "~")):
        raise ScaletrainError(f"dataset {spec} does not exist; give {ACCEPTED} (or leave it unset for the bundled "
                              "demo data)")
    snap = fetch_dataset(spec) if fetch else cached_dataset(spec)
    if snap is None:
        raise ScaletrainError(f"dataset {spec}: not a file or folder, and not in the HF cache at {cache_roots()[0]} "
                              f"(read offline); download it once (huggingface-cli download --repo-type dataset "
                              f"{spec}) or give a local file")
    return _from_files(spec, _data_files(snap), f"{spec} ({snap})")


def is_hub_dataset(spec: str | None) -> bool:
    """--data names an HF dataset id (org/name), not a file or folder on this machine."""
    from scaletrain.engine.catalog.hub import HF_ID

    if not isinstance(spec, str) or not HF_ID.match(spec) or spec.startswith((".", "/", "~")):
        return False
    try:
        return not Path(spec).expanduser().exists()
    except (OSError, ValueError):
        return False


def fetch_dataset(repo_id: str, progress: bool | None = None) -> Path | None:
    """The dataset's snapshot folder: the cached one, else its data files downloaded from the hub (a progress bar on
    a terminal); None when the hub cannot be asked (offline: the caller says so). A refusal is one line."""
    from scaletrain.engine.catalog.hub import unavailable
    from scaletrain.engine.request.hub_files import download, hub_files

    snap = cached_dataset(repo_id)
    if snap is not None or unavailable() is not None:
        return snap
    try:
        files = hub_files(repo_id, "dataset")
    except ScaletrainError:
        if Path(repo_id).suffix in DATA_SUFFIXES:       # data/train.jsonl: a mistyped path, not a hub id
            raise ScaletrainError(f"dataset {repo_id} does not exist (no such file here, nor a dataset on the hub); "
                                  f"give {ACCEPTED}") from None
        raise
    return download(files, progress)

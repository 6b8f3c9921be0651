"""Which files of a data folder, or of an HF dataset repository, are the training data; and where the HF cache
keeps a dataset. Shared by the row count (data_source.py), the hub's download (hub_files.py) and the trainer's
reader, so all three read the same files.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
TRAIN_SPLIT_HINTS = ("train",)


def pick_data_files(names: list[str]) -> list[str]:
    """Of a folder's (or a hub dataset's) relative file names, the data files the trainer reads: the known formats,
    nothing hidden, the train split when one is named (a file or its folder)."""
    files = sorted(n for n in names if PurePosixPath(n).suffix in DATA_SUFFIXES
                   and not any(part.startswith(".") for part in PurePosixPath(n).parts))
    train = [n for n in files if any(h in PurePosixPath(n).name.lower() or h in PurePosixPath(n).parent.name.lower()
                                     for h in TRAIN_SPLIT_HINTS)]
    return train or files


def cached_dataset(repo_id: str) -> Path | None:
    """The snapshot folder of a dataset repository in the hub cache (refs/main, else the newest), or None."""
    from scaletrain.engine.catalog.hub import cache_roots

    for root in cache_roots():
        repo = root / ("datasets--" + repo_id.replace("/", "--"))
        try:
            ref = repo / "refs" / "main"
            if ref.is_file() and (repo / "snapshots" / ref.read_text().strip()).is_dir():
                return repo / "snapshots" / ref.read_text().strip()
            snaps = sorted((repo / "snapshots").glob("*"), key=lambda q: q.stat().st_mtime, reverse=True)
            if snaps:
                return snaps[0]
        except (OSError, ValueError):
            continue
    return None

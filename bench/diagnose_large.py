"""`scaletrain diagnose` of huge logs (issue 29): target ≤ 20 s for a 1 GB log, one line or many.

Two logs of SIZE bytes each are written to a temporary folder, each ending in a real failure (the torch 2.x CUDA OOM
of tests/fixtures/logs/torch2x_oom_gpu3.log): one whose noise is a single line of SIZE bytes (no newline until the
traceback), one of ordinary training lines (~110 bytes each, two ranks, timestamps). Each is diagnosed REPEATS times
by the real CLI in a subprocess (`python -m scaletrain.tui.cli.main diagnose LOG`), the wall time and peak RSS
(ru_maxrss of the children) recorded, and the verdict checked (cuda_oom on GPU 3). The first run of each also pays
for reading the file from disk if the page cache dropped it; all runs are recorded. Results go to
bench/results/diagnose_large-<machine>.json with the machine, its load and the versions.

    .venv/bin/python bench/diagnose_large.py [--size-mb 1024] [--repeats 2] [--machine vm]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaletrain.engine.fileio import atomic_write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAILURE = ROOT / "tests" / "fixtures" / "logs" / "torch2x_oom_gpu3.log"
CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())", "diagnose"]
BLOCK = 8 << 20


def write_single_line(path: Path, size: int) -> None:
    """SIZE bytes of one line of text (words, dots, digits: what a runaway progress bar or a dumped tensor
    prints), then the failure."""
    unit = ("tensor([[0.1234, -0.5678, 1.0e-3], grad_fn=<AddBackward0>) it/s 5.16 loss=1.92 " * 64).encode()
    block = (unit * (BLOCK // len(unit) + 1))[:BLOCK]
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(block[:min(left, BLOCK)])
            left -= BLOCK
        f.write(b"\n" + FAILURE.read_bytes())


def write_many_lines(path: Path, size: int) -> None:
    lines = b"".join(f"[rank{i % 2}]: 2026-11-22 00:{i // 60 % 60:02d}:{i % 60:02d},081 step {i} loss 1.{i % 97:02d}"
                     f" lr 1e-4 tokens/s 12345.6 grad_norm 0.{i % 89:02d} mem 71.2 GiB\n".encode()
                     for i in range(80_000))
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(lines[:min(left, len(lines))])
            left -= len(lines)
        f.write(b"\n" + FAILURE.read_bytes())


def diagnose(path: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run([*CLI, str(path)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    wall = time.perf_counter() - t
    first = (r.stdout.splitlines() or [""])[0]
    return {"seconds": round(wall, 2), "exit": r.returncode, "verdict": first[:160],
            "ok": r.returncode == 0 and first.startswith("cuda_oom gpu 3"),
            "children_max_rss_mib": round(max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024)}


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    return r.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--machine", default="vm")
    ap.add_argument("--dir", default=None, help="where the logs are written (default: a temporary folder)")
    a = ap.parse_args()
    size = a.size_mb << 20
    out: dict = {"what": "scaletrain diagnose of one log of --size-mb, single line and many lines, each ending in a "
                         "CUDA OOM traceback; wall seconds of the CLI subprocess", "size_bytes": size,
                 "machine": machine(), "versions": {"python": sys.version.split()[0], "scaletrain_commit": _commit()},
                 "target_seconds": 20,
                 "cases": {}}
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="diagnose-large-") as tmp:
        for name, write in (("single_line", write_single_line), ("many_lines", write_many_lines)):
            log = Path(tmp) / f"{name}.log"
            t = time.perf_counter()
            write(log, size)
            made = time.perf_counter() - t
            runs = [diagnose(log) for _ in range(a.repeats)]
            out["cases"][name] = {"file_bytes": log.stat().st_size, "write_seconds": round(made, 1), "runs": runs}
            print(name, json.dumps(runs), flush=True)
            log.unlink()
    out["load_average_1m_at_end"] = os.getloadavg()[0]
    out["all_ok"] = all(r["ok"] and r["seconds"] <= 20 for c in out["cases"].values() for r in c["runs"])
    dest = ROOT / "bench" / "results" / f"diagnose_large-{a.machine}.json"
    atomic_write(dest, json.dumps(out, indent=2) + "\n", backup=False)
    print(f"wrote {dest}: all within 20 s and right: {out['all_ok']}")
    return 0 if out["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

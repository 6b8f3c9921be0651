"""GPU samples for the monitor: NVML (each field may fail alone, MIG slices under their parent, a lost GPU is an
error row), or recorded samples replayed from JSONL (`python -m scaletrain.engine.sampling.gpu --record FILE`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from scaletrain.engine.devices.nvml import (GpuSample, MigSample, device_count, device_name, load_nvml, mig_samples,
                                           sample as nvml_sample, shutdown)
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import read_text_bounded

DEFAULT_INTERVAL_S = 1.0          # the 1 Hz default
MAX_REPLAY_BYTES = 1 << 30        # a recorded samples file read whole (a day at 1 Hz on 8 GPUs is ~100 MB)


@dataclass(frozen=True)
class GpuSnapshot:
    """One tick of all GPUs. `available` False: no NVML (a CPU run, or no driver), `reason` says why."""

    time_s: float
    gpus: tuple[GpuSample, ...] = ()
    names: tuple[str | None, ...] = ()
    migs: tuple[MigSample, ...] = ()
    available: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "available": self.available, "reason": self.reason,
                "gpus": [{**asdict(g), "pids": list(g.pids), "pid_memory_bytes": list(g.pid_memory_bytes), "name": n}
                         for g, n in zip(self.gpus, self.names or (None,) * len(self.gpus))],
                "migs": [{**asdict(m), "pids": list(m.pids)} for m in self.migs]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GpuSnapshot":
        gpus, names = [], []
        known = set(GpuSample.__dataclass_fields__)
        for g in d.get("gpus") or ():
            names.append(g.get("name"))
            kw = {k: v for k, v in g.items() if k in known}
            kw["pids"] = tuple(kw.get("pids") or ())
            kw["pid_memory_bytes"] = tuple(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
                                           for v in kw.get("pid_memory_bytes") or ())
            kw.setdefault("time_s", d.get("time_s", 0.0))
            gpus.append(GpuSample(**kw))
        migs = tuple(MigSample(**{**m, "pids": tuple(m.get("pids") or ())}) for m in d.get("migs") or ())
        return cls(time_s=float(d.get("time_s", 0.0)), gpus=tuple(gpus), names=tuple(names), migs=migs,
                   available=bool(d.get("available", True)), reason=d.get("reason"))


class GpuSource(Protocol):
    def read(self) -> GpuSnapshot: ...
    def close(self) -> None: ...


class NvmlSource:
    """NVML through nvidia-ml-py. Init failure is an answer (available=False), never an exception."""

    def __init__(self, loader: Callable[[], Any] = load_nvml, now: Callable[[], float] = time.time):
        self._now = now
        self.nv: Any = None
        self.reason: str | None = None
        try:
            self.nv = loader()
        except ModuleNotFoundError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded: a CPU host
            self.reason = f"NVML unavailable: {e.__class__.__name__}: {e}".rstrip(": ")
        self.count = device_count(self.nv) if self.nv is not None else 0
        if self.nv is not None and self.count == 0:
            self.reason = "NVML found no GPU"
        self.names = tuple(device_name(self.nv, i) for i in range(self.count))

    @property
    def available(self) -> bool:
        return self.nv is not None and self.count > 0

    def read(self) -> GpuSnapshot:
        if not self.available:
            return GpuSnapshot(self._now(), available=False, reason=self.reason)
        gpus = tuple(nvml_sample(self.nv, self.count, self._now))
        return GpuSnapshot(gpus[0].time_s if gpus else self._now(), gpus, self.names, mig_samples(self.nv, gpus))

    def close(self) -> None:
        if self.nv is not None:
            shutdown(self.nv)
            self.nv = None


class ReplaySource:
    """Recorded GpuSnapshots from a JSONL file, one per read; `loop` restarts at the end (else the last repeats)."""

    def __init__(self, path: str | os.PathLike[str], loop: bool = True):
        p = Path(path)
        try:
            lines = [ln for ln in read_text_bounded(p, MAX_REPLAY_BYTES, "cannot read recorded samples:").splitlines()
                     if ln.strip()]
        except FileNotFoundError:
            raise ScaletrainError(f"recorded samples {p} do not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
            raise ScaletrainError(f"cannot read recorded samples {p} ({why})") from None
        snaps = []
        for n, ln in enumerate(lines, 1):
            try:
                d = json.loads(ln)
                if not isinstance(d, dict):
                    raise TypeError(f"a JSON {type(d).__name__}, not an object")
                snaps.append(GpuSnapshot.from_json(d))
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                raise ScaletrainError(f"{p}:{n} is not a recorded sample ({e}); record with "
                                      "`python -m scaletrain.engine.sampling.gpu --record FILE`") from None
        if not snaps:
            raise ScaletrainError(f"{p} holds no samples")
        self.snapshots = snaps
        self.loop = loop
        self._i = 0

    def read(self) -> GpuSnapshot:
        s = self.snapshots[self._i]
        if self._i + 1 < len(self.snapshots):
            self._i += 1
        elif self.loop:
            self._i = 0
        return s

    def close(self) -> None:
        pass


def record(path: str | os.PathLike[str], seconds: float, interval_s: float = DEFAULT_INTERVAL_S,
           source: GpuSource | None = None) -> int:
    """Write `seconds` of live NVML samples as JSONL (fixtures for the replay source). Returns samples written."""
    src = source or NvmlSource()
    n = 0
    with open(path, "w") as f:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            f.write(json.dumps(src.read().to_json()) + "\n")
            f.flush()
            n += 1
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))
    src.close()
    return n


def main(argv: list[str] | None = None) -> int:
    """`python -m scaletrain.engine.sampling.gpu --record FILE [--seconds N] [--interval S]`: record NVML fixtures."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m scaletrain.engine.sampling.gpu")
    p.add_argument("--record", required=True, metavar="FILE", help="JSONL file to write")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    a = p.parse_args(argv)
    src = NvmlSource()
    if not src.available:
        print(f"scaletrain: error: {src.reason}", flush=True)
        return 2
    print(f"recorded {record(a.record, a.seconds, a.interval, src)} samples to {a.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

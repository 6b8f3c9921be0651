"""Every resource in the plan's verdict: GPU memory per GPU, host RAM per node, disk for the run directory.

The plan's memory model says what one GPU holds (plan.memory) and what each GPU keeps in host RAM (offloaded states,
`host_bytes_per_gpu`); engine/run/disk.py says what the run writes and what rank 0's end-of-run export holds in
host RAM. This module sets each need against what there is, where that is known:

  GPU memory  the card's capacity less the headroom (the plan's own fit)
  host RAM    `--host-ram GIB` (per node) when given; else this node's RAM (engine/devices) for a plan on this
              machine (--gpus auto, the CPU device); else unknown (named GPUs: another machine), said as such
  disk        the free space where the run directory goes, for a plan on this machine; else unknown
  HF cache    the hub files the launch downloads, against the free space of the HF cache (when there are any)

and names the binding one: "does not fit: needs 1,577 GiB host RAM per node, this node has 256 GiB". A resource
whose supply is unknown never fails the verdict; it is shown as not checked.

Host RAM per node is the offloaded states of the node's GPUs plus, on rank 0's node, the export at the end: the
trainer exports before it lets the DeepSpeed engine (and its offloaded states) go (trainer/train.py report_done).
On the CPU device the plan's memory is host RAM already (the GPU-memory row is it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.devices.detect import host_memory_bytes
from scaletrain.engine.run.disk import DiskNeed, disk_need, free_bytes
from scaletrain.engine.units import fmt_bytes

GiB = 1024**3
DEFAULT_RUNS_DIR = "runs"           # where a run directory goes unless --run-dir says (engine/run/layout.py)


def fmt_size(n: int) -> str:
    """Bytes for a verdict line: whole GiB with thousands separators from 100 GiB up ('1,183 GiB'), else fmt_bytes."""
    return f"{n / GiB:,.0f} GiB" if n >= 100 * GiB else fmt_bytes(n)


@dataclass(frozen=True)
class ResourceCheck:
    key: str                     # gpu_memory | host_ram | disk
    label: str                   # "GPU memory", "host RAM", "disk"
    need_bytes: int
    have_bytes: int | None       # None: not known for this plan
    per: str                     # "per GPU" | "per node" | ""
    where: str                   # who has `have_bytes`, "{}" standing for it: "this node has {}"; or why unknown
    parts: str = ""              # what the need is made of

    @property
    def fits(self) -> bool | None:
        return None if self.have_bytes is None else self.need_bytes <= self.have_bytes

    def need_words(self) -> str:
        per = f" {self.per}" if self.per else ""
        return f"needs {fmt_size(self.need_bytes)} {self.label}{per}"

    def have_words(self) -> str:
        return self.where if self.have_bytes is None else self.where.format(fmt_size(self.have_bytes))

    def line(self) -> str:
        """'host RAM: 1,577 GiB per node (offloaded states 1,183 GiB + export 394 GiB); this node has 256 GiB'."""
        per = f" {self.per}" if self.per else ""
        parts = f" ({self.parts})" if self.parts else ""
        mark = {True: " — fits", False: " — does not fit", None: ""}[self.fits]
        return f"{self.label}: {fmt_size(self.need_bytes)}{per}{parts}; {self.have_words()}{mark}"

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.key, "need_bytes": self.need_bytes, "have_bytes": self.have_bytes,
                "per": self.per.removeprefix("per ") or None, "where": self.have_words(), "fits": self.fits}


@dataclass(frozen=True)
class ResourceVerdict:
    checks: tuple[ResourceCheck, ...]

    @property
    def fits(self) -> bool:
        """No known resource is short (an unknown one does not fail the verdict)."""
        return all(c.fits is not False for c in self.checks)

    @property
    def binding(self) -> ResourceCheck | None:
        """The resource that is shortest (largest need ÷ supply) among those that do not fit."""
        short = [c for c in self.checks if c.fits is False]
        return max(short, key=lambda c: c.need_bytes / max(1, c.have_bytes or 1)) if short else None

    def line(self) -> str:
        """'fits: GPU memory, host RAM, disk' (with what was not checked), or 'does not fit: needs …, … has …'."""
        b = self.binding
        if b is not None:
            also = [c.label for c in self.checks if c.fits is False and c is not b]
            return (f"does not fit: {b.need_words()}, {b.have_words()}"
                    + (f" (also short: {', '.join(also)})" if also else ""))
        ok = [c.label for c in self.checks if c.fits]
        unknown = [c.label for c in self.checks if c.fits is None]
        return f"fits: {', '.join(ok)}" + (f" ({', '.join(unknown)} not checked)" if unknown else "")

    def to_json(self) -> dict[str, Any]:
        b = self.binding
        return {"fits": self.fits, "binding": b.key if b else None, "verdict": self.line(),
                "checks": [c.to_json() for c in self.checks]}


def _host_ram(plan: Any, disk: DiskNeed, host_ram_gib: float | None) -> ResourceCheck | None:
    s = plan.setup
    if s.device != "cuda":
        return None
    offloaded = plan.memory.host_bytes_per_gpu * s.hardware.gpus_per_node
    need = offloaded + disk.export_host_bytes
    parts = " + ".join(p for p in (
        f"offloaded states {fmt_size(plan.memory.host_bytes_per_gpu)} × {s.hardware.gpus_per_node} GPUs"
        if offloaded else "",
        f"the export at the end {fmt_size(disk.export_host_bytes)} on rank 0's node" if disk.export_host_bytes
        else "") if p)
    if host_ram_gib is not None:
        have, where = int(host_ram_gib * GiB), "--host-ram gives {} per node"
    elif s.hardware.source == "detected":
        have, where = host_memory_bytes(), "this node has {}"
    else:
        have, where = None, "not checked for named GPUs: give --host-ram GIB per node"
    if have is None and s.hardware.source == "detected" and host_ram_gib is None:
        where = "this node's RAM is unknown"
    return ResourceCheck("host_ram", "host RAM", need, have, "per node", where, parts)


def _disk(plan: Any, disk: DiskNeed, run_dir: str | Path | None) -> ResourceCheck:
    s = plan.setup
    here = s.hardware.source == "detected" or s.device == "cpu"
    target = Path(run_dir) if run_dir else Path.cwd() / DEFAULT_RUNS_DIR
    have = free_bytes(target) if here else None
    where = (f"{{}} free at {target}" if have is not None else
             "not checked: the plan is for another machine" if not here else f"free space at {target} unknown")
    n = disk.checkpoints_kept
    parts = " + ".join(p for p in (
        f"{n} checkpoint{'s' if n != 1 else ''} × {fmt_size(disk.checkpoint_bytes)}" if n else "",
        f"export {fmt_size(disk.export_bytes)}" if disk.export_bytes else "",
        f"logs {fmt_size(disk.logs_bytes)}" if disk.logs_bytes else "") if p)
    return ResourceCheck("disk", "disk", disk.total_bytes, have, "", where, parts)


def _download(plan: Any, files: Any) -> ResourceCheck:
    """The hub files the launch downloads (engine/request/hub_files.HubFiles) against the HF cache's free space."""
    from scaletrain.engine.catalog.hub import cache_roots

    s = plan.setup
    root = cache_roots()[0]
    here = s.hardware.source == "detected" or s.device == "cpu"
    have = free_bytes(root) if here else None
    where = (f"{{}} free at {root}" if have is not None else
             "not checked: the plan is for another machine" if not here else f"free space at {root} unknown")
    n = len(files.missing)
    return ResourceCheck("download", "HF cache", files.missing_bytes, have, "", where,
                         f"{n} file{'s' if n != 1 else ''} of {files.repo_id} downloaded at launch")


def resource_verdict(plan: Any, train: Any, *, host_ram_gib: float | None = None,
                     run_dir: str | Path | None = None, download: Any = None) -> ResourceVerdict:
    """GPU memory, host RAM and disk of `plan` (with the trainer options `train`) against what there is; with
    `download` (the HubFiles the launch fetches, request/weights.weights_download) the HF cache's room for them."""
    m = plan.memory
    label = "GPU memory" if plan.setup.device == "cuda" else "memory"
    gpu = ResourceCheck("gpu_memory", label, m.total_bytes, m.usable_bytes, "per GPU" if plan.setup.device == "cuda"
                        else "per process", f"the limit is {{}} ({m.headroom_fraction:.0%} headroom)")
    disk = disk_need(plan, train)
    checks = [gpu]
    host = _host_ram(plan, disk, host_ram_gib)
    if host is not None:
        checks.append(host)
    if not getattr(train, "script", None):          # a user script's checkpoints are its own
        checks.append(_disk(plan, disk, run_dir))
    if download is not None and download.missing_bytes:
        checks.append(_download(plan, download))
    return ResourceVerdict(tuple(checks))

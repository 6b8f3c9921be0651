"""`scaletrain diagnose LOG... [--plan plan.json] [--json]` and `scaletrain monitor RUN_DIR [--interval S] [--headless]`.

Argument parsing and plain-text views only: the doctor and the sampler live in the engine. Nothing here imports
Textual or torch at module level; the full-screen monitor is imported only when it is asked for, so
`--headless` and `diagnose` work over SSH, in CI and in logs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.main import register

# Headless: device lines (GPU or host) are printed at most this often, step lines whenever a step lands.
HEADLESS_DEVICE_EVERY_S = 10.0
PROGRESS_BAR_CELLS = 24


# ---- diagnose --------------------------------------------------------------------------------------------------
def _configure_diagnose(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files, or a run directory (uses its logs, "
                                                         "status.json and plan.json)")
    p.add_argument("--plan", metavar="PLAN_JSON", help="the run's plan.json (or `scaletrain plan --json` output), "
                                                       "for predicted numbers and remedies")
    p.add_argument("--exit-code", action="append", default=[], metavar="RANK=CODE",
                   help="a rank's exit code when no status.json has it (e.g. 3=-9)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as one JSON object")


def _exit_codes(items: list[str]) -> dict[int, int]:
    out = {}
    for it in items:
        rank, _, code = it.partition("=")
        try:
            out[int(rank)] = int(code)
        except ValueError:
            raise ScaletrainError(f"--exit-code {it!r} is not RANK=CODE (e.g. 3=-9)") from None
    return out


def cmd_diagnose(args: argparse.Namespace) -> int:
    from scaletrain.engine.doctor.diagnosis import diagnose_paths
    from scaletrain.engine.run.plan_document import read_plan_document

    plan = read_plan_document(args.plan, flag="--plan") if args.plan else None
    diag = diagnose_paths([Path(p) for p in args.logs], plan, exit_codes=_exit_codes(args.exit_code))
    if args.json:
        print(json.dumps(diag.to_json(), indent=2))
    else:
        print_diagnosis(diag, sys.stdout)
    return 0


def print_diagnosis(diag: Any, out: TextIO) -> None:
    """Plain text: kind, summary, evidence, remedies with their predicted numbers (all from the Diagnosis)."""
    from scaletrain.engine.units import fmt_bytes, fmt_seconds

    where = "".join(f" {k} {v}" for k, v in (("rank", diag.rank), ("gpu", diag.gpu)) if v is not None)
    print(f"{diag.kind}{where}: {diag.summary}", file=out)
    if diag.evidence:
        print("evidence:", file=out)
        for line in diag.evidence:
            print(f"  {line}", file=out)
    for s in diag.secondary:
        print(f"  also: {s}", file=out)
    if diag.remedies:
        print("remedies:", file=out)
    for i, r in enumerate(diag.remedies, 1):
        nums = []
        if r.predicted_per_gpu_bytes is not None:
            nums.append(f"{fmt_bytes(r.predicted_per_gpu_bytes)}/GPU" + ("" if r.fits is None else
                                                                     (" fits" if r.fits else " still over")))
        if r.predicted_step_seconds is not None:
            nums.append(f"step {fmt_seconds(r.predicted_step_seconds)}")
        if r.effective_batch is not None:
            nums.append(f"batch {r.effective_batch}")
        manual = "" if r.applicable else " [manual]"
        print(f"  {i}. {r.title}{manual}" + (f"  ({', '.join(nums)})" if nums else ""), file=out)
        if r.changes:
            print("     " + ", ".join(f"{k}={v}" for k, v in r.changes.items()), file=out)


# ---- monitor ---------------------------------------------------------------------------------------------------
def _configure_monitor(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (running or finished)")
    p.add_argument("--interval", type=float, default=None, metavar="S", help="sampling interval, seconds (default 1)")
    p.add_argument("--headless", action="store_true", help="plain lines instead of the full-screen monitor")
    p.add_argument("--replay", metavar="SAMPLES_JSONL", help="show recorded NVML samples instead of live NVML")
    p.add_argument("--once", action="store_true", help="headless: print one snapshot and exit")


def cmd_monitor(args: argparse.Namespace) -> int:
    from scaletrain.engine.sampling.gpu import DEFAULT_INTERVAL_S
    from scaletrain.engine.sampling.sampler import make_sampler

    interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    sampler = make_sampler(args.run_dir, interval, replay=args.replay)
    if args.headless or args.once:
        return stream_run(sampler, sys.stdout, once=args.once)
    from scaletrain.tui.monitor.app import create_monitor_app

    app = create_monitor_app(args.run_dir, sampler=sampler)
    app.run()
    return int(app.return_code or 0)


class HeadlessPrinter:
    """Turns Ticks into plain lines: one per new step, device lines every HEADLESS_DEVICE_EVERY_S and whenever
    the run's processes change (a rank appears or exits), warnings once."""

    def __init__(self, out: TextIO, predicted_peak_bytes: int | None = None):
        self.out = out
        self.predicted = predicted_peak_bytes
        self.last_step: int | None = None
        self.last_device_s = -1e9
        self.warned: set[str] = set()
        self.state: str | None = None
        self.procs: tuple = ()

    def __call__(self, t: Any) -> None:
        job = t.job
        if job is not None and job.summary is not None:
            for rec in job.new_steps:           # every step once, in order (a resumed run repeats none)
                if self.last_step is None or rec.step > self.last_step:
                    self.last_step = rec.step
                    self.out.write(step_line(rec, job.summary) + "\n")
        now = time.monotonic()
        procs = tuple((p.rank, p.pid, p.alive) for p in t.host.procs) if t.host is not None else ()
        if now - self.last_device_s >= HEADLESS_DEVICE_EVERY_S or procs != self.procs:
            self.procs = procs
            self.last_device_s = now
            for line in device_lines(t, self.predicted):
                self.out.write(line + "\n")
        for w in (job.warnings if job is not None else ()):
            if w not in self.warned:
                self.warned.add(w)
                self.out.write(f"warning: {w}\n")
        if job is not None and job.status.state != self.state:
            self.state = job.status.state
            if self.state in ("finished", "failed"):
                code = job.status.exit_code
                self.out.write(f"run {self.state}" + (f": exit code {code}" if code is not None else "") + "\n")
        self.out.flush()


def bar(fraction: float, cells: int = PROGRESS_BAR_CELLS) -> str:
    fraction = min(1.0, max(0.0, fraction))
    full = int(round(fraction * cells))
    return "[" + "#" * full + "." * (cells - full) + "]"


def step_line(rec: Any, summary: Any) -> str:
    """One step record, with the ETA from the recent mean step time (engine.metrics.summarize)."""
    from scaletrain.engine.units import fmt_seconds

    frac = rec.step / rec.total_steps if rec.total_steps else 0.0
    eta = max(0, rec.total_steps - rec.step) * summary.step_seconds
    return (f"step {rec.step}/{rec.total_steps} {bar(frac)} {frac:4.0%}  loss {rec.loss:.4f}  "
            f"tok/s {rec.tokens_per_second:,.0f}  step {fmt_seconds(rec.step_seconds)}  ETA {fmt_seconds(eta)}")


def device_lines(t: Any, predicted: int | None) -> list[str]:
    from scaletrain.engine.units import fmt_bytes

    out = []
    g = t.gpu
    if g is not None and g.available:
        for s in g.gpus:
            if s.error:
                out.append(f"gpu{s.index} ERROR: {s.error}")
                continue
            na = "N/A"
            mem = (f"{fmt_bytes(s.memory_used_bytes)}/{fmt_bytes(s.memory_total_bytes)}"
                   if s.memory_used_bytes is not None and s.memory_total_bytes else na)
            pred = f" (pred {fmt_bytes(predicted)})" if predicted else ""
            power = (f"{s.power_w:.0f}/{s.power_limit_w:.0f} W" if s.power_w is not None and s.power_limit_w
                     else (f"{s.power_w:.0f} W" if s.power_w is not None else na))
            util = f"{s.utilization_pct}%" if s.utilization_pct is not None else na
            temp = f"{s.temperature_c}°C" if s.temperature_c is not None else na
            out.append(f"gpu{s.index} util {util} mem {mem}{pred} {temp} {power}")
        for m in g.migs:
            used = fmt_bytes(m.memory_used_bytes) if m.memory_used_bytes is not None else "N/A"
            total = fmt_bytes(m.memory_total_bytes) if m.memory_total_bytes else "N/A"
            out.append(f"  gpu{m.parent_index}/mig{m.mig_index} mem {used}/{total}")
    elif g is not None:
        out.append(f"gpus: {g.reason or 'no NVML'}; host numbers below")
    h = t.host
    if h is not None:
        cpu = f"{h.cpu_percent:.0f}%" if h.cpu_percent is not None else "N/A"
        out.append(f"host cpu {cpu} mem {fmt_bytes(h.memory_used_bytes)}/{fmt_bytes(h.memory_total_bytes)}"
                   if h.memory_total_bytes else "host: N/A")
        for p in h.procs:
            if not p.alive:
                out.append(f"  rank {p.rank} pid {p.pid} exited")
            elif p.rss_bytes is not None:
                pc = f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "N/A"
                out.append(f"  rank {p.rank} pid {p.pid} cpu {pc} rss {fmt_bytes(p.rss_bytes)}")
    if t.job is not None:
        for m in t.job.memory:
            if m.measured_bytes is not None:
                pred = f" (predicted {fmt_bytes(m.predicted_bytes)})" if m.predicted_bytes else ""
                out.append(f"  rank {m.rank} peak {m.what}: {fmt_bytes(m.measured_bytes)}{pred}")
    return out


def stream_run(sampler: Any, out: TextIO, *, once: bool = False, diagnose_failure: bool = True) -> int:
    """Headless monitor: print until the run finishes (or ^C). A failed run ends with the doctor's diagnosis."""
    from scaletrain.engine.sampling.sampler import run_is_over

    job = sampler.job
    printer = HeadlessPrinter(out, job.predicted_peak_bytes if job is not None else None)
    stop = threading.Event()
    last: list[Any] = []

    def on_tick(t: Any) -> None:
        last[:] = [t]
        printer(t)

    try:
        if once:
            on_tick(sampler.tick())
        else:
            sampler.run(on_tick, stop, until=run_is_over)
    except KeyboardInterrupt:
        stop.set()
    finally:
        sampler.close()
    t = last[0] if last else None
    if t is not None and t.job is not None and t.job.status.state == "failed" and diagnose_failure:
        from scaletrain.engine.doctor.diagnosis import diagnose_paths

        print_diagnosis(diagnose_paths([job.run.path]), out)
        return 1
    return 0


register("diagnose", "classify a failed run from its logs and suggest fixes with predicted numbers",
         _configure_diagnose, cmd_diagnose)
register("monitor", "watch a run: per-GPU panels, job progress, failure doctor", _configure_monitor, cmd_monitor)

"""`scaletrain monitor RUN_DIR [--interval S] [--headless] [--replay FILE] [--once]`: the full-screen monitor, or
plain lines (a step line per step, device lines every HEADLESS_DEVICE_EVERY_S, warnings once, the doctor's verdict
when the run fails; `--once`: one snapshot, the latest step). A RUN_DIR that does not exist yet is waited for
("waiting for RUN_DIR"), then watched as usual. The sampler lives in the engine and is imported when the command runs (parsing any command
stays fast); the full-screen monitor is imported only when asked for.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.cli.diagnose import print_diagnosis
from scaletrain.tui.cli.plan_args import stated

if TYPE_CHECKING:
    from scaletrain.engine.run.metrics import MetricsSummary, StepMetrics
    from scaletrain.engine.sampling.job_view import JobView
    from scaletrain.engine.sampling.watcher import RankMemoryView
    from scaletrain.engine.sampling.sampler import Sampler, Tick

# Headless: device lines (GPU or host) are printed at most this often, step lines whenever a step lands.
HEADLESS_DEVICE_EVERY_S = 10.0
PROGRESS_BAR_CELLS = 24


def configure_monitor(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a run directory (running or finished; one that does not exist yet is waited for); "
                        "default: the newest running run launched on this machine (scaletrain runs)")
    p.add_argument("--interval", type=float, default=None, metavar="S", help=stated("sampling interval, seconds", "1"))
    p.add_argument("--headless", action="store_true",
                   help=stated("plain lines instead of the full-screen monitor", "off"))
    p.add_argument("--replay", metavar="SAMPLES_JSONL",
                   help=stated("show recorded NVML samples instead of live NVML", "live NVML"))
    p.add_argument("--once", action="store_true", help=stated("headless: print one snapshot and exit", "off"))


def cmd_monitor(args: argparse.Namespace) -> int:
    from scaletrain.engine.sampling.gpu import DEFAULT_INTERVAL_S
    from scaletrain.engine.sampling.sampler import make_sampler

    interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    if args.run_dir is None:
        args.run_dir = newest_running_dir(sys.stderr)
    # one snapshot reads what is there now: a folder that does not exist (yet) is an error, not waited for
    sampler = make_sampler(args.run_dir, interval, replay=args.replay, wait=not args.once)
    if args.headless or args.once:
        return stream_run(sampler, sys.stdout, once=args.once)
    from scaletrain.tui.monitor.app import create_monitor_app

    app = create_monitor_app(args.run_dir, sampler=sampler)
    app.run()
    say_detached(args.run_dir, sys.stdout)
    return int(app.return_code or 0)


def newest_running_dir(out: TextIO) -> str:
    """`scaletrain monitor` without a folder: the newest running run launched on this machine (one line if none)."""
    from scaletrain.engine.launch.registry import newest_running

    row = newest_running()
    if row is None:
        raise ScaletrainError("no run is running on this machine; give a run directory (`scaletrain runs` lists "
                              "every run launched here)")
    out.write(f"attaching to {row.path} (the newest running run)\n")
    return str(row.path)


def say_detached(run_dir: str, out: TextIO) -> None:
    """After the monitor closes: a run that is still going is said to keep training, with how to get back."""
    from scaletrain.tui.monitor.app import detached_note

    note = detached_note(run_dir)
    if note:
        out.write(note + "\n")


class HeadlessPrinter:
    """Turns Ticks into plain lines: one per new step, device lines every HEADLESS_DEVICE_EVERY_S and whenever
    the run's processes change (a rank appears or exits), warnings once."""

    def __init__(self, out: TextIO, predicted_peak_bytes: int | None = None,
                 planned: tuple[float | None, float | None] = (None, None), *, once: bool = False):
        self.out = out
        self.once = once                       # one snapshot: the latest step only, not the whole history
        self.predicted = predicted_peak_bytes
        self.planned = planned                 # the plan's step seconds and tokens/s
        self.last_step: int | None = None
        self.last_device_s = -1e9
        self.warned: set[str] = set()
        self.state: str | None = None
        self.procs: tuple = ()
        self.waiting: str | None = None
        self.tensorboard: str | None = None
        self.run: Any = None                   # the run directory (RunDir): its export is named once it finished

    def __call__(self, t: Tick) -> None:
        job = t.job
        if job is not None and job.waiting_for is not None:
            if job.waiting_for != self.waiting:     # said once, not every tick
                self.waiting = job.waiting_for
                self.out.write(job.waiting_for + "\n")
                self.out.flush()
            return
        if job is not None and job.tensorboard is not None and job.tensorboard != self.tensorboard:
            self.tensorboard = job.tensorboard
            self.out.write(f"tensorboard: {job.tensorboard}\n")
        if job is not None and job.summary is not None:
            for rec in job.new_steps[-1:] if self.once else job.new_steps:   # every step once, in order
                if self.last_step is None or rec.step > self.last_step:
                    self.last_step = rec.step
                    self.out.write(step_line(rec, job.summary, self.planned) + "\n")
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
            if job.status.over:
                code = job.status.exit_code
                ran = f"after {fmt_seconds(job.wall_seconds)}" if job.wall_seconds is not None else None
                said = ", ".join(x for x in (f"exit code {code}" if code is not None else None, ran) if x)
                self.out.write(f"run {self.state}" + (f": {said}" if said else "")
                               + (f" ({job.status.reason})" if job.status.reason else "") + "\n")
                from scaletrain.tui.views.progress import export_line     # rich: only when a run ends

                line = export_line(self.run) if self.state == "finished" and self.run is not None else None
                if line:
                    self.out.write(line + "\n")
        self.out.flush()


def bar(fraction: float, cells: int = PROGRESS_BAR_CELLS) -> str:
    fraction = min(1.0, max(0.0, fraction))
    full = int(round(fraction * cells))
    return "[" + "#" * full + "." * (cells - full) + "]"


def step_line(rec: StepMetrics, summary: MetricsSummary,
              planned: tuple[float | None, float | None] = (None, None)) -> str:
    """One step record, beside the plan's step time and tokens/s (engine.run.metrics.versus_plan), with the ETA from
    the recent mean step time (engine.run.metrics.summarize)."""
    from scaletrain.engine.run.metrics import versus_plan

    frac = rec.step / rec.total_steps if rec.total_steps else 0.0
    eta = summary.eta_after(rec)
    v = versus_plan(rec.step_seconds, rec.tokens_per_second, *planned)
    speed = (f"{v.tokens_text()}  {v.step_text()}" if v is not None
             else f"tok/s {rec.tokens_per_second:,.0f}  step {fmt_seconds(rec.step_seconds)}")
    ev = (f"  eval loss {rec.eval_loss:.4f} (ppl {rec.eval_perplexity:.4g})"
          if rec.eval_loss is not None and rec.eval_perplexity is not None else "")
    return (f"step {rec.step}/{rec.total_steps} {bar(frac)} {frac:4.0%}  loss {rec.loss:.4f}{ev}  {speed}  "
            f"ETA {fmt_seconds(eta)}")


def device_lines(t: Tick, predicted: int | None) -> list[str]:
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
        out.extend(job_lines(t.job.view, t.job.memory))
    return out


def job_lines(view: JobView | None, memory: tuple[RankMemoryView, ...]) -> list[str]:
    """The job: one summary line, each rank's peak beside the plan's (with its node), stragglers, imbalance."""
    if view is None or not view.cells:
        return []
    out = [view.summary_line] if view.summary_line else []
    what = {m.rank: m.what for m in memory}
    for c in view.cells:
        if c.measured_bytes is None:
            continue
        where = f"rank {c.rank}" + (f" node {c.node}" if c.node is not None else "")
        pred = f" (predicted {fmt_bytes(c.predicted_bytes)})" if c.predicted_bytes else ""
        share = f" {c.of_plan:.0%} of plan" if c.of_plan is not None else ""
        out.append(f"  {where} peak {what.get(c.rank, 'allocated')}: {fmt_bytes(c.measured_bytes)}{pred}{share}")
    out += [line for line in (view.stragglers_line, view.imbalance_line) if line]
    return out


def stream_run(sampler: Sampler, out: TextIO, *, once: bool = False, diagnose_failure: bool = True) -> int:
    """Headless monitor: print until the run finishes (or ^C). A failed run ends with the doctor's diagnosis."""
    from scaletrain.engine.doctor.diagnosis import diagnose_paths
    from scaletrain.engine.sampling.sampler import run_is_over

    job = sampler.job
    printer = HeadlessPrinter(out, once=once)
    printer.run = job.run if job is not None else None
    stop = threading.Event()
    last: list[Tick] = []

    def on_tick(t: Tick) -> None:
        last[:] = [t]
        doc = job.plan if job is not None else None       # read once the run directory exists (it may come later)
        if doc is not None and printer.predicted is None:
            printer.predicted = job.predicted_peak_bytes
            printer.planned = (doc.planned_step_seconds, doc.planned_tokens_per_second)
        if once and t.job is not None and job is not None and job.problems(t.job.status):
            return                          # one snapshot of a broken run directory: said once, as the error below
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
    if once and t is not None and t.job is not None and job is not None and job.problems(t.job.status):
        raise ScaletrainError("; ".join(job.problems(t.job.status)))   # said as warnings above; one line, exit 2
    if t is not None and t.job is not None and t.job.status.state == "failed" and diagnose_failure:
        try:
            print_diagnosis(diagnose_paths([job.run.path]), out, job.run.path)
        except ScaletrainError as e:          # e.g. no rank log was written: the run failed before it started
            out.write(f"no diagnosis: {e}\n")
        return 1
    return 0

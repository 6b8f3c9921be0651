"""Rich renderings of engine results for the plain CLI. Formatting only: every number comes from the Plan."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.model_notes import moe_line
from scaletrain.engine.units import fmt_bytes, fmt_count, fmt_params
from scaletrain.tui.views.plan_text import loop_words, objective_line, time_line

COMPONENT_STYLE = {
    "weights": "bright_blue", "gradients": "magenta", "optimizer": "yellow",
    "activations": "green", "logits": "red", "overhead": "grey50",
}


def _console() -> Console:
    return Console(highlight=False)


def memory_bar(components: dict[str, int], capacity: int, usable: int, width: int = 48) -> Text:
    """One stacked bar of the components against the card ('·' free); '|' marks the headroom limit even when
    the bar runs past it, and cells beyond the card's capacity are drawn after a '▕' edge."""
    cells: list[tuple[str, str]] = []
    acc = 0.0
    for name, b in components.items():
        acc += b / capacity * width
        while len(cells) < int(round(acc)):
            cells.append(("█", COMPONENT_STYLE.get(name, "white")))
    over = cells[width:]
    cells = cells[:width] + [("·", "grey35")] * max(0, width - len(cells))
    line = min(width - 1, int(usable / capacity * width))
    cells[line] = ("|", "bold red" if cells[line][0] == "█" else "bold")
    text = Text()
    for ch, style in cells:
        text.append(ch, style=style)
    if over:
        text.append("▕", style="bold red")
        for ch, style in over[:width // 2]:
            text.append(ch, style=style)
    return text


def print_plan(plan: Plan, *, alternatives: bool = False, table: str | None = None) -> None:
    c = _console()
    s = plan.setup
    m = plan.memory
    hw = s.hardware
    c.print(f"[bold]{s.model.name}[/]  {fmt_count(s.model.params)} params, {fmt_count(s.trainable_params)} "
            f"trainable ({s.method}{'' if s.method == 'full' else f', r={s.lora_rank}'})")
    moe = moe_line(s)
    if moe:
        c.print(moe)
    if s.model.memory_source != "analytic":
        c.print(s.model.memory_source_line(), markup=False)
    c.print(f"[bold]{hw.describe()}[/]  {hw.gpu.name}, {hw.memory_text()}, "
            f"{hw.gpu.interconnect}{' (detected)' if hw.source == 'detected' else ''}")
    c.print(f"threads: {hw.threads_text()}", markup=False)
    c.print(f"{s.strategy}{'' if s.offload == 'none' else f' + offload {s.offload}'}, {s.precision_label}, "
            f"{s.optimizer_label}, attn {s.attn}, grad-ckpt {'on' if s.grad_ckpt else 'off'}, seq {s.seq_len}, "
            f"{loop_words(s)}{', loss chunked' if s.loss == 'chunked' else ''}")
    c.print(f"batch: micro {s.micro_batch} × accum {s.grad_accum} × {s.hardware.devices_text()} = "
            f"[bold]{s.effective_batch}[/] effective")
    if s.objective != "sft":
        c.print(objective_line(plan))
    t = Table(title=f"per-{s.hardware.device_noun} memory at the peak", show_edge=False, pad_edge=False)
    t.add_column("component")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    comps = m.components()
    for name, b in comps.items():
        t.add_row(Text(name, style=COMPONENT_STYLE[name]), fmt_bytes(b),
                  f"{100 * b / m.capacity_bytes:.1f}%")
        for comp, term, tb in m.terms:     # the objective's own terms inside this component
            if comp == name:
                t.add_row(Text(f"  {term}", style="grey62"), Text(fmt_bytes(tb), style="grey62"),
                          f"{100 * tb / m.capacity_bytes:.1f}%")
    t.add_row(Text("total", style="bold"), Text(fmt_bytes(m.total_bytes), style="bold"),
              f"{100 * m.total_bytes / m.capacity_bytes:.1f}%")
    c.print(t)
    c.print(memory_bar(comps, m.capacity_bytes, m.usable_bytes))
    verdict = ("[bold green]fits[/]" if m.fits else "[bold red]does not fit[/]")
    c.print(f"{verdict}: {fmt_bytes(m.total_bytes)} of {fmt_bytes(m.capacity_bytes)} "
            f"(limit {fmt_bytes(m.usable_bytes)} with {m.headroom_fraction:.0%} headroom; "
            f"{fmt_bytes(m.headroom_bytes)} spare); peak during {m.peak_phase}")
    if m.host_bytes_per_gpu:
        c.print(f"host RAM for offloaded states: {fmt_bytes(m.host_bytes_per_gpu)} per GPU")
    if plan.time is not None:
        _print_time(c, plan)
    if plan.explanation:
        c.print(f"[italic]{plan.explanation}[/]")
    for note in plan.notes:
        c.print(f"[yellow]note:[/] {note}")
    if alternatives or table:
        from scaletrain.tui.views.render_tables import print_extra_tables

        print_extra_tables(c, plan, alternatives=alternatives, table=table)


def _print_time(c: Console, plan: Plan) -> None:
    c.print(time_line(plan, emphasis=False))
    if plan.time is not None and plan.time.assumptions:
        c.print("[grey50]assumes: " + "; ".join(plan.time.assumptions) + "[/]")


def print_detection(res: DetectionResult) -> None:
    c = _console()
    if not res.gpus:
        c.print(f"no GPU detected: {res.error}. Plan for named hardware with --gpus, e.g. --gpus 4xH200.")
        return
    t = Table(title=f"driver {res.driver_version or 'N/A'}, CUDA {res.cuda_driver_version or 'N/A'}")
    for col in ("#", "name", "memory", "link", "MIG"):
        t.add_column(col)
    for g in res.gpus:
        t.add_row(str(g.index), g.name or "N/A",
                  fmt_bytes(g.memory_total_bytes) if g.memory_total_bytes else "N/A", g.interconnect,
                  "N/A" if g.mig_enabled is None else ("on" if g.mig_enabled else "off"))
    c.print(t)


def print_models(rows: list[dict[str, Any]]) -> None:
    c = _console()
    # ids and numbers are never cut or folded (a truncated id cannot be copied into --model; vocab 151936 was
    # printed as 15193 over 6); parameters as the wizard's list says them (7.62B; `models --json`: exact), so the
    # table fits 80 columns
    t = Table(title="model catalog", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1),
              collapse_padding=True)
    for col in ("id", "type", "params", "layers", "hidden", "vocab", "tied"):
        t.add_column(col, justify="right" if col in ("params", "layers", "hidden", "vocab") else "left",
                     no_wrap=col != "type", overflow="fold")
    for r in rows:
        t.add_row(r["id"], r["model_type"], fmt_params(r["params"]), str(r["layers"]), str(r["hidden_size"]),
                  str(r["vocab_size"]), "yes" if r["tied"] else "no")
    c.print(t)


def print_weights(source: str, warnings: list[str], data: str | None = None, rows: int | None = None, *,
                  note: str | None = None) -> None:
    """The weights and data a run starts from; the engine's warnings (random-init: testing only) in red, its note
    (weights not cached here yet) in yellow."""
    c = _console()
    c.print(f"weights: {source}" + (f"   data: {data} ({rows:,} rows)" if data and rows else ""), markup=False,
            highlight=False)
    for w in warnings:
        c.print(f"[bold red]warning:[/] {escape(w)}")
    if note:
        c.print(f"[yellow]note:[/] {escape(note)}")

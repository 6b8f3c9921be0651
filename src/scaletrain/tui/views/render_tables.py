"""Rich tables for `plan --alternatives` and `plan --table batch|gpus`. Formatting only: rows come from
scaletrain.engine.plan.tables (the same rows `plan --json` prints)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.rows import AlternativeRow, BatchRow, Choice, GpuRow
from scaletrain.engine.units import GiB, fmt_bytes, fmt_seconds
from scaletrain.tui.views.plan_text import OFFLOAD_MARK

_FIT = {True: Text("fits", style="green"), False: Text("no", style="red")}


def print_extra_tables(console: Console, plan: Plan, *, alternatives: bool = False, table: str | None = None) -> None:
    """Print what was asked for, as the plan carries it (the caller computes the tables: engine.plan.tables)."""
    if alternatives and plan.alternatives is not None:
        print_alternatives(console, plan.alternatives, plan)
    if plan.table is not None and table == "batch":
        print_batch_table(console, [r for r in plan.table.rows if isinstance(r, BatchRow)], plan)
    elif plan.table is not None and table == "gpus":
        print_gpus_table(console, [r for r in plan.table.rows if isinstance(r, GpuRow)], plan)


def _time_cells(row: Choice) -> tuple[str, str]:
    epoch = row.epoch_seconds
    return fmt_seconds(row.step_seconds), (fmt_seconds(epoch) if epoch else "—")


def _how(row: Choice) -> str:
    """Compact strategy label: zero3, zero3+opt (optimizer offload), fsdp+all (parameters too)."""
    return row.strategy + OFFLOAD_MARK[row.offload]


def _table(title: str, columns: list[tuple[str, str]]) -> Table:
    """Columns one space apart with a rule under the header: every cell starts (left) or ends (right) where its
    header does, whatever the widths (no cell glued to a border on one side and padded on the other)."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              padding=(0, 1), collapse_padding=True, min_width=len(title))      # the title on one line
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    return t


def print_alternatives(c: Console, rows: tuple[AlternativeRow, ...], plan: Plan) -> None:
    s = plan.setup
    t = _table(f"alternatives at effective batch {s.effective_batch}, fastest first",
               [("#", "right"), ("strategy", "left"), ("micro×accum", "right"), ("ckpt", "left"),
                (f"per {s.hardware.device_noun}", "right"), ("step", "right"), ("epoch", "right"),
                ("tokens/s", "right")])
    for r in rows:
        step, epoch = _time_cells(r)
        t.add_row(("*" if r.chosen else "") + str(r.rank), _how(r), f"{r.micro_batch}×{r.grad_accum}",
                  "on" if r.grad_ckpt else "off", fmt_bytes(r.per_gpu_bytes), step, epoch,
                  f"{r.tokens_per_second:,.0f}", style="bold" if r.chosen else "")
    c.print(t)
    if not rows:
        c.print("no alternative fits")
    else:
        c.print("[grey50]strategy+opt / +all: optimizer / all states offloaded to CPU"
                + ("; * this plan" if any(r.chosen for r in rows) else "") + "[/]")


def print_batch_table(c: Console, rows: list[BatchRow], plan: Plan) -> None:
    s = plan.setup
    per = s.hardware.device_noun
    t = _table(f"micro batch vs per-{per} memory ({s.strategy}, gc {'on' if s.grad_ckpt else 'off'}, "
               f"seq {s.seq_len}, {s.hardware.describe()})",
               [("micro", "right"), ("accum", "right"), ("act+logits", "right"), (f"per {per}", "right"),
                ("fits", "left"), ("step", "right"), ("tokens/s", "right")])
    for r in rows:
        accum = ("" if r.keeps_effective_batch else "!") + str(r.grad_accum)
        t.add_row(("*" if r.current else "") + str(r.micro_batch), accum,
                  fmt_bytes(r.activations_bytes + r.logits_bytes), fmt_bytes(r.per_gpu_bytes),
                  _FIT[r.fits], fmt_seconds(r.step_seconds), f"{r.tokens_per_second:,.0f}",
                  style="bold" if r.current else "")
    c.print(t)
    if rows:
        note = f"limit {fmt_bytes(rows[0].usable_bytes)} per {per}; * this plan"
        if not all(r.keeps_effective_batch for r in rows):
            note += f"; ! micro batch does not divide {s.effective_batch // s.world_size} per {per} (batch changes)"
        c.print(f"[grey50]{note}[/]")


# Below this width the GPU table leaves out each card's memory (the GPU's name says it): every other column fits 80
# columns whole (each was cut to "179…", "2.0…", "0.0028/…" there).
GPUS_TABLE_FULL_WIDTH = 100


def print_gpus_table(c: Console, rows: list[GpuRow], plan: Plan) -> None:
    """A row per GPU kind × count: the plan that fits (green) or why none does (grey); the epoch column only when
    the run's length is known, the memory column on a wide terminal."""
    s = plan.setup
    epochs = any(r.choice is not None and r.choice.epoch_seconds for r in rows)
    memory_col = c.width >= GPUS_TABLE_FULL_WIDTH
    cols = [("GPU", "left"), *([("memory", "right")] if memory_col else []), ("GPUs", "right"), ("plan", "left"),
            ("per GPU", "right"), ("step", "right"), *([("epoch", "right")] if epochs else []),
            ("USD/h", "right"), ("cost", "right")]
    t = _table(f"GPUs × count at effective batch {s.effective_batch} ({s.model.name} {s.method}, seq {s.seq_len})",
               cols)
    plan_col = t.columns[2 + memory_col]
    plan_col.max_width, plan_col.overflow = 16, "ellipsis"       # "zero1+opt 1×3 gc"; a reason is cut
    for r in rows:
        count = f"{r.nodes}×{r.gpus_per_node}" if r.nodes > 1 else str(r.gpus_per_node)
        head = [r.gpu, *([f"{r.gpu_memory_bytes / GiB:.0f} GiB"] if memory_col else []), count]
        ch = r.choice
        if ch is not None:
            step, epoch = _time_cells(ch)
            how = f"{_how(ch)} {ch.micro_batch}×{ch.grad_accum}{' gc' if ch.grad_ckpt else ''}"
            t.add_row(*head, Text(how, style="green"), fmt_bytes(ch.per_gpu_bytes), step,
                      *([epoch] if epochs else []), *_cost_cells(r))
        else:
            t.add_row(*head, Text(r.reason or "", style="grey50"), *[""] * (len(cols) - len(head) - 1))
    c.print(t)
    c.print("[grey50]plan: strategy(+opt/+all offload) micro×accum, gc = gradient checkpointing (green: fits; grey: "
            "why nothing fits); USD/h: the GPUs' on-demand price per hour; cost: the plan's steps at that pace (per "
            "step without --dataset-size)[/]")


def _cost_cells(r: GpuRow) -> tuple[str, str]:
    """The row's price per hour and its total (or per-step) cost, in the price's currency; '-' without a price."""
    from scaletrain.engine.plan.cost import money

    cost = r.cost
    if cost is None or cost.per_hour is None:
        return ("-", "-")
    if cost.total is not None:
        return (money(cost.per_hour), money(cost.total))
    return (money(cost.per_hour), f"{money(cost.per_step)}/step")

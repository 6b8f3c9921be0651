"""Step 4: the plan — per-GPU memory by component, fit, time, the planner's alternatives, and what-if keys."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.rows import AlternativeRow
from scaletrain.tui.views import plan_text
from scaletrain.tui.wizard.screen_base import WizardStep
from scaletrain.tui.widgets.memory_bars import MemoryBars
from scaletrain.tui.wizard.state import is_current, pick_alternative, plan_what_if, what_if


def _plain(renderable: Group | Text) -> str:
    parts = renderable.renderables if isinstance(renderable, Group) else [renderable]
    return "\n".join(p.plain if isinstance(p, Text) else repr(p) for p in parts)


def _height(static: Static, region: Region) -> int:
    """The content height the Static will take: its text's rows at this width, at least its CSS min-height."""
    rows = static.get_content_height(region.size, region.size, region.width)
    floor = static.styles.min_height
    return max(rows, int(floor.value)) if floor is not None and floor.is_cells else rows


class PlanScreen(WizardStep):
    STEP = 4
    HELP = """
## Step 4 · Plan
The engine's plan for your choices. The bar is **per-GPU memory at the predicted peak**, stacked by component
(weights, gradients, optimizer states, activations, logits, overhead) against the card's capacity; `|` marks the
limit that keeps the headroom free. Below: fit verdict, time per step / epoch / total, and the planner's reason.
**What-if keys** recompute instantly: `+`/`-` micro batch (keeps the effective batch), `c` gradient checkpointing,
`z` strategy (DDP → ZeRO-1 → 2 → 3 → FSDP), `o` offload (none → optimizer → all), `m` bf16 weights only (full
fine-tuning), `p` precision (bf16 → fp16 → fp32), `x` optimizer (adamw → adamw-8bit → sgd), `i` its implementation
(fused → foreach → for-loop), `a` attention (eager → sdpa → flash), `t` objective, `k` chunked loss. **Pins**: choices
a preset or you fixed; when the planner's best with them free is faster or leaner, "pins:" says which and what they
cost, and `u` unpins them all. Host RAM and disk are weighed beside GPU memory ("verdict:"). Headroom and the
inter-node link are on step 1. A what-if that does not fit is drawn over the line with the engine's message. "runs:" says how long
the run trains as the trainer will run it (a `train.max_steps` overrides the epochs). The **alternatives** table ranks what fits; `enter` on a row picks it.
"""
    BINDINGS = [
        Binding("plus,equals_sign", "what_if('micro+')", "micro", key_display="+/-",
                tooltip="micro batch up (+) or down (-), the effective batch kept"),
        Binding("minus", "what_if('micro-')", "micro −", show=False, tooltip="micro batch down"),
        Binding("u", "unpin", "unpin", tooltip="unpin: every planner choice free again (the planner's best)"),
        Binding("z", "what_if('zero')", "strategy", tooltip="strategy: DDP → ZeRO-1 → 2 → 3 → FSDP"),
        Binding("o", "what_if('offload')", "offload", tooltip="offload: none → optimizer → all"),
        Binding("c", "what_if('ckpt')", "ckpt", tooltip="gradient checkpointing on / off"),
        Binding("m", "what_if('master')", "bf16 weights", show=False,
                tooltip="bf16 weights only, no fp32 master copy (full fine-tuning)"),
        Binding("t", "what_if('objective')", "objective", show=False, tooltip="objective: sft → reward → dpo → grpo"),
        Binding("p", "what_if('precision')", "precision", show=False, tooltip="precision: bf16 → fp16 → fp32"),
        Binding("x", "what_if('optimizer')", "optimizer", show=False,
                tooltip="optimizer: adamw → adamw-8bit → sgd"),
        Binding("i", "what_if('impl')", "optimizer impl", show=False,
                tooltip="optimizer implementation: fused → foreach → for-loop"),
        Binding("a", "what_if('attn')", "attention", show=False, tooltip="attention: eager → sdpa → flash"),
        Binding("k", "what_if('loss')", "chunked loss", show=False, tooltip="loss: standard ↔ chunked"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.alternatives: tuple[AlternativeRow, ...] = ()
        self._shown: dict[str, Any] = {}               # what each Static shows now (plain text), to skip no-ops
        self.entry_plan: Plan | None = None            # the plan this step opened with (its explanation stays)
        self.recompute_seconds: list[float] = []     # UI-thread cost of each what-if (bench_wizard reads it)
        self.recompute_cpu_seconds: list[float] = []

    def body(self) -> ComposeResult:
        # Blocks whose height never changes come first, so a what-if repaints them in place and the table below
        # does not move (Textual then re-renders only what changed); the variable-length text comes last.
        with VerticalScroll(id="body"):
            yield Static("", id="plan-head")
            yield MemoryBars(id="bars")
            yield Static("", id="plan-fit")
            yield Static("", id="pins")
            yield DataTable(id="alternatives", cursor_type="row", zebra_stripes=True)
            yield Static("", id="whatif", markup=False)
            yield Static("", id="plan-why")

    def on_mount(self) -> None:
        table = self.query_one("#alternatives", DataTable)
        table.border_title = plan_text.ALTERNATIVES_TITLE
        table.add_columns(*plan_text.alternative_columns(self.wizard.plan))
        table.focus()
        self.show_plan(self.wizard.plan)
        if self.wizard.plan is not None:
            self.load_alternatives(self.wizard.plan)

    # ---- drawing ---------------------------------------------------------------------------------------------
    def show_plan(self, plan: Plan | None, message: str | None = None) -> None:
        if plan is None:
            self._update("#plan-head", Text("no plan", style="red"))
            return
        self._update("#plan-head", Group(
            plan_text.model_line(plan), plan_text.hardware_line(plan),
            Text.assemble(plan_text.batch_line(plan), " · ", plan_text.setup_line(plan))))
        hw = plan.setup.hardware
        self.query_one(MemoryBars).show(plan.memory, plan.setup.world_size, hw.device_noun, hw.devices_text())
        fit = [plan_text.objective_line(plan)] if plan.setup.objective != "sft" else []
        st = self.wizard.state
        fit.append(plan_text.fit_line(plan))
        fit += plan_text.resource_lines(plan, st.train, st.request, run_dir=st.run_dir)
        fit += [x for x in (plan_text.run_time_line(plan, st.train), plan_text.lr_line(plan)) if x is not None]
        fit.append(plan_text.counted_line(plan, st.request, st.train))
        self._update("#plan-fit", Group(*fit))
        self.load_pins(st, plan)
        self._refresh_versus(plan)
        self._update("#plan-why", Group(*plan_text.why_lines(plan, self._why(plan))))
        self.show_message(message, error=bool(message))
        self.mark_current(plan)

    def _why(self, plan: Plan) -> str:
        """The planner's reasoning for the plan this step opened with: it stays put while what-ifs explore (a
        what-if's constrained solve would explain only itself), labelled once the plan on screen differs."""
        if self.entry_plan is None:
            self.entry_plan = plan
        first = self.entry_plan
        if not first.explanation or plan.setup == first.setup:
            return first.explanation
        return f"the planner's pick (before what-ifs): {first.explanation}"

    def _update(self, selector: str, renderable: Group | Text) -> None:
        """Update a Static only when its text changed, and lay the screen out again only when its height did:
        a what-if usually changes numbers, not line counts, and a full reflow costs more than the repaint."""
        key = _plain(renderable)
        if self._shown.get(selector) == key:
            return
        self._shown[selector] = key
        static = self.query_one(selector, Static)
        static.update(renderable, layout=False)
        region = static.content_region
        if region.width <= 0 or _height(static, region) != region.height:
            static.refresh(layout=True)

    def show_message(self, message: str | None, *, error: bool = False) -> None:
        self.query_one("#whatif", Static).set_class(error and bool(message), "-error")
        self._update("#whatif", Text(message or ""))

    # ---- pins: what the fixed choices cost against the planner's best (a full search: off the UI thread) -------
    @work(thread=True, exclusive=True, group="pins")
    def load_pins(self, state, plan: Plan) -> None:
        from scaletrain.tui.wizard.state import pins_for

        try:
            cost, whose = pins_for(state, plan, self.wizard.detection)
        except Exception:  # the pins line is an extra: without it the plan step still works
            cost, whose = None, ""
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._show_pins, cost, whose)

    def _show_pins(self, cost, whose: str) -> None:
        if cost is None:
            text = Text("pins: none — the planner chose every split, strategy and offload", style="dim")
        elif cost.costs:
            text = Text.assemble(("pins: ", "bold yellow"), (cost.text(whose), "yellow"), ("; u: unpin", "bold"))
        else:
            text = Text.assemble(("pins: ", "bold"), cost.text(whose))
        self._update("#pins", text)

    def action_unpin(self) -> None:
        from scaletrain.tui.wizard.state import unpin

        plan = self.wizard.plan
        if plan is None:
            return
        state = unpin(self.wizard.state, plan)
        if state == self.wizard.state:
            self.show_message("nothing is pinned: the plan above is the planner's own pick")
            return
        self.recompute(state)

    # ---- alternatives ------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="alternatives")
    def load_alternatives(self, plan: Plan) -> None:
        """The planner's ranked table at this effective batch (a full search: off the UI thread)."""
        from scaletrain.engine.plan.tables import with_tables

        try:
            rows: tuple[AlternativeRow, ...] = with_tables(plan, alternatives=True).alternatives or ()
        except Exception:  # the table is an extra: without it the plan step still works
            rows = ()
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._fill_alternatives, rows)

    def _fill_alternatives(self, rows: tuple[AlternativeRow, ...]) -> None:
        self.alternatives = rows
        table = self.query_one("#alternatives", DataTable)
        columns = plan_text.alternative_columns(self.wizard.plan)
        if tuple(str(c.label) for c in table.columns.values()) != columns:      # the hardware went CPU <-> GPU
            table.clear(columns=True)
            table.add_columns(*columns)
        table.clear()
        for i, row in enumerate(rows):
            table.add_row(*plan_text.alternative_row(row, self.wizard.plan), key=str(i))
        table.display = bool(rows)
        self.mark_current(self.wizard.plan)

    def _refresh_versus(self, plan: Plan) -> None:
        """The 'vs the plan above' column follows the plan on screen (pure arithmetic on the rows)."""
        if not self.alternatives:
            return
        table = self.query_one("#alternatives", DataTable)
        column = table.ordered_columns[-1].key
        for i, row in enumerate(self.alternatives):
            table.update_cell(str(i), column, plan_text.alternative_row(row, plan)[-1])

    def mark_current(self, plan: Plan | None) -> None:
        """Name the row the plan now matches in the table's subtitle (the rows themselves stay as drawn)."""
        table = self.query_one("#alternatives", DataTable)
        if not self.alternatives:
            return
        rank = next((row.rank for row in self.alternatives if plan is not None and is_current(row, plan)), None)
        table.border_subtitle = (f"the plan above is #{rank}" if rank is not None
                                 else "the plan above is not among these")

    @on(DataTable.RowSelected, "#alternatives")
    def _picked(self, event: DataTable.RowSelected) -> None:
        row = self.alternatives[int(event.row_key.value)]
        self.recompute(pick_alternative(self.wizard.state, row))

    # ---- what-if ---------------------------------------------------------------------------------------------
    def action_what_if(self, change: str) -> None:
        plan = self.wizard.plan
        if plan is None:
            return
        try:
            state = what_if(self.wizard.state, plan, change)
        except ScaletrainError as e:
            self.show_message(str(e), error=True)
            return
        self.recompute(state)

    def recompute(self, state) -> None:
        """Engine call + redraw on the UI thread: one evaluation of a fixed setup takes about a millisecond."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            plan, refusal = plan_what_if(state, self.wizard.detection)
        except ScaletrainError as e:
            self.show_message(str(e), error=True)
            return
        self.wizard.state = state
        self.wizard.plan = plan
        self.show_plan(plan, refusal)
        self.recompute_seconds.append(time.perf_counter() - t0)
        self.recompute_cpu_seconds.append(time.thread_time() - c0)

    def action_next(self) -> None:
        plan = self.wizard.plan
        if plan is None:
            return
        if not plan.fits:
            self.show_message("this plan does not fit; change it with the what-if keys or pick an alternative first",
                              error=True)
            return
        self.wizard.advance(self.wizard.state, self.STEP)

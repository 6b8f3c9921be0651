"""The batch step's live panel: the solver's split, strategy, fit, time and LR suggestion for what is typed."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.catalog import traced
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.tui.views import plan_text


class SolverPanel(Static):
    """Shows the engine's plan for the current fields, or the engine's refusal."""

    def on_mount(self) -> None:
        self.border_title = "solver"
        self.update(Text("solving…", style="dim"))
        self.set_interval(0.5, self._tracing)

    def _tracing(self) -> None:
        """While the engine traces a family (its first plan here), say so instead of a silent "solving…"."""
        now = traced.tracing_now()
        if now is not None:
            what, seconds = now
            self.update(Text.assemble(
                (f"tracing {what} … {seconds:.0f} s\n", "bold"),
                ("a model family with no analytic layout is measured once (transformers imported, a slice built at "
                 "its real widths); later plans read the cache", "dim")))

    def show(self, plan: Plan | None, error: ScaletrainError | None) -> None:
        if plan is None:
            self.update(Text.assemble(("✗ ", "bold red"), (str(error) if error else "no plan", "red")))
            return
        lines = [plan_text.batch_line(plan), plan_text.setup_line(plan), plan_text.fit_line(plan)]
        for extra in (plan_text.time_line(plan), plan_text.lr_line(plan)):
            if extra is not None:
                lines.append(extra)
        lines += plan_text.why_lines(plan)
        self.update(Group(*lines))

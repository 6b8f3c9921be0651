"""The job's chart (textual-plotext): the whole run's loss, or tokens/s or step time against the plan's prediction.

Drawing only: the columns are engine.run.metrics.RunSeries (every step of metrics.jsonl, not a recent window), the
prediction is the plan's (plan.json's time section, carried in the series). `g` on the monitor cycles the chart.
"""

from __future__ import annotations

from typing import Any

from textual_plotext import PlotextPlot

# chart → (title, the measured column of RunSeries, the plan's value beside it)
CHARTS = {
    "loss": ("loss (every step)", "loss", None),
    "tokens": ("tokens/s, measured vs plan", "tokens_per_second", "planned_tokens_per_second"),
    "step": ("step time (s), measured vs plan", "step_seconds", "planned_step_seconds"),
}
CHART_ORDER = tuple(CHARTS)


class RunChart(PlotextPlot):
    """One plotext chart of the run so far; `kind` is one of CHART_ORDER."""

    DEFAULT_CLASSES = "run-chart"

    def __init__(self, kind: str = "loss", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.series: Any = None

    def cycle(self) -> str:
        self.kind = CHART_ORDER[(CHART_ORDER.index(self.kind) + 1) % len(CHART_ORDER)]
        self.draw()
        return self.kind

    def show(self, series: Any) -> None:
        """A new RunSeries (None before the first step)."""
        self.series = series
        self.draw()

    def draw(self) -> None:
        title, column, planned = CHARTS[self.kind]
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        s = self.series
        if s is None or not len(s):
            plt.title(f"{title}: no step yet")
        else:
            steps = list(s.steps)
            evals = column == "loss" and bool(getattr(s, "eval_steps", ()))
            plt.title(title + (" and eval loss" if evals else ""))
            plt.xlabel("step")
            plt.plot(steps, list(getattr(s, column)), marker="braille", label="measured")
            plan = getattr(s, planned) if planned else None
            if plan is not None:
                plt.plot(steps, [plan] * len(steps), marker="braille", label="plan")
            if evals:                       # the eval split's loss beside training's
                plt.plot(list(s.eval_steps), list(s.eval_loss), marker="dot", label="eval")
        self.refresh()

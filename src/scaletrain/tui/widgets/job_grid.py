"""The whole job (issue 23): nodes as rows, one cell per rank's GPU, from engine.sampling.job_view.JobView.

Two cell forms, picked by what fits the rows the grid may take:
  wide     "r12  97%  82%▼"  utilization, then the measured peak as a share of the plan's (▼ = the plan; red past it),
           with temperature and power appended when `t` asks for them;
  compact  "▆▇"            utilization and peak-of-plan as eighths blocks, several nodes side by side, so 16 nodes
           of 8 GPUs fit a 80×24 terminal in 6 rows. The summary line above names the highest peak in numbers.
The straggler and imbalance lines come from the engine as they are. Formatting only: no number is computed here.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.sampling.job_view import JobView, RankCell
from scaletrain.engine.units import fmt_bytes

BLOCKS = " ▁▂▃▄▅▆▇█"
NODE_LABEL = 4                 # "n15 "
WIDE_CELL = 13                 # "r127 97% 82%" + a space
DETAIL_CELL = 23               # … "  71°C 690W"
COMPACT_CELL = 2
GRID_SHARE = 0.35              # of the screen's rows, borders included (monitor.tcss .job-grid max-height)


def _block(fraction: float | None) -> str:
    if fraction is None:
        return "·"
    return BLOCKS[max(1, min(8, round(fraction * 8)))] if fraction > 0 else BLOCKS[1]


def _mem_style(c: RankCell) -> str:
    f = c.of_plan
    if f is None:
        return "dim"
    return "bold red" if f > 1.0 else ("yellow" if f > 0.9 else "green")


def _wide_cell(c: RankCell, detail: bool) -> Text:
    if not c.on_gpu:                   # a CPU run: the rank's peak RSS (no GPU, no share of the plan's tensors)
        rss = fmt_bytes(c.measured_bytes) if c.measured_bytes is not None else "N/A"
        return Text.assemble((f"r{c.rank:<4}", "bold red" if c.straggler else "dim"), (f"{rss:>8}", "cyan"))
    util = f"{c.utilization_pct:3.0f}%" if c.utilization_pct is not None else " N/A"
    mem = f"{c.of_plan:4.0%}" if c.of_plan is not None else "  N/A"
    t = Text.assemble((f"r{c.rank:<4}", "bold red" if c.straggler else "dim"), (util, "cyan"), " ",
                      (mem, _mem_style(c)), ("▼" if c.of_plan is not None else " ", "dim"))
    if detail:
        temp = f"{c.temperature_c:3.0f}°C" if c.temperature_c is not None else "  N/A"
        power = f"{c.power_w:4.0f}W" if c.power_w is not None else "  N/A"
        t.append(f" {temp} {power}", style="dim")
    return t


def _compact_cell(c: RankCell) -> Text:
    util = c.utilization_pct / 100.0 if c.utilization_pct is not None else None
    return Text.assemble((_block(util), "bold red" if c.straggler else "cyan"),
                         (_block(c.of_plan), _mem_style(c)))


def fitted(parts: tuple[str, ...], width: int) -> str:
    """As many of the parts (most important first) as fit `width` columns."""
    out = ""
    for p in parts:
        nxt = f"{out} · {p}" if out else p
        if len(nxt) > width and out:
            break
        out = nxt
    return out[:width]


def render_grid(view: JobView, width: int, max_rows: int, detail: bool = False) -> Text:
    """The nodes in at most `max_rows` lines (wide cells when they fit, else the compact blocks), `width` columns."""
    out = Text(no_wrap=True, overflow="ellipsis")
    room = max(1, max_rows)
    per_node = max(len(n.cells) for n in view.nodes)
    cell_w = DETAIL_CELL if detail else WIDE_CELL
    wide = len(view.nodes) <= room and NODE_LABEL + per_node * cell_w <= width
    if wide:
        for n in view.nodes:
            out.append(f"n{n.node if n.node is not None else '?':<3}", style="bold")
            for c in n.cells:
                out.append_text(_wide_cell(c, detail))
                out.append(" ")
            out.append("\n")
    else:
        seg = NODE_LABEL + per_node * COMPACT_CELL + 1
        across = max(1, width // seg)
        for i in range(0, len(view.nodes), across):
            for n in view.nodes[i:i + across]:
                out.append(f"n{n.node if n.node is not None else '?':<3}", style="bold")
                for c in n.cells:
                    out.append_text(_compact_cell(c))
                out.append(" " * (1 + (per_node - len(n.cells)) * COMPACT_CELL))
            out.append("\n")
    out.rstrip()
    return out


class JobGrid(Static):
    """Every rank of the job, shown once the job is more than this machine's GPUs (several nodes or ranks)."""

    DEFAULT_CLASSES = "job-grid"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.view: JobView | None = None
        self.detail = False            # temperature and power in the wide cells (`t`)

    def show_view(self, view: JobView | None, local_gpus: int) -> None:
        self.view = view
        many = view is not None and view.rank_count > 1 and (len(view.nodes) > 1 or view.rank_count > local_gpus)
        self.display = many
        if many:
            self._draw()

    def toggle_detail(self) -> None:
        self.detail = not self.detail
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        """The job's summary in the top border, stragglers and imbalance in the bottom one, the nodes between."""
        if self.view is None or not self.view.cells:
            return
        screen_h = self.app.size.height
        width = max(20, (self.size.width or self.app.size.width) - 4)
        self.border_title = fitted(self.view.summary_parts, width - 2)
        self.border_subtitle = " · ".join(x for x in (self.view.stragglers_line, self.view.imbalance_line) if x) \
            or "t: temperature and power"
        self.update(render_grid(self.view, width, max(2, int(screen_h * GRID_SHARE) - 2), self.detail))

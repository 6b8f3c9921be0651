"""The question the monitor asks before it applies a remedy: what changes, and y / n.

Formatting only: every number is the engine's (engine/launch/preview.RemedyPreview: the same re-plan apply_remedy
writes). Dismisses with True (y / enter: apply and relaunch) or False (n / esc: nothing is written).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from scaletrain.engine.units import fmt_bytes, fmt_seconds


def preview_table(p: Any, unit: str) -> Table:
    """field | before | → | after, then the plan's predicted memory and step time, then the effective batch."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="dim")
    for name, justify in (("", "left"), ("before", "right"), ("", "center"), ("after", "right")):
        t.add_column(name, justify=justify)     # type: ignore[arg-type]
    for f in p.fields:
        t.add_row(f.name, f.before, "→", Text(f.after, style="bold"))
    down = p.memory_after_bytes <= p.memory_before_bytes
    t.add_row(f"memory per {unit} (plan)", fmt_bytes(p.memory_before_bytes), "→",
              Text(fmt_bytes(p.memory_after_bytes), style="green" if down else "yellow"))
    faster = p.step_after_seconds <= p.step_before_seconds
    t.add_row("step time (plan)", fmt_seconds(p.step_before_seconds), "→",
              Text(fmt_seconds(p.step_after_seconds), style="green" if faster else "yellow"))
    if p.effective_batch_after != p.effective_batch_before:
        t.add_row("effective batch", str(p.effective_batch_before), "→", Text(str(p.effective_batch_after),
                                                                            style="yellow"))
    return t


class RemedyConfirm(ModalScreen[bool]):
    """Apply this remedy? The change, the plan's numbers before → after, where the relaunch resumes."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "Apply and relaunch"),
        Binding("n,escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, remedy: Any, preview: Any, unit: str = "GPU") -> None:
        super().__init__()
        self.remedy = remedy
        self.preview = preview
        self.unit = unit

    def compose(self) -> ComposeResult:
        p, r = self.preview, self.remedy
        with Vertical(id="confirm-box"):
            yield Static(Text.assemble(("Apply this remedy?  ", "bold"), (p.title, "bold cyan")), id="confirm-title")
            yield Static(preview_table(p, self.unit), id="confirm-table")
            nums = r.numbers(self.unit) if r is not None else []
            if nums and (r.memory_scale is not None or r.time_scale is not None):
                yield Static(Text("for this run, as measured: " + ", ".join(nums), style="dim"),
                             id="confirm-measured")
            yield Static(Text(p.resume_text, style="yellow" if p.needs_restart else "cyan"), id="confirm-resume")
            yield Static(Text("plan.json and the run's configs are rewritten; the old ones are kept in attempts/",
                              style="dim"), id="confirm-backup")
            yield Static(Text.assemble(("y", "bold"), " / ", ("enter", "bold"), " apply and relaunch    ",
                                       ("n", "bold"), " / ", ("esc", "bold"), " cancel (nothing is written)"),
                         id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

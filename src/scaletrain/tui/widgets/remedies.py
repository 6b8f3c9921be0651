"""The remedies panel: the doctor's diagnosis, its evidence, and the ranked remedies with predicted numbers.

Hidden until a diagnosis arrives. Up/down choose a remedy; the screen's `a` applies the highlighted one.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


EVIDENCE_LINES_SHOWN = 4
EVIDENCE_LINE_CHARS = 160


def remedy_label(r: Any) -> Text:
    t = Text(r.title, style="bold" if r.applicable else "dim")
    nums = r.numbers()
    if nums:
        t.append("  " + ", ".join(nums))
    if r.fits is not None:
        t.append("  fits" if r.fits else "  still over", style="green" if r.fits else "red")
    if not r.applicable:
        t.append("  (manual)", style="dim")
    elif r.changes:
        from scaletrain.engine.launch.relaunch import likely_resumes

        resumes = likely_resumes(r.changes, r.keeps_effective_batch)
        t.append("  resumes" if resumes else "  from step 0 (A)", style="cyan" if resumes else "yellow")
    return t


class RemediesPanel(Vertical):
    DEFAULT_CLASSES = "remedies-panel"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.diagnosis: Any = None

    def compose(self) -> ComposeResult:
        yield Static("", id="diag-summary")
        yield OptionList(id="remedy-list")

    def on_mount(self) -> None:
        self.display = False

    def show(self, diag: Any) -> None:
        self.diagnosis = diag
        head = Text.assemble(("failure: ", "bold red"), (diag.kind, "bold"))
        if diag.rank is not None:
            head.append(f"  rank {diag.rank}")
        if diag.node is not None:
            head.append(f"  node {diag.node}")
        if diag.gpu is not None:
            head.append(f"  gpu {diag.gpu}")
        body = Text.assemble(head, "\n", diag.summary)
        if diag.peers:
            body.append(f"\n{diag.peers}", style="yellow")
        for line in diag.evidence[-EVIDENCE_LINES_SHOWN:]:
            body.append("\n  " + line[:EVIDENCE_LINE_CHARS], style="dim")
        for note in diag.notes:
            body.append(f"\nnote: {note}", style="cyan")
        tip = ("↑/↓ choose, a apply and relaunch from the last checkpoint (A: from step 0)" if diag.remedies
               else "no remedy known")
        body.append(f"\n{tip}", style="italic")
        self.query_one("#diag-summary", Static).update(body)
        ol = self.query_one("#remedy-list", OptionList)
        ol.clear_options()
        ol.add_options([Option(remedy_label(r), id=f"remedy-{i}") for i, r in enumerate(diag.remedies)])
        if diag.remedies:
            ol.highlighted = 0
        self.display = True

    def hide(self) -> None:
        self.diagnosis = None
        self.display = False

    @property
    def selected(self) -> Any:
        if self.diagnosis is None or not self.diagnosis.remedies:
            return None
        i = self.query_one("#remedy-list", OptionList).highlighted
        return self.diagnosis.remedies[i] if i is not None else None

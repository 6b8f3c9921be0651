"""The remedies panel: the doctor's diagnosis, its evidence, and the ranked remedies with predicted numbers.

Hidden until a diagnosis arrives (or `d` asks on a healthy run: "no failure", no evidence). The list opens on the
first remedy and scrolls with the selection; beside it, the highlighted remedy's detail and the feedback of the
screen's keys (`a` asks before it applies: widgets/remedy_confirm.py), so an answer is never far from the list.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual import on
from textual.containers import Horizontal, Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


EVIDENCE_LINES_SHOWN = 4
EVIDENCE_LINE_CHARS = 160


def remedy_label(r: Any, unit: str = "GPU") -> Text:
    """One line per remedy (cut with … when narrow: the whole of it is beside the list), so the list scrolls by
    whole remedies."""
    t = Text(r.title, style="bold" if r.applicable else "dim", no_wrap=True, overflow="ellipsis")
    nums = r.numbers(unit)
    if nums:
        t.append("  " + ", ".join(nums))
    if r.fits is not None:
        t.append("  fits" if r.fits else "  still over", style="green" if r.fits else "red")
    if not r.applicable:
        t.append("  (manual)", style="dim")
    elif r.changes:
        from scaletrain.engine.launch.relaunch import likely_resumes

        resumes = likely_resumes(r.changes, r.keeps_effective_batch)
        t.append("  resumes" if resumes else "  from step 0", style="cyan" if resumes else "yellow")
    return t


def remedy_detail(r: Any, unit: str = "GPU") -> Text:
    """The highlighted remedy beside the list: what it changes, why it helps, what it predicts."""
    t = Text(r.title, style="bold")
    if r.detail:
        t.append(f"\n{r.detail}", style="")
    if r.changes:
        t.append("\nchanges: " + ", ".join(f"{k}={v}" for k, v in r.changes.items()), style="dim")
    nums = r.numbers(unit)
    if nums:
        t.append("\npredicts: " + ", ".join(nums))
    t.append("\n")
    t.append("a: see what changes, then apply (asks first)" if r.applicable
             else "a manual step: scaletrain cannot apply it", style="italic")
    return t


class RemediesPanel(Vertical):
    DEFAULT_CLASSES = "remedies-panel"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.diagnosis: Any = None
        self.feedback: Text | None = None
        self.healthy = False                       # showing "no failure" (d on a run that has not failed)
        self.unit = "GPU"                          # what a rank runs on: "process" on a CPU run

    def compose(self) -> ComposeResult:
        yield Static("", id="diag-summary")
        with Horizontal(id="remedy-body"):
            yield OptionList(id="remedy-list")
            yield Static("", id="remedy-side")

    def on_mount(self) -> None:
        self.display = False

    def show_healthy(self, text: str) -> None:
        """`d` on a run that has not failed: say so, quote nothing (its warnings are not a failure's evidence)."""
        self.diagnosis = None
        self.healthy = True
        self.feedback = None
        self.query_one("#diag-summary", Static).update(Text.assemble(
            ("no failure: ", "bold green"), text, ("\nthe doctor diagnoses a run by itself when it fails; "
                                                   "d closes this", "italic")))
        self.query_one("#remedy-body").display = False
        self.set_class(False, "-remedies")
        self.display = True

    def show(self, diag: Any) -> None:
        self.diagnosis = diag
        self.healthy = False
        self.feedback = None
        head = Text.assemble(("failure: ", "bold red"), (diag.kind, "bold"))
        if diag.rank is not None:
            head.append(f"  rank {diag.rank}")
        if diag.node is not None:
            head.append(f"  node {diag.node}")
        if diag.gpu is not None:
            head.append(f"  gpu {diag.gpu}")
        rows = [head, Text(diag.summary)]
        if diag.peers:
            rows.append(Text(diag.peers, style="yellow"))
        shown = 1 if self.has_class("-short") else EVIDENCE_LINES_SHOWN    # a short terminal: the last line
        rows += [Text("  " + line[:EVIDENCE_LINE_CHARS], style="dim", no_wrap=True, overflow="ellipsis")
                 for line in diag.evidence[-shown:]]
        rows += [Text(f"note: {note}", style="cyan") for note in diag.notes]
        rows.append(Text("↑/↓ choose · a: what it changes, then apply (asks first) · d closes" if diag.remedies
                         else "no remedy known; d closes this", style="italic", no_wrap=True, overflow="ellipsis"))
        self.query_one("#diag-summary", Static).update(Group(*rows))
        ol = self.query_one("#remedy-list", OptionList)
        ol.clear_options()
        ol.add_options([Option(remedy_label(r, self.unit), id=f"remedy-{i}") for i, r in enumerate(diag.remedies)])
        self.query_one("#remedy-body").display = bool(diag.remedies)
        self.set_class(bool(diag.remedies), "-remedies")
        self.display = True
        if diag.remedies:
            ol.highlighted = 0
            ol.scroll_to_highlight()
        self._side()

    def hide(self) -> None:
        self.diagnosis = None
        self.healthy = False
        self.display = False

    def say(self, text: str, style: str = "") -> None:
        """Feedback beside the list (a refusal, a cancelled or failed apply)."""
        self.feedback = Text(text, style=style)
        self._side()

    @on(OptionList.OptionHighlighted, "#remedy-list")
    def _highlighted(self) -> None:
        self.feedback = None
        self._side()

    def _side(self) -> None:
        r = self.selected
        body = remedy_detail(r, self.unit) if r is not None else Text()
        if self.feedback is not None:
            body.append("\n\n")
            body.append_text(self.feedback)
        self.query_one("#remedy-side", Static).update(body)

    @property
    def selected(self) -> Any:
        if self.diagnosis is None or not self.diagnosis.remedies:
            return None
        i = self.query_one("#remedy-list", OptionList).highlighted
        return self.diagnosis.remedies[i] if i is not None else None

"""The doctor in the monitor (a mixin of MonitorScreen): diagnose when the run fails or `d` asks, show the
remedies, and apply one only after a confirmation that shows what it changes.

`a` previews the highlighted remedy in a thread worker (engine/launch/preview.py: the same re-plan apply_remedy
writes), then asks (widgets/remedy_confirm.py); y applies it (plan.json rewritten, the old files kept in
attempts/) and relaunches, resuming from the last checkpoint when the change allows and from step 0 when the
confirmation said so; n leaves every file as it was. Feedback lands beside the list, the fix applied in the status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual import work
from textual.message import Message

from scaletrain.tui.widgets.remedies import RemediesPanel


@dataclass
class Diagnosed(Message):
    diagnosis: Any
    state: str = "unknown"             # the run's state when it was diagnosed
    asked: bool = False                # `d` asked (a healthy run then says "no failure"), not the run failing


@dataclass
class Previewed(Message):
    remedy: Any
    preview: Any


class DoctorFlow:
    """Needs from the screen: run, launching, diagnosed_failure, fix_note, last_tick, set_status, query_one, app."""

    run: Any
    launching: bool
    diagnosed_failure: tuple | None
    diagnosis: Any
    fix_note: str | None
    last_tick: Any
    unit: str
    set_status: Any
    query_one: Any
    app: Any
    post_message: Any
    _launch_blocking: Any

    def _maybe_diagnose(self, status: Any) -> None:
        """Diagnose each failed launch once, known by its launcher (pid and start) and start time: after a fix is
        applied, status.json still holds the old failure until the new launcher writes its own (a launcher slower to
        start than the relaunch waits for, or a tick read just before), and that failure is not shown again."""
        if status.state != "failed" or self.launching:
            return
        failure = (status.launcher_pid, status.launcher_start, status.started)
        if failure != self.diagnosed_failure:
            self.diagnosed_failure = failure
            self.diagnose()

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def diagnose(self, asked: bool = False) -> None:
        from scaletrain.engine.doctor.diagnosis import diagnose_paths
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.status import read_status

        try:
            d = diagnose_paths([self.run.path])
        except ScaletrainError as e:
            self.app.call_from_thread(self.set_status, f"diagnosis failed: {e}", "bold red")
            return
        self.post_message(Diagnosed(d, read_status(self.run.status).state, asked))

    def on_diagnosed(self, message: Diagnosed) -> None:
        panel = self.query_one(RemediesPanel)
        d = message.diagnosis
        if message.asked and d.kind == "finished":
            panel.show_healthy(d.summary)
            return
        if message.asked and d.kind == "unknown" and message.state in ("starting", "running"):
            panel.show_healthy(self._healthy_text(message.state))
            return
        self.diagnosis = d
        panel.unit = self.unit
        panel.show(d)
        if d.remedies:
            self.query_one("#remedy-list").focus()

    def _healthy_text(self, state: str) -> str:
        job = self.last_tick.job if self.last_tick is not None else None
        s = job.summary if job is not None else None
        where = f" at step {s.step}/{s.total_steps}" if s is not None else ""
        return {"starting": "the run is starting", "running": f"the run is running{where}"}[state]

    def action_diagnose(self) -> None:
        """`d`: open the doctor's verdict (a healthy run: "no failure"); `d` again closes it."""
        panel = self.query_one(RemediesPanel)
        if panel.display:
            panel.hide()
            return
        self.diagnose(asked=True)

    # ---- applying a remedy: preview, confirm, apply --------------------------------------------------------
    def action_apply(self) -> None:
        panel = self.query_one(RemediesPanel)
        r = panel.selected
        if r is None:
            self.set_status("no remedy to apply (the doctor runs when the run fails; d diagnoses now)", "yellow")
            return
        # a refusal in the status line too: at 80x24 the panel's feedback is below its visible lines
        refused = (f"“{r.title}” is a manual step; scaletrain cannot apply it" if not r.applicable else
                   "the run is still running; wait for it to stop before applying a remedy" if self.launching else
                   None)
        if refused:
            panel.say(refused, "yellow")
            self.set_status(refused, "yellow")
            return
        panel.say("working out what this changes…", "dim")
        self.preview(r)

    @work(thread=True, exclusive=True, group="preview", exit_on_error=False)
    def preview(self, remedy: Any) -> None:
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.preview import preview_remedy

        try:
            p = preview_remedy(self.run.path, remedy.changes, title=remedy.title)
        except ScaletrainError as e:
            self.app.call_from_thread(self.query_one(RemediesPanel).say, f"cannot apply: {e}", "bold red")
            return
        self.post_message(Previewed(remedy, p))

    def on_previewed(self, message: Previewed) -> None:
        from scaletrain.tui.widgets.remedy_confirm import RemedyConfirm

        remedy, p = message.remedy, message.preview

        def answered(yes: bool | None) -> None:
            panel = self.query_one(RemediesPanel)
            if not yes:
                panel.say("cancelled: nothing was changed (plan.json is as it was)", "yellow")
                return
            panel.say(f"applying “{remedy.title}”…", "bold")
            self.apply(remedy, p.needs_restart)

        self.app.push_screen(RemedyConfirm(remedy, p, self.unit), answered)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def apply(self, remedy: Any, restart: bool = False) -> None:
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.relaunch import apply_remedy

        self.launching = True
        try:
            applied = apply_remedy(self.run.path, remedy.changes, restart=restart, title=remedy.title)
        except ScaletrainError as e:
            self.launching = False
            self.app.call_from_thread(self.query_one(RemediesPanel).say, f"not applied: {e}", "bold red")
            return
        self.app.call_from_thread(self._applied, applied)
        self._launch_blocking(applied.resume, applied.env)

    def _applied(self, applied: Any) -> None:
        self.query_one(RemediesPanel).hide()
        self.fix_note = applied.summary
        self.set_status(applied.summary, "bold")

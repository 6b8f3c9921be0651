"""Starting and stopping the watched run from the monitor (a mixin of MonitorScreen).

Launching runs in a thread worker: by default the launcher starts in its own session (engine/launch/detach.py), so
`q` (or a closed terminal) leaves it training; with detach off it runs in the worker to the end and the screen
going away stops every rank. `s` asks, a second `s` stops every rank (esc keeps it running).
"""

from __future__ import annotations

from typing import Any

from textual import work


class RunControl:
    """Needs from the screen: run (RunDir), detach, fix_note, set_status, app, _stop."""

    run: Any
    detach: bool
    fix_note: str | None
    launching: bool
    launch_result: Any
    confirm_stop: bool
    set_status: Any                    # (text, style) → None: the screen's status line
    app: Any
    _stop: Any

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def launch(self, resume: bool, env: dict[str, str] | None = None) -> None:
        self._launch_blocking(resume, env)

    def _said(self, text: str) -> str:
        """The applied fix stays named in the status while the relaunch it caused is reported."""
        return f"{self.fix_note}; {text}" if self.fix_note else text

    def _launch_blocking(self, resume: bool, env: dict[str, str] | None) -> None:
        """Start the launcher in its own session (it outlives this screen) and say so; or, with detach off, run
        it here to the end (in a worker thread) and say how it ended."""
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.detach import start_detached
        from scaletrain.engine.launch.launcher import launch

        self.launching = True
        say = self.app.call_from_thread
        say(self.set_status, self._said("resuming from the last checkpoint…" if resume else "launching…"), "bold")
        if self.detach:
            try:
                d = start_detached(self.run.path, resume=resume, env=env)
            except ScaletrainError as e:
                say(self.set_status, self._said(f"launch failed: {e}"), "bold red")
                return
            finally:
                self.launching = False
            say(self.set_status, self._said(f"{'resumed' if resume else 'launched'} in the background (launcher pid "
                                            f"{d.pid}): q detaches and it keeps training, s stops it"), "bold")
            return
        try:
            # the screen going away (ctrl+q, app exit, a failed test) stops every rank: no orphans
            result = launch(self.run.path, resume=resume, env=env, stop=self._stop)
        except ScaletrainError as e:
            say(self.set_status, self._said(f"launch failed: {e}"), "bold red")
            return
        finally:
            self.launching = False
        self.launch_result = result
        msg = ("finished: exit code 0" if result.ok else
               f"stopped: exit code {result.exit_code}" + (f", first failing rank {result.first_failing_rank}"
                                                          if result.first_failing_rank is not None else ""))
        say(self.set_status, self._said(msg), "bold green" if result.ok else "bold red")

    def action_stop_run(self) -> None:
        """`s` asks, a second `s` stops every rank of the run (engine/launch/detach.stop_run); esc cancels."""
        from scaletrain.engine.launch.status import read_status

        st = read_status(self.run.status)
        if st.state not in ("starting", "running"):
            self.set_status(f"the run is not running ({st.state}); nothing to stop", "yellow")
            return
        if not self.confirm_stop:
            self.confirm_stop = True
            self.set_status("stop the run? every rank ends (it resumes from its last checkpoint with `scaletrain "
                            "launch RUN --resume`): press s again to stop, esc to keep it running", "bold yellow")
            return
        self.confirm_stop = False
        self.set_status("stopping every rank…", "bold")
        self.stop_run()

    @work(thread=True, exclusive=True, group="stop", exit_on_error=False)
    def stop_run(self) -> None:
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.detach import not_running, state_text, stop_run

        try:
            st, stopped = stop_run(self.run.path)
        except ScaletrainError as e:
            self.app.call_from_thread(self.set_status, f"not stopped: {e}", "bold red")
            return
        if not stopped:
            self.app.call_from_thread(self.set_status, f"the run is {not_running(st)}; nothing to stop", "yellow")
            return
        self.app.call_from_thread(self.set_status, f"stopped: every rank ended; status {state_text(st)}", "bold")


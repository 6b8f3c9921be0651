"""Issue 30, items 4 and 5, through Textual's pilot: a remedy is applied only after a confirmation that shows what
changes (cancelling leaves plan.json as it was; confirming rewrites it with a backup and relaunches in the
background, and `q` then leaves the relaunched run training); the remedy list opens on the first remedy and keeps
the selection in view; esc, ?, F1 and d behave as the help says; a run that is over shows no ETA.

The failed run is the cpu-tiny preset's real run directory with a rank log that ran out of host memory (the
doctor's real diagnosis and remedies); the relaunch is the real launcher, 2 gloo ranks.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from scaletrain.engine.launch.detach import stop_run
from scaletrain.engine.launch.preview import preview_remedy
from scaletrain.engine.launch.status import read_status
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.sampling.sampler import Sampler
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.widgets.help import HelpScreen
from scaletrain.tui.widgets.job_panel import JobPanel
from scaletrain.tui.widgets.remedies import RemediesPanel
from scaletrain.tui.widgets.remedy_confirm import RemedyConfirm
from test_detach import _alive, _run_processes
from test_monitor import cpu_run_dir, gpu_run_dir, text_of, wait_for

HOST_OOM = ("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
            "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1073741824 bytes.\n")


def failed_cpu_run(path: Path, max_steps: int = 6):
    """The cpu-tiny run directory after rank 1 ran out of host memory at step 1 (its log and status.json)."""
    rd = cpu_run_dir(path, max_steps=max_steps, checkpoint_every=100000)
    rd.logs.mkdir(exist_ok=True)
    rd.rank_log(0).write_text("step 1/6 loss 6.9\n")
    rd.rank_log(1).write_text("step 1/6 loss 6.9\n" + HOST_OOM)
    rd.status.write_text(json.dumps({"state": "failed", "exit_code": 1, "exit_codes": {"0": -15, "1": 1},
                                     "first_failing_rank": 1}))
    return rd


def app_for(rd, **kw):
    return create_monitor_app(rd.path, sampler=Sampler(None, None, RunWatcher(rd.path), 0.1), **kw)


def split_index(panel) -> int:
    return next(i for i, r in enumerate(panel.diagnosis.remedies) if r.changes == {"micro_batch": 1, "grad_accum": 8})


async def apply_the_split(pilot, timeout_s: float):
    """Pick the remedy that splits the micro batch, `a`, `y`: the relaunch said in the status line (returned)."""
    app = pilot.app
    panel = await remedies_shown(pilot)
    app.screen.query_one("#remedy-list").highlighted = split_index(panel)
    await pilot.press("a")
    await wait_for(pilot, lambda: isinstance(app.screen, RemedyConfirm), 30, "the confirmation")
    await pilot.press("y")
    status = app.screen.query_one("#mon-status")
    await wait_for(pilot, lambda: "in the background" in str(status.render()), timeout_s, "the relaunch")
    return panel, status


async def remedies_shown(pilot):
    panel = pilot.app.screen.query_one(RemediesPanel)
    await wait_for(pilot, lambda: panel.diagnosis is not None and panel.display, 60, "the automatic diagnosis")
    await pilot.pause(0.2)
    return panel


# ---- item 4: remedies ask first ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_remedy_list_opens_on_the_first_and_keeps_the_selection_in_view(tmp_path, size):
    rd = failed_cpu_run(tmp_path / "run")

    async def go():
        app = app_for(rd)
        async with app.run_test(size=size) as pilot:
            panel = await remedies_shown(pilot)
            ol = app.screen.query_one("#remedy-list")
            n = len(panel.diagnosis.remedies)
            assert n > 8 and ol.highlighted == 0 and app.focused is ol          # the first, chosen, focused
            side = app.screen.query_one("#remedy-side")
            assert panel.diagnosis.remedies[0].title in text_of(side)          # its detail beside the list
            for i in range(1, n):
                await pilot.press("down")
                await pilot.pause(0.05)
                top = ol.scroll_offset.y
                assert ol.highlighted == i
                assert top <= i < top + ol.scrollable_content_region.height, (i, top, ol.size)
                assert ol.region.bottom <= size[1] - 1                         # above the footer, on screen
                assert panel.diagnosis.remedies[i].title in text_of(side)
            assert "manual" in text_of(side)                                   # the last: "more host RAM"
            await pilot.press("a")
            await pilot.pause(0.3)
            assert "cannot apply" in text_of(side) and not isinstance(app.screen, RemedyConfirm)

    asyncio.run(go())


@pytest.mark.long
def test_apply_shows_the_change_and_cancel_leaves_plan_json_untouched(tmp_path):
    rd = failed_cpu_run(tmp_path / "run")
    before = rd.plan.read_bytes()
    preview = preview_remedy(rd.path, {"micro_batch": 1, "grad_accum": 8})      # the engine's numbers

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await remedies_shown(pilot)
            ol = app.screen.query_one("#remedy-list")
            ol.highlighted = split_index(panel)
            for cancel in ("n", "escape"):
                await pilot.press("a")
                await wait_for(pilot, lambda: isinstance(app.screen, RemedyConfirm), 30, "the confirmation")
                box = app.screen
                shown = "\n".join(text_of(w) for w in box.query("#confirm-box Static"))
                assert "Apply this remedy?" in shown and "micro batch 1 × accum 8" in shown
                assert "micro_batch" in shown and "grad_accum" in shown and "→" in shown
                assert "memory per process (plan)" in shown
                assert fmt_bytes(preview.memory_before_bytes) in shown
                assert fmt_bytes(preview.memory_after_bytes) in shown
                assert fmt_seconds(preview.step_before_seconds) in shown
                assert "starts from step 0 (no checkpoint yet)" in shown and "attempts/" in shown
                await pilot.press(cancel)
                await wait_for(pilot, lambda: not isinstance(app.screen, RemedyConfirm), 10, "the answer")
                assert "cancelled: nothing was changed" in text_of(app.screen.query_one("#remedy-side"))
                assert panel.display                                           # the list stays for another try
            assert rd.plan.read_bytes() == before and not (rd.path / "attempts").exists()

    asyncio.run(go())


def test_preview_numbers_are_the_plans_apply_writes(tmp_path):
    """The confirmation's after-numbers are those of the plan.json that confirming writes (one re-plan for both)."""
    from scaletrain.engine.launch.relaunch import apply_remedy

    rd = failed_cpu_run(tmp_path / "run")
    ck = rd.checkpoints / "step-4"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    p = preview_remedy(rd.path, {"micro_batch": 2, "grad_accum": 4})
    assert (p.resume_step, p.resume_from, p.needs_restart) == (4, "step-4", False)
    assert [(f.name, f.before, f.after) for f in p.fields] == [("micro_batch", "4", "2"), ("grad_accum", "2", "4")]
    blocked = preview_remedy(rd.path, {"seq_len": 64})
    assert blocked.needs_restart and blocked.resume_step is None and "seq_len" in blocked.resume_text
    apply_remedy(rd.path, {"micro_batch": 2, "grad_accum": 4})
    doc = read_plan_document(rd.plan)
    assert doc.predicted_total_bytes == p.memory_after_bytes
    assert doc.planned_step_seconds == pytest.approx(p.step_after_seconds)
    with pytest.raises(Exception, match="changes the hardware"):
        preview_remedy(rd.path, {"gpus": "4xCPU"})


@pytest.mark.slow
def test_confirmed_remedy_rewrites_with_backup_relaunches_and_q_leaves_it_running(tmp_path):
    """y: plan.json rewritten, the old one in attempts/, the run relaunched in its own session; the status names
    the fix; q leaves the monitor and the run keeps training (stopped at the end: no process left)."""
    rd = failed_cpu_run(tmp_path / "run", max_steps=100000)
    app = app_for(rd)
    said: dict[str, str] = {}

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            panel, status = await apply_the_split(pilot, 120)
            said["status"] = str(status.render())
            assert not panel.display
            await wait_for(pilot, lambda: read_status(rd.status).state == "running", 240, "the run to be running")
            await pilot.press("q")

    tree: dict[int, float] = {}
    try:
        asyncio.run(go())
        tree = _run_processes(rd)
        assert "applied micro batch 1 × accum 8 (was 4 × 2)" in said["status"]
        assert app.return_code == 0
        doc = read_plan_document(rd.plan)
        assert (doc.batch.micro_batch, doc.batch.grad_accum) == (1, 8)
        backups = list((rd.path / "attempts").iterdir())
        assert len(backups) == 1 and json.loads((backups[0] / "plan.json").read_text())["batch"]["micro_batch"] == 4
        time.sleep(2)
        assert read_status(rd.status).state == "running" and _alive(tree)     # the monitor is gone, the run is not
    finally:
        tree.update(_run_processes(rd))
        stop_run(rd.path)
        assert _alive(tree) == []


@pytest.mark.long                # a pilot through the doctor's panel, the confirmation and the apply: about 3 s
def test_the_old_failure_does_not_come_back_while_the_relaunched_launcher_has_not_written_its_status(tmp_path,
                                                                                                      monkeypatch):
    """After y, status.json holds the old failure until the relaunched launcher writes its own. A launcher slower to
    start than the relaunch waits for returns with that old state (detach._wait_running at its deadline), and every
    tick then reads the old failure: it was diagnosed again and the doctor's panel came back over the new run (the
    slow test above failed so once, a tick read just before the new status was handled just after). The apply is
    the real one (plan.json rewritten, the old one in attempts/); only the launcher's start is stood in for, as it
    returns when its wait runs out with status.json untouched, and no process is started."""
    from scaletrain.engine.launch import detach

    started: list[bool] = []

    def launcher_not_started_yet(run_dir, *, resume=False, env=None, **_):
        started.append(resume)
        path = Path(run_dir)
        return detach.Detached(path, 2 ** 22 + 1, read_status(path / "status.json").state, path / "launcher.log")

    monkeypatch.setattr(detach, "start_detached", launcher_not_started_yet)
    rd = failed_cpu_run(tmp_path / "run")
    app = app_for(rd)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            panel, status = await apply_the_split(pilot, 30)
            await pilot.pause(1.0)                  # ten ticks of the 0.1 s sampler, each reading the old failure
            assert started and read_status(rd.status).state == "failed"
            assert not panel.display and panel.diagnosis is None
            assert "applied micro batch 1 × accum 8" in str(status.render())

    asyncio.run(go())


# ---- item 5: the monitor's keys and states --------------------------------------------------------------------
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_esc_closes_the_doctor_then_leaves_never_a_blank_screen(tmp_path):
    rd = failed_cpu_run(tmp_path / "run")

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await remedies_shown(pilot)
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert not panel.display and app.is_running and len(app.screen_stack) == 1
            await pilot.press("escape")
            await pilot.pause(0.3)
            assert not app.is_running
        assert app.return_code == 0

    asyncio.run(go())


@pytest.mark.long
@pytest.mark.parametrize("key", ["question_mark", "f1"])
def test_help_lists_the_monitors_own_keys(tmp_path, key):
    rd = gpu_run_dir(tmp_path / "run")

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 10, "the help")
            md = app.screen.query_one("Markdown").source
            assert "Keys in the monitor" in md
            for k, what in (("q", "Detach"), ("l", "Log"), ("d", "Doctor"), ("h", "History"), ("a", "Apply fix"),
                            ("esc", "Back")):
                assert f"`{k}` {what}" in md, k
            assert "move between fields" not in md and "the wizard only lays" not in md    # not the wizard's
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, HelpScreen) and app.is_running

    asyncio.run(go())


def _dead_pid() -> int:
    """A process id that ran and was reaped: nothing alive has it (pids are not reused at once)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("written,said", [
    ({"state": "running"}, "its status.json says running but names no launcher process"),
    ({"state": "running", "pids": {"launcher": "dead"}}, "its status.json says running, but its launcher (pid "),
    ({"state": "finished", "exit_code": 0}, "not running (status: finished, exit code 0)"),
])
def test_stop_of_a_run_with_nothing_alive_says_why_in_the_cli_and_the_monitor(tmp_path, capsys, written, said):
    """`scaletrain stop` and the monitor's `s s` on a run nothing of which is alive: one line that says why, not
    "is not running (status: running)" (the CLI) or "stopped: every rank ended; status running" (the monitor)."""
    from scaletrain.tui.cli.main import main

    rd = gpu_run_dir(tmp_path / "run")
    if written.get("pids"):
        written = {**written, "pids": {"launcher": _dead_pid()}}
    rd.status.write_text(json.dumps(written))
    assert main(["stop", str(rd.path)]) == 0
    out = capsys.readouterr().out
    assert said in out and out.rstrip().endswith("; nothing to stop") and "stopped" not in out
    if written["state"] != "running":
        return

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.screen.query_one(JobPanel).last is not None, 10, "a tick")
            await pilot.press("s", "s")
            status = app.screen.query_one("#mon-status")
            await wait_for(pilot, lambda: "nothing to stop" in str(status.render()), 30, "the stop's answer")
            assert said in str(status.render()) and "stopped" not in str(status.render())

    asyncio.run(go())


@pytest.mark.parametrize("state", ["running", "finished"])
def test_d_on_a_healthy_run_says_no_failure_quotes_nothing_and_toggles(tmp_path, state):
    """Running, or finished with every rank's exit code 0: the doctor's verdict is "no failure" (a finished run's
    from the engine: how far and how long it ran)."""
    rd = gpu_run_dir(tmp_path / "run")
    warning = "UserWarning: TypedStorage is deprecated"
    rd.rank_log(0).write_text(f"rank 0 ready\n{warning}\nstep 2/4 loss 1.8\n")
    if state == "finished":
        rd.status.write_text(json.dumps({"state": "finished", "exit_code": 0, "exit_codes": {"0": 0, "3": 0},
                                         "started": "2026-12-03T15:01:25", "ended": "2026-12-03T15:01:55"}))

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            panel = app.screen.query_one(RemediesPanel)
            await wait_for(pilot, lambda: app.screen.query_one(JobPanel).last is not None, 10, "a tick")
            await pilot.press("d")
            await wait_for(pilot, lambda: panel.display, 30, "the doctor's answer")
            shown = text_of(app.screen.query_one("#diag-summary"))
            said = {"running": "the run is running at step 2/4",
                    "finished": "the run finished at step 2/4 after 30.0 s, every rank exited 0"}[state]
            assert "no failure" in shown and said in shown, shown
            assert "unknown" not in shown and warning not in shown
            await pilot.press("d")
            await pilot.pause(0.2)
            assert not panel.display

    asyncio.run(go())


@pytest.mark.parametrize("state,code", [("finished", 0), ("failed", 1), ("interrupted", 130), ("running", None)])
def test_a_run_that_is_over_shows_no_eta(tmp_path, state, code):
    """Over, it says how long the launch ran by its status's times (not the steps' 3 s: the model load, checkpoints
    and the export count too); a status without them says what the steps took, called that."""
    rd = gpu_run_dir(tmp_path / "run")
    for times in ({"started": "2026-12-03T15:01:25", "ended": "2026-12-03T16:03:25"}, {}):
        rd.status.write_text(json.dumps({"state": state, "exit_code": code, "host": "elsewhere", **times}))
        for size in ((120, 40), (80, 24)):
            async def go():
                app = app_for(rd)
                async with app.run_test(size=size) as pilot:
                    jp = app.screen.query_one(JobPanel)
                    await wait_for(pilot, lambda: jp.last is not None, 10, "a tick")
                    await pilot.pause(0.2)
                    shown = text_of(app.screen.query_one("#job-numbers"))
                    if state == "running":
                        # another host's clock: no wall time (the 80x24 line has room for the ETA only)
                        assert "ETA" in shown and ("3.0 s in steps" in shown or size == (80, 24)), shown
                    elif times:
                        assert "ETA" not in shown and ("after 62.0 min" in shown or "ran 62.0 min" in shown), shown
                    else:
                        assert "ETA" not in shown and "3.0 s in steps" in shown, shown

        asyncio.run(go())


def test_a_cpu_run_names_processes_not_gpus(tmp_path):
    rd = failed_cpu_run(tmp_path / "run")

    async def go():
        app = app_for(rd)
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await remedies_shown(pilot)
            ol = app.screen.query_one("#remedy-list")
            listed = "\n".join(str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count))
            assert "/process" in listed and "/GPU" not in listed
            assert "/GPU" not in text_of(app.screen.query_one("#remedy-side"))
            assert panel.unit == "process"

    asyncio.run(go())

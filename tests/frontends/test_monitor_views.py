"""Issue 30, item 6: see everything. The full-screen log (`l`: all ranks or one, follows the tail, scrolls, `/`
searches, progress bars folded) and the history view (`h`: each GPU's utilization, memory against the plan's
predicted line and power over the last minutes, the processes on it with their memory, each NVML field N/A on its
own) through Textual's pilot; NVML's per-process memory through a pynvml-shaped fake, as tests/engine/test_hardware.py.

No GPU here: tests/fixtures/nvml/synthetic_history_procs.jsonl is what the recorder writes from a scripted NVML
(tests/test_sampler.history_devices, checked there), not a real GPU's recording — two GPUs, per-process memory with
one N/A, one memory reading and a whole power series N/A — replayed by the real ReplaySource.
"""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

from scaletrain.engine.devices.nvml import sample
from scaletrain.engine.run.log_text import LogBook, progress_key, visible_text
from scaletrain.engine.sampling.gpu import GpuSnapshot, ReplaySource
from scaletrain.engine.sampling.sampler import Sampler
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.engine.units import fmt_bytes
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.monitor.history_screen import HistoryScreen
from scaletrain.tui.monitor.log_screen import LogScreen
from scaletrain.tui.widgets.gpu_history import GpuHistoryPanel
from scaletrain.tui.widgets.gpu_panel import GpuPanel
from scaletrain.tui.widgets.host_history import HostHistoryPanel
from scaletrain.tui.widgets.log_view import LogView
from test_hardware import FakeNvml
from test_monitor import NVML, gpu_run_dir, text_of, wait_for

TQDM = ("\rMap:   0%|          | 0/1000 [00:00<?, ? examples/s]\x1b[A"
        "\rMap:  45%|████▌     | 450/1000 [00:00<00:00, 4500.0 examples/s]")
GiB = 1 << 30


# ---- the log, as text --------------------------------------------------------------------------------------------
def test_progress_bars_fold_and_carriage_returns_resolve():
    assert visible_text(TQDM).startswith("Map:  45%|") and "\x1b" not in visible_text(TQDM)
    assert progress_key("Downloading shards:  50%|█████     | 1/2 [00:03<00:03]") == "Downloading shards"
    assert progress_key("step 3/10 loss 2.1 (45% done)") is None            # a percentage is not a bar
    b = LogBook()
    b.extend([(0, "loading"), (0, TQDM), (1, "rank 1 up")])
    done = "Map: 100%|██████████| 1000/1000 [00:00<00:00, 4500.0 examples/s]"
    appended, updated = b.extend([(0, done), (0, ""), (0, "step 1/4 loss 2.0"), (0, "")])
    assert updated and [e.text for e in appended] == ["step 1/4 loss 2.0", ""]   # a blank after a bar is its own
    lines = b.lines(0)
    assert [e.text[:9] for e in lines] == ["loading", "Map: 100%", "step 1/4 ", ""] and lines[1].folded == 1
    assert [e.text for e in b.lines(1)] == ["rank 1 up"] and b.ranks == {0, 1}


# ---- NVML's per-process memory -----------------------------------------------------------------------------------
class ProcNvml(FakeNvml):
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=41000, usedGpuMemory=3 * GiB), SimpleNamespace(pid=5555, usedGpuMemory=None),
                SimpleNamespace(pid=5556, usedGpuMemory=(1 << 64) - 1)]     # NVML_VALUE_NOT_AVAILABLE


def test_each_process_memory_is_read_alone_and_survives_a_recording():
    s = sample(ProcNvml(), 1)[0]
    assert s.pids == (41000, 5555, 5556) and s.pid_memory_bytes == (3 * GiB, None, None)
    snap = GpuSnapshot(s.time_s, (s,), ("H100",))
    back = GpuSnapshot.from_json(snap.to_json())
    assert back.gpus[0].pid_memory_bytes == (3 * GiB, None, None)
    junk = snap.to_json()
    junk["gpus"][0]["pid_memory_bytes"] = ["3", True, -1]                       # a hand-edited recording
    assert GpuSnapshot.from_json(junk).gpus[0].pid_memory_bytes == (None, None, None)


# ---- the full-screen log -----------------------------------------------------------------------------------------
@pytest.mark.long
def test_log_view_all_ranks_or_one_follows_searches_and_folds(tmp_path):
    rd = gpu_run_dir(tmp_path / "run")
    steps = "".join(f"step {i}/400 loss 2.0\n" for i in range(1, 300))
    rd.rank_log(0).write_text("rank 0 ready\n" + TQDM + "\n" + steps)
    rd.rank_log(1).write_text("rank 1 ready\nUserWarning: something harmless\n")

    async def go():
        app = create_monitor_app(rd.path, sampler=Sampler(None, None, RunWatcher(rd.path), 0.1))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.screen.query_one("#job-panel").last is not None, 10, "a tick")
            await pilot.pause(0.3)
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, LogScreen), 10, "the log view")
            await pilot.pause(0.3)
            view = app.screen.query_one(LogView)
            texts = [e.text for e in view.entries]
            assert "rank 1 ready" in texts and "step 299/400 loss 2.0" in texts          # all ranks, every line
            bars = [e for e in view.entries if e.bar]
            assert len(bars) == 1 and "45%" in bars[0].text                               # one line for the bar
            assert view.following and view.scroll_offset.y == view.max_scroll_y > 0       # at the tail
            with rd.rank_log(0).open("a") as f:                                           # the tail moves on
                f.write("step 300/400 loss 1.9\n")
            await wait_for(pilot, lambda: view.entries[-1].text == "step 300/400 loss 1.9", 10, "the new line")
            await pilot.pause(0.2)
            assert view.scroll_offset.y == view.max_scroll_y                              # … and is followed
            await pilot.press("home")
            await pilot.pause(0.2)
            assert view.scroll_offset.y == 0 and not view.following
            with rd.rank_log(0).open("a") as f:
                f.write("step 301/400 loss 1.9\n")
            await wait_for(pilot, lambda: view.entries[-1].text == "step 301/400 loss 1.9", 10, "another line")
            assert view.scroll_offset.y == 0                                              # reading: not pulled
            await pilot.press("slash")
            await pilot.press(*"harmless")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert len(view.matches) == 1 and view.entries[view.matches[0]].rank == 1
            assert "1 match" in text_of(app.screen.query_one("#log-title"))
            await pilot.press("r")                                                        # rank 0 alone
            await pilot.pause(0.2)
            assert {e.rank for e in view.entries} == {0} and not view.matches
            await pilot.press("r")
            await pilot.pause(0.2)
            assert {e.rank for e in view.entries} == {1}
            await pilot.press("end")
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, LogScreen) and app.is_running               # back on the monitor

    asyncio.run(go())


# ---- the history view --------------------------------------------------------------------------------------------
@pytest.mark.long
def test_history_shows_each_gpu_over_time_its_processes_and_na_alone(tmp_path):
    rd = gpu_run_dir(tmp_path / "run")

    async def go():
        src = ReplaySource(NVML / "synthetic_history_procs.jsonl", loop=False)
        app = create_monitor_app(rd.path, sampler=Sampler(src, None, RunWatcher(rd.path), 0.5))
        async with app.run_test(size=(120, 40)) as pilot:
            mon = app.screen
            await wait_for(pilot, lambda: mon.history.ticks >= 30, 60, "30 samples")
            panel0 = text_of(mon.query(GpuPanel).first())                  # the panel names each process's memory
            assert f"rank 0 (pid 41000) {fmt_bytes(int(7.3 * GiB))}" in panel0 and "other pid 5555  " in panel0
            await pilot.press("h")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 10, "the history view")
            await pilot.pause(0.3)
            p0, p1 = app.screen.query(GpuHistoryPanel)
            t0, t1 = text_of(p0), text_of(p1)
            assert "GPU 0" in t0 and re.search(r"the last 2\d\.\d s \(\d+ samples\)", t0)    # the minutes kept
            predicted = mon._sampler.job.predicted_peak_bytes
            assert f"the plan's predicted peak {fmt_bytes(predicted)}" in t0 and "─" in t0
            assert "rank 0" in t0 and "41000" in t0 and fmt_bytes(int(7.3 * GiB)) in t0    # its memory, last sample
            assert "another process" in t0 and "5555" in t0
            row = next(ln for ln in t0.splitlines() if "5555" in ln)
            assert "N/A" in row                                                       # that process's memory alone
            assert "power N/A" in " ".join(t1.split()) and " 54%" in t1 and " 97%" in t0   # N/A alone
            assert "41001" in t1 and fmt_bytes(int(5.5 * GiB)) in t1
            assert "·" in t0 and "·" not in t1                 # GPU 0's one memory reading N/A: a gap, marked
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert app.screen is mon

    asyncio.run(go())


def test_history_on_a_cpu_run_shows_the_processes(tmp_path):
    from test_monitor import cpu_run_dir

    rd = cpu_run_dir(tmp_path / "run")

    async def go():
        from scaletrain.engine.sampling.host import HostSource

        app = create_monitor_app(rd.path, sampler=Sampler(None, HostSource(), RunWatcher(rd.path), 0.1))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.history.ticks >= 2, 10, "two ticks")
            await pilot.press("h")
            await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 10, "the history view")
            await pilot.pause(0.3)
            t = text_of(app.screen.query_one(HostHistoryPanel))
            assert "No GPU history" in t and "host" in t and "no process of the run found yet" in t

    asyncio.run(go())

"""Sampler: NVML per-field failures, lost GPUs, MIG; recorded-sample replay; host stats; the run watcher.

No GPU on the CI hosts: NVML is exercised through a scripted stand-in for the pynvml module (the approach
gpustat's own tests take), and the replay fixtures in tests/fixtures/nvml are exactly what
`sampler.record()` writes for those scripted devices (test_fixtures_are_what_the_recorder_writes).
Host stats and the run watcher use real processes and real files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.run.metrics import MetricsWriter, RankMemory, StepMetrics
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.sampling.gpu import GpuSnapshot, NvmlSource, ReplaySource, record
from scaletrain.engine.sampling.host import HostSource
from scaletrain.engine.sampling.watcher import RunWatcher, memory_views
from scaletrain.engine.sampling.sampler import Sampler

NVML_FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"
GiB = 1024**3
T0 = 1763700000.0


class NVMLError(Exception):
    pass


class ScriptedNvml:
    """The pynvml calls the sampler makes, answering from per-device scripts; an Exception value is raised."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[dict], migs: dict | None = None):
        self.devices, self.migs, self.t = devices, migs or {}, 0

    def _v(self, v):
        v = v(self.t) if callable(v) else v
        if isinstance(v, Exception):
            raise v
        return v

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.devices[i].get("lost"):
            raise NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h):
        return self.devices[h]["name"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return NS(gpu=self._v(self.devices[h]["util"]))

    def nvmlDeviceGetMemoryInfo(self, h):
        if isinstance(h, tuple):
            m = self.migs[h[0]][h[1]]
            return NS(used=m["used"], total=m["total"], free=m["total"] - m["used"])
        d = self.devices[h]
        return NS(used=self._v(d["used"]), total=d["total"], free=d["total"] - self._v(d["used"]))

    def nvmlDeviceGetTemperature(self, h, kind):
        return self._v(self.devices[h]["temp"])

    def nvmlDeviceGetPowerUsage(self, h):
        return self._v(self.devices[h]["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._v(self.devices[h]["limit_mw"])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        """A pid, or (pid, usedGpuMemory) where the script gives the process's memory (None: N/A)."""
        pids = self.migs[h[0]][h[1]]["pids"] if isinstance(h, tuple) else self.devices[h]["pids"]
        return [NS(pid=p[0], usedGpuMemory=self._v(p[1])) if isinstance(p, tuple) else NS(pid=p) for p in pids]

    def nvmlDeviceGetMigMode(self, h):
        if h in self.migs:
            return (1, 1)
        raise NVMLError("Not Supported")

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return len(self.migs[h])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if self.migs[h][k] is None:
            raise NVMLError("Not Found")
        return (h, k)

    def nvmlShutdown(self):
        pass


def rtx4090(i: int) -> dict:
    return {"name": "NVIDIA GeForce RTX 4090", "total": 24564 * 1024**2,
            "util": lambda t, i=i: min(100, 60 + 4 * t + i),
            "used": lambda t, i=i: int(min(21.2 * GiB, (2 + 1.3 * t) * GiB) + i * 7 * 1024**2),
            "temp": lambda t, i=i: 45 + min(30, 2 * t) + (i % 3),
            "power_mw": lambda t, i=i: int(min(440, 120 + 25 * t) * 1000 + i * 1000),
            "limit_mw": 450_000, "pids": [41000 + i]}


def edge_devices() -> ScriptedNvml:
    """GPU 0 with unsupported util/power, GPU 1 lost, GPU 2 an A100 in MIG mode with a hole in its slots."""
    devices = [
        {**rtx4090(0), "util": NVMLError("Not Supported"), "power_mw": NVMLError("Not Supported")},
        {"lost": True},
        {"name": "NVIDIA A100-SXM4-80GB", "total": 80 * GiB, "util": NVMLError("Not Supported"),
         "used": lambda t: 30 * GiB, "temp": 51, "power_mw": 210_000, "limit_mw": 400_000, "pids": []},
    ]
    migs = {2: [{"used": 9 * GiB, "total": 19 * GiB + 512 * 1024**2, "pids": [42000]}, None,
                {"used": 1 * GiB, "total": 9 * GiB + 768 * 1024**2, "pids": []}]}
    return ScriptedNvml(devices, migs)


def history_devices() -> ScriptedNvml:
    """Two H100s for the history view: GPU 0's memory unreadable once (t = 13), its second process's memory N/A;
    GPU 1 with no power or temperature readings at all."""
    h100 = {"name": "NVIDIA H100 80GB HBM3", "total": 80 * GiB}
    devices = [
        {**h100, "util": lambda t: min(99, 7 + 3 * t),
         "used": lambda t: NVMLError("Unknown Error") if t == 13 else int((1.8 + 0.2 * t) * GiB),
         "temp": lambda t: 40 + t // 3, "power_mw": lambda t: (110 + 10 * t) * 1000, "limit_mw": 700_000,
         "pids": [(41000, lambda t: int((1.3 + 0.2 * t) * GiB)), (5555, None)]},
        {**h100, "util": lambda t: 50 + (t - 1) % 5, "used": 6 * GiB, "temp": NVMLError("Not Supported"),
         "power_mw": NVMLError("Not Supported"), "limit_mw": NVMLError("Not Supported"),
         "pids": [(41001, int(5.5 * GiB))]},
    ]
    return ScriptedNvml(devices)


class Ticking(NvmlSource):
    """Advance the script's clock once per read (the recorder's 1 Hz, without sleeping)."""

    def __init__(self, fake: ScriptedNvml):
        self.fake = fake
        super().__init__(loader=lambda: fake, now=lambda: T0 + fake.t)

    def read(self):
        self.fake.t += 1
        return super().read()


def _recorded(src: NvmlSource, n: int) -> list[str]:
    return [json.dumps(src.read().to_json()) for _ in range(n)]


def test_fields_fail_alone_lost_gpu_is_a_row_mig_under_parent():
    snap = Ticking(edge_devices()).read()
    g0, g1, g2 = snap.gpus
    assert g0.utilization_pct is None and g0.power_w is None          # N/A, field by field
    assert g0.memory_used_bytes > 0 and g0.temperature_c == 47 and g0.power_limit_w == 450.0
    assert g1.error and g1.memory_used_bytes is None                   # lost GPU: an error row, the rest goes on
    assert g2.memory_total_bytes == 80 * GiB
    assert [(m.parent_index, m.mig_index) for m in snap.migs] == [(2, 0), (2, 2)]   # slot 1 empty
    assert snap.migs[0].pids == (42000,)
    assert snap.names == ("NVIDIA GeForce RTX 4090", None, "NVIDIA A100-SXM4-80GB")


def test_no_nvml_is_an_answer_not_an_exception():
    def missing():
        raise NVMLError("NVML Shared Library Not Found")

    src = NvmlSource(loader=missing)
    snap = src.read()
    assert not src.available and not snap.available and "NVML Shared Library Not Found" in snap.reason


@pytest.mark.parametrize("name,script,n", [
    ("rtx4090x8_training.jsonl", lambda: ScriptedNvml([rtx4090(i) for i in range(8)]), 20),
    ("edge_na_lost_mig.jsonl", edge_devices, 5),
    ("synthetic_history_procs.jsonl", history_devices, 30),
])
def test_fixtures_are_what_the_recorder_writes(name, script, n):
    assert (NVML_FIXTURES / name).read_text().splitlines() == _recorded(Ticking(script()), n)


def test_record_then_replay_round_trip(tmp_path):
    src = Ticking(edge_devices())
    out = tmp_path / "rec.jsonl"
    assert record(out, seconds=0.35, interval_s=0.1, source=src) >= 3
    replay = ReplaySource(out, loop=False)
    first = replay.read()
    assert first == GpuSnapshot.from_json(json.loads(out.read_text().splitlines()[0]))
    assert first.gpus[1].error and first.migs[0].memory_used_bytes == 9 * GiB


def test_replay_loops_and_rejects_bad_files(tmp_path):
    r = ReplaySource(NVML_FIXTURES / "edge_na_lost_mig.jsonl")
    times = [r.read().time_s for _ in range(6)]
    assert times[5] == times[0]                                     # 5 samples, then from the start
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(ScaletrainError, match="not a recorded sample"):
        ReplaySource(tmp_path / "bad.jsonl")
    with pytest.raises(ScaletrainError, match="do not exist"):
        ReplaySource(tmp_path / "none.jsonl")


def test_host_source_finds_ranks_by_environment():
    # a launcher-like parent without RANK, a rank process (RANK=1, 64 MiB) and its worker (inherits RANK, small)
    worker = "import time; time.sleep(30)"
    rank = ("import os, subprocess, sys, time; x = bytearray(64 * 1024 * 1024); "
            f"subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(30)")
    launcher = ("import os, subprocess, sys; "
                f"subprocess.run([sys.executable, '-c', {rank!r}], env={{**os.environ, 'RANK': '1', 'LOCAL_RANK': '1'}})")
    parent = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    try:
        host = HostSource(root_pids=[parent.pid])
        deadline = time.monotonic() + 10
        ranks: dict = {}
        while time.monotonic() < deadline:
            snap = host.read()
            ranks = {p.rank: p for p in snap.procs}
            if 1 in ranks and ranks[1].rss_bytes and ranks[1].rss_bytes > 64 * 1024 * 1024:
                break
            host._last_discovery = -1e9
            time.sleep(0.2)
        assert ranks[1].rss_bytes > 64 * 1024 * 1024
        assert snap.memory_total_bytes > snap.memory_used_bytes > 0
        assert len(snap.procs) == 1                                 # the worker is not another rank
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()
    deadline = time.monotonic() + 5
    while host.read().procs[0].alive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p.alive for p in host.read().procs] == [False]


# ---- the run directory -----------------------------------------------------------------------------------------
@pytest.fixture
def gpu_plan_json() -> dict:
    return make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="2xRTX4090", strategy="ddp",
                                 micro_batch=2, grad_accum=4, grad_ckpt=True, offload="none",
                                 seq_len=1024)).to_json()


def _rec(step: int, alloc: int | None, rss: int = 500 * 1024**2) -> StepMetrics:
    return StepMetrics(step=step, total_steps=10, epoch=step / 10, loss=3.0 - 0.1 * step, lr=1e-4,
                       tokens_per_second=1000.0 + step, step_seconds=0.5, world_size=2, time=T0 + step,
                       tokens=2048, peak_memory=tuple(RankMemory(r, alloc, alloc, rss) for r in range(2)))


def test_run_watcher_incremental(tmp_path, gpu_plan_json):
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_json))
    (tmp_path / "logs").mkdir()
    w = RunWatcher(tmp_path)
    first = w.poll()
    assert first.summary is None and first.status.state == "starting"
    mw = MetricsWriter(tmp_path / "metrics.jsonl")
    for s in (1, 2, 3):
        mw.write(_rec(s, 1 * GiB))
    with open(tmp_path / "logs" / "rank-1.log", "w") as f:
        f.write("hello\npartial")
    snap = w.poll()
    assert (snap.summary.step, snap.summary.total_steps) == (3, 10)
    assert snap.losses == pytest.approx((2.9, 2.8, 2.7))
    assert snap.new_log_lines == ((1, "hello"),)                   # the unfinished line waits
    assert snap.summary.eta_seconds == pytest.approx(7 * 0.5)
    assert w.poll().new_log_lines == ()
    (tmp_path / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 137, "first_failing_rank": 1,
                                                      "exit_codes": {"0": -15, "1": -9},
                                                      "pids": {"launcher": 1, "0": 11, "1": 12}}))
    st = w.poll().status
    assert (st.state, st.first_failing_rank, st.exit_codes, st.rank_pids) == ("failed", 1, {0: -15, 1: -9},
                                                                               {0: 11, 1: 12})


def test_a_launch_s_wall_time_is_its_status_s_not_the_steps(tmp_path, gpu_plan_json):
    """The monitor said "finished after 82 ms" of a run that took 5 s: the steps' sum. The launch's wall time comes
    from its status (started to ended; to now while it runs on this host), the model load and the export included."""
    import socket
    from datetime import datetime

    from scaletrain.engine.launch.status import RunStatus

    here = socket.gethostname()
    over = RunStatus("finished", started="2026-12-03T15:01:25", ended="2026-12-03T15:01:30", host=here)
    assert over.wall_seconds() == 5.0 and over.wall_seconds(datetime(2030, 1, 1)) == 5.0
    running = RunStatus("running", started="2026-12-03T15:01:25", host=here)
    assert running.wall_seconds(datetime(2026, 12, 3, 15, 3, 25)) == 120.0 and running.wall_seconds() is None
    assert RunStatus("running", started="2026-12-03T15:01:25", host="another-host").wall_seconds(datetime.now()) is None
    for started, ended in ((None, None), ("yesterday", None), ("2026-12-03T15:01:25", "2026-12-03T15:01:20"),
                           ("2026-12-03T15:01:25", "not a time")):
        assert RunStatus("finished", started=started, ended=ended).wall_seconds(datetime.now()) is None
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_json))
    (tmp_path / "logs").mkdir()
    (tmp_path / "status.json").write_text(json.dumps(over.to_json()))
    assert RunWatcher(tmp_path).poll().wall_seconds == 5.0


def test_early_warning_before_the_oom(gpu_plan_json):
    mem = gpu_plan_json["memory"]
    pred = mem["allocated_peak_bytes"]
    margin = int(mem["capacity_bytes"] * mem["headroom_fraction"])
    ok = memory_views(PlanDocument.from_json(gpu_plan_json), _rec(1, pred + margin - 1).peak_memory)
    assert all(v.warning is None for v in ok) and ok[0].what == "allocated"
    over = memory_views(PlanDocument.from_json(gpu_plan_json), _rec(1, pred + margin + 1).peak_memory)
    assert over[0].warning and "over the predicted" in over[0].warning
    cpu = memory_views(PlanDocument.from_json(gpu_plan_json), _rec(1, None, rss=123).peak_memory)     # no allocator numbers: RSS
    assert cpu[0].what == "host RSS vs tensors" and cpu[0].measured_bytes == 123


def test_sampler_ticks_and_interval_check(tmp_path, gpu_plan_json):
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_json))
    s = Sampler(ReplaySource(NVML_FIXTURES / "rtx4090x8_training.jsonl"), None, RunWatcher(tmp_path), 0.1)
    t = s.tick()
    assert len(t.gpu.gpus) == 8 and t.job is not None and t.cost_seconds >= 0
    with pytest.raises(ScaletrainError, match="--interval"):
        Sampler(None, None, None, 0.01)

"""GPU catalog matching, --gpus parsing and the NVML boundary (replayed, since this machine has no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scaletrain.engine.devices.detect import hardware_from_detection
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import GPU_CATALOG, find_gpu, parse_gpus
from scaletrain.engine.devices.nvml import detect, sample

REQUIRED = ["H200", "H100-SXM", "H100-PCIe", "A100-80GB", "A100-40GB", "L40S", "A6000", "RTX4090", "RTX3090", "V100"]


def test_catalog_has_required_gpus_with_numbers():
    keys = {g.key for g in GPU_CATALOG}
    assert set(REQUIRED) <= keys
    for g in GPU_CATALOG:
        assert g.memory_bytes > 10 * 1024**3 and g.fp16_tflops > 0 and g.hbm_gbps > 0 and g.link_gbps > 0


@pytest.mark.parametrize("name,key", [
    ("h200", "H200"), ("H200", "H200"), ("NVIDIA H200", "H200"), ("4090", "RTX4090"), ("RTX4090", "RTX4090"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("rtx 3090", "RTX3090"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("Tesla V100-SXM2-32GB", "V100"), ("NVIDIA L40S", "L40S"), ("NVIDIA RTX A6000", "A6000"),
    ("NVIDIA B200", "B200"), ("8xB200", "B200"), ("NVIDIA A10", "A10"), ("Tesla T4", "T4"),
])
def test_forgiving_names(name, key):
    assert find_gpu(name).key == key


@pytest.mark.parametrize("text,per_node,nodes,key", [
    ("4xH200", 4, 1, "H200"), ("8xRTX4090", 8, 1, "RTX4090"), ("2x8xH100", 8, 2, "H100-SXM"), ("h100", 1, 1, "H100-SXM"),
    ("8x4090", 8, 1, "RTX4090"), ("2xCPU", 2, 1, "CPU"),
])
def test_parse_gpus(text, per_node, nodes, key):
    hw = parse_gpus(text)
    assert (hw.gpus_per_node, hw.nodes, hw.gpu.key) == (per_node, nodes, key)
    assert hw.world_size == per_node * nodes


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA A40", "NVIDIA L40", "NVIDIA H20", "NVIDIA T40"])
def test_a_card_whose_name_holds_a_shorter_catalog_name_is_not_taken_for_it(name):
    """'a10' inside 'a10g', 't4' inside 't40': another card with other numbers, refused in one line rather than
    planned with the wrong card's compute."""
    with pytest.raises(ScaletrainError, match="unknown GPU"):
        find_gpu(name)


def test_the_2026_cards_plan_with_their_own_memory_and_rates():
    """B200 (Blackwell, NVLink 5), A10 and T4 (no bf16: a bf16 plan is refused, fp16 is planned)."""
    from scaletrain.engine.estimate.time_constants import FLASH_EFFICIENCY, GEMM_EFFICIENCY, LINK_EFFICIENCY

    b200 = parse_gpus("8xB200").gpu
    assert b200.arch == "blackwell" and b200.memory_bytes == 183359 * 1024**2 and b200.link_gbps == 900
    assert {"blackwell", "turing"} <= set(GEMM_EFFICIENCY) & set(FLASH_EFFICIENCY)
    assert "nvlink5" in LINK_EFFICIENCY
    t4 = find_gpu("T4")
    assert t4.arch == "turing" and not t4.supports_bf16 and t4.peak_tflops("fp16") == 65.0


def test_parse_gpus_nodes_flag_and_conflicts():
    assert parse_gpus("8xH100", nodes=2).world_size == 16
    with pytest.raises(ScaletrainError, match="contradicts"):
        parse_gpus("2x8xH100", nodes=3)
    for bad in ("0xH100", "8xBanana", "", "x"):
        with pytest.raises(ScaletrainError):
            parse_gpus(bad)
    with pytest.raises(ScaletrainError, match="inter-node"):
        parse_gpus("2x8xH100", inter_node_gbps=0)


class FakeNvml:
    """A replay of what pynvml returns on a 2×H100 box, with one field that fails (as on some drivers)."""

    NVML_NVLINK_MAX_LINKS = 4

    class NVMLError(Exception):
        pass

    def __init__(self, fail_fields=()):
        self.fail = set(fail_fields)

    def _maybe(self, name, value):
        if name in self.fail:
            raise self.NVMLError(name)
        return value

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlSystemGetDriverVersion(self):
        return b"560.35.03"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12060

    def nvmlDeviceGetHandleByIndex(self, i):
        return self._maybe(f"handle{i}", i)

    def nvmlDeviceGetName(self, h):
        return self._maybe("name", "NVIDIA H100 80GB HBM3")

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._maybe("memory", SimpleNamespace(total=81559 * 1024**2, used=1024**3, free=80 * 1024**3))

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"0000:0{h}:00.0")

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._maybe("nvlink", 1)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetMigMode(self, h):
        return (0, 0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._maybe("util", SimpleNamespace(gpu=97, memory=40))

    def nvmlDeviceGetPowerUsage(self, h):
        return 612_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._maybe("temp", 61)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=1234, usedGpuMemory=1024**3)]


def test_detect_reads_every_field():
    res = detect(lambda: FakeNvml())
    assert res.error is None and res.driver_version == "560.35.03" and res.cuda_driver_version == "12.6"
    assert [g.name for g in res.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert res.gpus[0].nvlink_active_links == 4 and res.gpus[0].interconnect == "NVLink ×4"
    hw = hardware_from_detection(result=res)
    assert hw.gpu.key == "H100-SXM" and hw.gpus_per_node == 2 and hw.source == "detected"
    assert hw.gpu.memory_bytes == 81559 * 1024**2


def test_a_detected_card_outside_the_catalog_is_named_with_its_memory_and_the_cards_to_choose_from():
    class Unknown(FakeNvml):
        def nvmlDeviceGetName(self, h):
            return "NVIDIA RTX PRO 6000 Blackwell Server Edition"

    with pytest.raises(ScaletrainError) as e:
        hardware_from_detection(result=detect(lambda: Unknown()))
    line = str(e.value)
    assert "\n" not in line and "2× 'NVIDIA RTX PRO 6000 Blackwell Server Edition' (79.6 GiB)" in line
    assert "--gpus 2xNAME" in line and all(g.key in line for g in GPU_CATALOG)


def test_each_field_fails_alone():
    res = detect(lambda: FakeNvml(fail_fields={"name", "nvlink"}))
    g = res.gpus[0]
    assert g.name is None and g.memory_total_bytes is not None
    assert g.nvlink_active_links == 0  # NVLink unreadable, PCIe width readable → PCIe
    samples = sample(FakeNvml(fail_fields={"temp", "handle1"}), 2)
    assert samples[0].temperature_c is None and samples[0].utilization_pct == 97 and samples[0].power_w == 612.0
    assert samples[1].error and samples[1].utilization_pct is None


def test_no_driver_is_a_normal_answer():
    def boom():
        raise OSError("NVML Shared Library Not Found")

    res = detect(boom)
    assert res.gpus == () and "NVML" in res.error
    with pytest.raises(ScaletrainError, match="found no GPU"):
        hardware_from_detection(result=res)


def test_real_pynvml_path_does_not_crash_without_gpu():
    res = detect()  # the real pynvml import; on this machine there is no driver
    assert isinstance(res.gpus, tuple)
    if not res.gpus:
        assert res.error


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_the_cpu_device_s_processes_share_the_host_ram_they_plan_against(processes):
    """Each process of a CPU run plans against its share of the host's RAM: two processes of Qwen2.5-0.5B at
    micro 2 were planned at 11.36 GiB each "of 23.54 GiB", 22.72 GiB together over the host's 21.19 GiB limit."""
    from scaletrain.engine.catalog.hardware import CPU_DEVICE
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.units import fmt_bytes

    hw = parse_gpus(f"{processes}xCPU")
    assert hw.memory_per_process_bytes == CPU_DEVICE.memory_bytes // processes
    assert parse_gpus(f"{processes}xH100-SXM").memory_per_process_bytes == find_gpu("H100-SXM").memory_bytes
    assert ("for each of" in hw.memory_text()) == (processes > 1) and "host RAM" in hw.memory_text()
    try:
        plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus=f"{processes}xCPU", micro_batch=2,
                                     grad_accum=1, seq_len=1024, strategy="ddp", grad_ckpt=True))
    except ScaletrainError as e:       # more processes than the host's RAM holds (4 on 24 GiB)
        assert "nothing fits" in str(e) and f"over the {fmt_bytes(int(hw.memory_per_process_bytes * 0.9))}" in str(e)
        return
    assert plan.memory.capacity_bytes == hw.memory_per_process_bytes
    if plan.fits:            # the node's processes together within the host's limit
        assert processes * plan.memory.total_bytes <= CPU_DEVICE.memory_bytes * (1 - plan.memory.headroom_fraction)


def test_a_plan_names_its_ranks_by_what_they_run_on():
    """A CPU plan said "micro 4 × accum 2 × 2 GPUs" and "per-GPU memory" on a machine without a GPU; one GPU was
    "1 GPUs". The engine's device noun and count, in the explanation, the CLI and the wizard's lines."""
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.tui.views.plan_text import batch_line, fit_line

    assert parse_gpus("2xCPU").devices_text() == "2 processes" and parse_gpus("1xCPU").devices_text() == "1 process"
    assert parse_gpus("8xH100-SXM").devices_text() == "8 GPUs" and parse_gpus("1xH100-SXM").devices_text() == "1 GPU"
    assert parse_gpus("2x8xH100-SXM").devices_text() == "16 GPUs"
    cpu = make_plan(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", effective_batch=16, seq_len=128))
    assert "× 2 processes = 16" in cpu.explanation and "per process" in cpu.explanation and "GPU" not in cpu.explanation
    assert "× 2 processes = 16 effective" in batch_line(cpu).plain and " per process of " in fit_line(cpu).plain
    one = make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="1xH100-SXM", effective_batch=8))
    assert "× 1 GPU = 8" in one.explanation and "per GPU" in one.explanation

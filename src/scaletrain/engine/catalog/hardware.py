"""GPU catalog, forgiving name matching, and `--gpus` parsing.

Numbers are vendor datasheet values (dense, i.e. without 2:4 sparsity). Memory is what NVML reports as total
for the card (MiB × 2**20), because that is the ceiling the allocator actually sees. Link bandwidths are per GPU,
one direction, nominal; the time model applies its own achievable fractions (see timing.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from scaletrain.engine.errors import ScaletrainError

MiB = 1024**2


@dataclass(frozen=True)
class GpuSpec:
    key: str                 # stable id used in presets and JSON, e.g. "H100-SXM"
    name: str                # display name
    memory_bytes: int        # total device memory as NVML reports it
    bf16_tflops: float       # dense bf16 tensor-core peak (fp32 accumulate); 0 where bf16 is unsupported
    fp16_tflops: float       # dense fp16 tensor-core peak (fp32 accumulate)
    hbm_gbps: float          # device memory bandwidth, GB/s
    interconnect: str        # "nvlink5" | "nvlink4" | "nvlink3" | "nvlink2" | "pcie5" | "pcie4" | "pcie3"
    link_gbps: float         # intra-node GPU↔GPU bandwidth per GPU, one direction, GB/s (nominal)
    p2p: bool                # peer-to-peer over the link (GeForce cards have it disabled: traffic bounces via host)
    aliases: tuple[str, ...] = ()

    @property
    def supports_bf16(self) -> bool:
        return self.bf16_tflops > 0

    @property
    def arch(self) -> str:
        """GPU generation ("hopper", "ampere", "ada", "volta"; "cpu" for the host): kernels, workspaces and
        achievable efficiencies follow it. Cards outside the catalog fall back by their interconnect."""
        if self.key in GPU_ARCH:
            return GPU_ARCH[self.key]
        return {"nvlink5": "blackwell", "nvlink4": "hopper", "nvlink3": "ampere", "nvlink2": "volta", "loopback": "cpu"}.get(
            self.interconnect, "ampere")

    def peak_tflops(self, precision: str) -> float:
        """Dense tensor peak for the compute dtype; fp32 training runs matmuls in TF32 where available."""
        if precision == "bf16":
            return self.bf16_tflops or self.fp16_tflops
        if precision == "fp16":
            return self.fp16_tflops
        return self.fp16_tflops / 2  # TF32 tensor cores run at half the 16-bit rate on Ampere/Ada/Hopper


# Generation of each catalog card (NVIDIA architecture whitepapers).
GPU_ARCH = {
    "H200": "hopper", "H100-SXM": "hopper", "H100-PCIe": "hopper", "A100-80GB": "ampere", "A100-40GB": "ampere",
    "A6000": "ampere", "RTX3090": "ampere", "L40S": "ada", "RTX4090": "ada", "L4": "ada", "V100": "volta",
    "B200": "blackwell", "A10": "ampere", "T4": "turing", "CPU": "cpu",
}

# Sources: NVIDIA datasheets (H200 SXM, H100 SXM/PCIe, A100, L40S, RTX A6000, V100) and the Ada/Ampere GeForce
# whitepapers (RTX 4090: 165.2 dense fp16/bf16 TFLOP/s with fp32 accumulate; RTX 3090: 71 TFLOP/s).
# NVLink: 5th gen (B200) 1.8 TB/s bidirectional → 900 one way; 4th gen 900 → 450; 3rd gen 600 → 300; 2nd gen
# (V100 SXM2) 300 → 150.
# B200: HGX B200 datasheet (4.5 PFLOP/s bf16 with 2:4 sparsity per GPU → 2250 dense; 8 TB/s HBM3e); its memory as
# nvidia-smi reports it on an 8×B200 node (183359 MiB: NVIDIA/TensorRT-LLM issue #10278). A10 (125 TFLOP/s bf16
# dense, 600 GB/s) and T4 (65 TFLOP/s fp16 with fp32 accumulate, no bf16, 320 GB/s): their datasheets; their totals
# as nvidia-smi reports them (23028 and 15360 MiB: modal-labs/modal-client PR #2797).
# PCIe x16 one way: gen5 64 GB/s, gen4 32 GB/s, gen3 16 GB/s.
GPU_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec("H200", "NVIDIA H200 141GB (SXM)", 143771 * MiB, 989.4, 989.4, 4800, "nvlink4", 450, True,
            ("h200", "h200sxm", "h200141gbhbm3e", "gh200")),
    GpuSpec("H100-SXM", "NVIDIA H100 80GB (SXM)", 81559 * MiB, 989.4, 989.4, 3350, "nvlink4", 450, True,
            ("h100", "h100sxm", "h100sxm5", "h10080gbhbm3", "h100sxm580gb")),
    GpuSpec("H100-PCIe", "NVIDIA H100 80GB (PCIe)", 81559 * MiB, 756.0, 756.0, 2000, "pcie5", 64, True,
            ("h100pcie", "h100pcie80gb")),
    GpuSpec("A100-80GB", "NVIDIA A100 80GB (SXM)", 81920 * MiB, 312.0, 312.0, 2039, "nvlink3", 300, True,
            ("a100", "a10080gb", "a100sxm480gb", "a100sxm80gb", "a10080gbpcie")),
    GpuSpec("A100-40GB", "NVIDIA A100 40GB (SXM)", 40960 * MiB, 312.0, 312.0, 1555, "nvlink3", 300, True,
            ("a10040gb", "a100sxm440gb", "a100pcie40gb", "a10040gbpcie")),
    GpuSpec("L40S", "NVIDIA L40S 48GB", 46068 * MiB, 362.05, 362.05, 864, "pcie4", 32, True, ("l40s",)),
    GpuSpec("A6000", "NVIDIA RTX A6000 48GB", 49140 * MiB, 154.8, 154.8, 768, "pcie4", 32, True,
            ("a6000", "rtxa6000")),
    GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090 24GB", 24564 * MiB, 165.2, 165.2, 1008, "pcie4", 32, False,
            ("4090", "rtx4090", "geforcertx4090")),
    GpuSpec("RTX3090", "NVIDIA GeForce RTX 3090 24GB", 24576 * MiB, 71.0, 71.0, 936, "pcie4", 32, False,
            ("3090", "rtx3090", "geforcertx3090")),
    GpuSpec("V100", "NVIDIA V100 32GB (SXM2)", 32768 * MiB, 0.0, 125.0, 900, "nvlink2", 150, True,
            ("v100", "v10032gb", "v100sxm232gb", "teslav100sxm232gb", "v100sxm2")),
    GpuSpec("L4", "NVIDIA L4 24GB", 23034 * MiB, 121.0, 121.0, 300, "pcie4", 32, True, ("l4",)),
    GpuSpec("B200", "NVIDIA B200 180GB (SXM)", 183359 * MiB, 2250.0, 2250.0, 8000, "nvlink5", 900, True,
            ("b200", "b200sxm", "b200180gb", "hgxb200", "dgxb200")),
    GpuSpec("A10", "NVIDIA A10 24GB", 23028 * MiB, 125.0, 125.0, 600, "pcie4", 32, True, ("a10", "a10pcie")),
    GpuSpec("T4", "NVIDIA T4 16GB", 15360 * MiB, 0.0, 65.0, 320, "pcie3", 16, True, ("t4",)),
)



def _host_memory_bytes() -> int:
    """Total host RAM (Linux /proc/meminfo); a CPU 'device' plans against it, split over its processes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * 1024**3


def host_cores() -> int:
    """The cores this process may run on (its affinity mask: taskset, cgroups' cpusets, SLURM's --cpus-per-task), as
    `nproc` counts them; the node's cores a plan made on this machine divides among its processes."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_process(cores: int, processes: int) -> int:
    """CPU threads each process of a node gets (accelerate's --num_cpu_threads_per_process, OMP_NUM_THREADS): the
    node's cores shared evenly among its processes, at least one. The launcher (engine/run/scripts.py) and the
    time model both use this rule."""
    return max(1, cores // max(1, processes))


# The host CPU as a training "device" (gloo backend), for the offline demo, tests and CI. Its memory is the
# machine's RAM; its rate is a nominal fp32 figure for a few cores (the time model is not meant for it).
CPU_DEVICE = GpuSpec("CPU", "host CPU (gloo)", _host_memory_bytes(), 0.0, 0.2, 20, "loopback", 5, True,
                     ("cpu", "host"))

_BY_KEY = {g.key.lower(): g for g in (*GPU_CATALOG, CPU_DEVICE)}


def _norm(name: str) -> str:
    s = re.sub(r"[^a-z0-9]", "", name.lower())
    for noise in ("nvidia", "geforce", "tesla"):
        s = s.replace(noise, "")
    return s


def _alias_table() -> dict[str, GpuSpec]:
    table: dict[str, GpuSpec] = {}
    for g in (*GPU_CATALOG, CPU_DEVICE):
        for a in (g.key, *g.aliases):
            table[_norm(a)] = g
    return table


_ALIASES = _alias_table()


def find_gpu(name: str) -> GpuSpec:
    """Match a GPU name forgivingly: 'h200', 'NVIDIA H200', '4090', 'RTX4090', 'NVIDIA A100-SXM4-40GB'."""
    n = _norm(name)
    if not n:
        raise ScaletrainError(f"empty GPU name; known GPUs: {', '.join(g.key for g in GPU_CATALOG)}")
    if n in _ALIASES:
        return _ALIASES[n]
    # NVML names carry memory sizes and form factors: try the most specific catalog entry contained in the name.
    # Four characters at least: a shorter name inside a longer one is another card ('a10' in 'a10g', 't4' in 't40').
    hits = [(len(a), g) for a, g in _ALIASES.items() if len(a) >= 4 and (a in n or n in a and len(n) >= 4)]
    if hits:
        return max(hits, key=lambda t: t[0])[1]
    raise ScaletrainError(
        f"unknown GPU {name!r}; known GPUs: {', '.join(g.key for g in GPU_CATALOG)} (or a count like 4xH200)"
    )


# Inter-node links, Gb/s per node, one direction (nominal line rate of one port; a node with several NICs has their
# sum: give it with --inter-node-gbps). InfiniBand: EDR 100, HDR 200, NDR 400, XDR 800 Gb/s per 4x port (IBTA
# roadmap); Ethernet by its name. timing.py applies its achievable fraction (INTER_NODE_EFFICIENCY).
INTER_NODE_LINKS: dict[str, float] = {
    "edr": 100.0, "hdr": 200.0, "ndr": 400.0, "xdr": 800.0,
    "10gbe": 10.0, "25gbe": 25.0, "40gbe": 40.0, "50gbe": 50.0, "100gbe": 100.0, "200gbe": 200.0, "400gbe": 400.0,
}
MAX_INTER_NODE_GBPS = 100_000.0     # 100 Tb/s per node: far beyond any fabric; a larger number is a typo
DEFAULT_INTER_NODE_LINK = "hdr"       # one HDR InfiniBand port: the common GPU-cluster fabric of the A100 era


def inter_node_gbit_s(value: str | float | int) -> float:
    """--inter-node-gbps: a number of Gb/s (400) or a link name (ndr, hdr, 100gbe); one line on anything else."""
    accepted = f"a number of Gb/s (e.g. 400) or one of {', '.join(INTER_NODE_LINKS)}"
    if isinstance(value, str):
        if len(value) > 40:
            raise ScaletrainError(f"--inter-node-gbps {value[:40]!r}… is not accepted; give {accepted}")
        key = re.sub(r"[^a-z0-9.]", "", value.lower())
        if key in INTER_NODE_LINKS:
            return INTER_NODE_LINKS[key]
        number = re.sub(r"[\s_/]", "", value.lower())          # keep the sign: -5 is refused, not read as 5
        try:
            gbps = float(number.removesuffix("gbps").removesuffix("gbs").removesuffix("gb") or "nan")
        except ValueError:
            raise ScaletrainError(f"--inter-node-gbps {value!r} is not accepted; give {accepted}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScaletrainError(f"--inter-node-gbps {value!r} is not accepted; give {accepted}")
    else:
        gbps = float(value)
    if not 0 < gbps <= MAX_INTER_NODE_GBPS:
        raise ScaletrainError(f"--inter-node-gbps must be positive and at most {MAX_INTER_NODE_GBPS:,.0f} Gb/s "
                              f"(got {value}); give {accepted}")
    return gbps


@dataclass(frozen=True)
class Hardware:
    """What a plan runs on: one GPU kind, GPUs per node, nodes, and how nodes are linked."""

    gpu: GpuSpec
    gpus_per_node: int
    nodes: int = 1
    # Gb/s per node, one direction (--inter-node-gbps); default one HDR InfiniBand port
    inter_node_gbit_s: float = INTER_NODE_LINKS[DEFAULT_INTER_NODE_LINK]
    source: str = "catalog"         # "catalog" (planned) or "detected" (NVML)
    driver: str | None = None
    # CPU cores per node where the plan knows them: this machine's (host_cores) for CPU runs and --gpus auto; None
    # for named GPUs (the node is not known: the launcher divides the cores it finds there, at launch)
    host_cores: int | None = None

    @property
    def cpu_threads_per_process(self) -> int | None:
        """Threads each training process runs with (the launcher's rule), or None: decided at launch."""
        return None if self.host_cores is None else threads_per_process(self.host_cores, self.gpus_per_node)

    def threads_text(self) -> str:
        """'1 per process (2 cores ÷ 2 processes)', or 'decided at launch (the node's cores ÷ 8 processes)'."""
        per = "process" if self.gpus_per_node == 1 else "processes"
        if self.host_cores is None:
            return f"decided at launch (the node's cores ÷ {self.gpus_per_node} {per})"
        return (f"{self.cpu_threads_per_process} per process ({self.host_cores} cores ÷ {self.gpus_per_node} {per}"
                f"{' per node' if self.nodes > 1 else ''})")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def memory_per_process_bytes(self) -> int:
        """The memory each training process plans against: a GPU's own; the host's RAM shared by the node's
        processes on the CPU device (two processes of 11.36 GiB each on a 23.54 GiB host were planned as fitting,
        22.72 GiB together over its 21.19 GiB limit)."""
        if self.gpu.arch == "cpu":
            return self.gpu.memory_bytes // max(self.gpus_per_node, 1)
        return self.gpu.memory_bytes

    @property
    def device_noun(self) -> str:
        """What one rank runs on, as plans say it: 'GPU', or 'process' on the CPU device (a CPU plan said
        "micro 4 × accum 2 × 2 GPUs" on a machine without one)."""
        return "process" if self.gpu.arch == "cpu" else "GPU"

    def devices_text(self, n: int | None = None) -> str:
        """'8 GPUs', '1 GPU', '2 processes': n ranks (the world size when not given)."""
        from scaletrain.engine.units import counted

        return counted(self.world_size if n is None else n, self.device_noun)

    def memory_text(self) -> str:
        """'79.65 GiB each', or 'host RAM 23.54 GiB, 11.77 GiB for each of 2 processes'."""
        from scaletrain.engine.units import fmt_bytes

        each = fmt_bytes(self.memory_per_process_bytes)
        if self.gpu.arch != "cpu":
            return f"{each} each"
        if self.gpus_per_node == 1:
            return f"host RAM {each}"
        return f"host RAM {fmt_bytes(self.gpu.memory_bytes)}, {each} for each of {self.gpus_per_node} processes"

    def describe(self) -> str:
        head = f"{self.nodes}x" if self.nodes > 1 else ""
        return f"{head}{self.gpus_per_node}x{self.gpu.key}"

    def with_nodes(self, nodes: int) -> "Hardware":
        return replace(self, nodes=nodes)


MAX_NODES = 1 << 14
MAX_CPU_PROCESSES = 1024
_GPUS_RE = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(?:(\d+)\s*[x×*]\s*)?(.+?)\s*$", re.IGNORECASE)


def parse_gpus(text: str, *, nodes: int | None = None, inter_node_gbps: str | float | None = None) -> Hardware:
    """Parse `4xH200`, `8xRTX4090`, `2x8xH100` (nodes × GPUs per node) or a bare name (one GPU).

    `auto` is handled by the caller through nvml.detect(); it is not a catalog name.
    """
    m = _GPUS_RE.match(text or "")
    if not m or not m.group(3):
        raise ScaletrainError(f"cannot read --gpus {text!r}; accepted: auto, 4xH200, 8xRTX4090, 2x8xH100, H100")
    a, b, name = m.group(1), m.group(2), m.group(3)
    if name.lower() == "auto":
        raise ScaletrainError("--gpus auto must be resolved by detection first")
    gpu = find_gpu(name)
    if a and b:
        n_nodes, per_node = int(a), int(b)
    elif a:
        n_nodes, per_node = 1, int(a)
    else:
        n_nodes, per_node = 1, 1
    if nodes is not None:
        if a and b and nodes != n_nodes:
            raise ScaletrainError(f"--nodes {nodes} contradicts --gpus {text} ({n_nodes} nodes)")
        n_nodes = nodes
    if per_node < 1 or n_nodes < 1:
        raise ScaletrainError(f"GPU and node counts must be at least 1 (got {text!r}, nodes={n_nodes})")
    if n_nodes > MAX_NODES:
        raise ScaletrainError(f"{n_nodes:,} nodes is not a cluster scaletrain plans for; at most {MAX_NODES:,}")
    if per_node > 64 and gpu.key != "CPU":
        raise ScaletrainError(f"{per_node} GPUs per node is not a machine; use NODESxGPUSxNAME, e.g. 2x8xH100")
    if per_node > MAX_CPU_PROCESSES and gpu.key == "CPU":
        raise ScaletrainError(f"{per_node:,} CPU processes per node is not a machine; at most {MAX_CPU_PROCESSES}")
    # a CPU plan runs on this machine's cores (a plan for another host's CPU: plan there, or launch divides its cores)
    cores = host_cores() if gpu.key == "CPU" else None
    hw = Hardware(gpu=gpu, gpus_per_node=per_node, nodes=n_nodes, host_cores=cores)
    if inter_node_gbps is not None:
        hw = replace(hw, inter_node_gbit_s=inter_node_gbit_s(inter_node_gbps))
    return hw


def gpu_by_key(key: str) -> GpuSpec:
    g = _BY_KEY.get(key.lower())
    return g if g is not None else find_gpu(key)

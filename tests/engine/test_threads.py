"""Threads per process (issue 21): the node's cores ÷ its processes, carried by the launch argv, launch.sh and
sbatch.sh as an argument (never shell text from user input), shown by the plan, used by the time model for CPU runs
and for CPU-Adam under offload; the host term follows the loop kind; the trainer's step bookkeeping."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace

import pytest

from scaletrain.engine.catalog.hardware import host_cores, threads_per_process
from scaletrain.engine.estimate.time_constants import LOOP_HOST_OPS
from scaletrain.engine.estimate.timing import estimate_time
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.run import scripts
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.writers import write_run_dir
from scaletrain.tui.cli.main import main

CPU_REQ = dict(model="scaletrain/tiny-qwen2", precision="fp32", strategy="ddp", micro_batch=4, grad_accum=2,
               seq_len=128, grad_ckpt=False, offload="none")


def test_threads_are_the_nodes_cores_shared_by_its_processes():
    assert threads_per_process(16, 8) == 2 and threads_per_process(2, 2) == 1
    assert threads_per_process(2, 8) == 1 and threads_per_process(7, 2) == 3          # at least one, whole
    assert host_cores() == len(os.sched_getaffinity(0))


def test_launch_argv_carries_the_thread_count_as_one_argument(tmp_path):
    run = RunDir(tmp_path / "run")
    argv = scripts.launch_argv(run, TrainOptions(), threads=3, deepspeed=False)
    at = argv.index("--num_cpu_threads_per_process")
    assert argv[at + 1] == "3" and argv.index("-m", 3) > at             # an accelerate option, before the script
    assert "--num_cpu_threads_per_process" not in scripts.launch_argv(run, TrainOptions(), deepspeed=False)
    assert scripts.threads_env(3) == {"OMP_NUM_THREADS": "3"}


def _written(tmp_path, gpus: str, **over):
    req = PlanRequest(gpus=gpus, **{**CPU_REQ, **over})
    return write_run_dir(make_plan(req), req, TrainOptions(), tmp_path / gpus)


def _sourced(script, *, cpus: str | None = None) -> list[str]:
    """launch.sh run with `exec` stubbed to print $OMP_NUM_THREADS and the argv (optionally on fewer cores)."""
    env = {**os.environ, "SCALETRAIN_VENV": sys.prefix, "OMP_NUM_THREADS": "99"}     # one set outside is ignored
    argv = ["bash", "-c", 'exec() { printf "%s\\n" "$OMP_NUM_THREADS" "$@"; }; source "$1"', "_", str(script)]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_launch_sh_computes_the_threads_where_it_runs(tmp_path):
    run = _written(tmp_path, "1xCPU")
    out = _sourced(run.launch_sh)
    n = len(os.sched_getaffinity(0))
    assert out[0] == str(n) and out[out.index("--num_cpu_threads_per_process") + 1] == str(n)
    if n > 1:                                                           # moved to a smaller machine: fewer threads
        out = _sourced(run.launch_sh, cpus="0")
        assert out[0] == "1" and out[out.index("--num_cpu_threads_per_process") + 1] == "1"


def test_sbatch_task_divides_its_cores_among_the_nodes_processes(tmp_path):
    run = _written(tmp_path, "2x2xCPU")
    srun = next(ln for ln in run.sbatch_sh.read_text().splitlines() if ln.startswith("srun "))
    inner = shlex.split(srun)[-1]
    assert "nproc) / 2 ))" in inner and '--num_cpu_threads_per_process "$THREADS"' in inner
    r = subprocess.run(["bash", "-c", inner.rsplit("; exec ", 1)[0] + '; echo "$OMP_NUM_THREADS"'],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == str(threads_per_process(len(os.sched_getaffinity(0)), 2))


@pytest.mark.slow
def test_ranks_run_with_the_launchers_threads(tmp_path, monkeypatch, capsys):
    """Every rank of a 2-process DDP launch gets OMP_NUM_THREADS = cores ÷ 2 (accelerate's torchrun path ignores
    --num_cpu_threads_per_process; the environment carries it) and imports this checkout's scaletrain."""
    monkeypatch.setattr(scripts, "host_cores", lambda: 6)                 # a 6-core node: 3 threads per rank
    run = _written(tmp_path, "2xCPU")
    script = tmp_path / "probe.py"
    script.write_text("import os, torch, scaletrain\n"
                      "print('probe', os.environ['RANK'], os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads(),"
                      " scaletrain.__file__, flush=True)\n")
    assert main(["launch", str(run.path), "--script", str(script)]) == 0
    capsys.readouterr()
    status = json.loads(run.status.read_text())
    assert status["argv"][status["argv"].index("--num_cpu_threads_per_process") + 1] == "3"
    import scaletrain
    for rank in (0, 1):
        line = next(ln for ln in run.rank_log(rank).read_text().splitlines() if "probe" in ln)
        torch_threads = str(min(3, len(os.sched_getaffinity(0))))      # torch caps OMP_NUM_THREADS at the cores
        assert line.split("probe", 1)[1].split() == [str(rank), "3", torch_threads, scaletrain.__file__]


def test_plan_shows_the_threads(capsys):
    assert main(["plan", "--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU", "--json"]) == 0
    hw = json.loads(capsys.readouterr().out)["hardware"]
    assert hw["host_cores"] == host_cores()
    assert hw["cpu_threads_per_process"] == threads_per_process(host_cores(), 2)
    assert main(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "8xH100", "--json"]) == 0
    hw = json.loads(capsys.readouterr().out)["hardware"]
    assert hw["host_cores"] is None and hw["cpu_threads_per_process"] is None        # decided at launch
    assert main(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "8xH100"]) == 0
    assert "threads: decided at launch (the node's cores ÷ 8 processes)" in capsys.readouterr().out
    assert main(["plan", "--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU"]) == 0
    n = host_cores()
    assert f"threads: {threads_per_process(n, 2)} per process ({n} cores ÷ 2 processes)" in capsys.readouterr().out


def _cores(s, cores):
    return s.with_(hardware=replace(s.hardware, host_cores=cores))


def test_cpu_step_time_falls_with_threads():
    s = base_setup(PlanRequest(gpus="1xCPU", **CPU_REQ))
    one, four = estimate_time(_cores(s, 1)), estimate_time(_cores(s, 4))
    assert four.step_seconds < one.step_seconds / 2
    assert any(a.startswith("CPU: 4 threads per process") for a in four.assumptions)


def test_cpu_adam_under_offload_follows_the_threads():
    req = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="2xH100", strategy="zero2", offload="optimizer",
                      micro_batch=1, grad_accum=1, seq_len=2048)
    s = base_setup(req)
    named = estimate_time(s)                         # threads decided at launch: the node's memory bandwidth
    starved = estimate_time(_cores(s, 2))            # one thread per process (accelerate's default)
    full = estimate_time(_cores(s, 64))              # 32 threads per process
    assert starved.optimizer_seconds > 3 * full.optimizer_seconds
    assert full.optimizer_seconds == pytest.approx(named.optimizer_seconds)
    assert any("1 thread per process" in a for a in starved.assumptions)
    assert any("threads decided at launch" in a for a in named.assumptions)


def test_host_term_follows_the_loop_kind():
    s = base_setup(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="1xH100", method="lora", micro_batch=1,
                               grad_accum=1, seq_len=512))
    hosts = {loop: estimate_time(s.with_(loop=loop)).micro.host for loop in LOOP_HOST_OPS}
    assert hosts["trainer"] == pytest.approx(estimate_time(s).micro.host)
    for loop, ratio in LOOP_HOST_OPS.items():
        assert hosts[loop] == pytest.approx(hosts["trainer"] * ratio)
    assert len({round(h, 12) for h in hosts.values()}) > 1


def test_trainer_batches_are_the_blocks_as_tensors():
    torch = pytest.importorskip("torch")
    from scaletrain.trainer.batches import token_table
    from scaletrain.trainer.data import Blocks

    ids = ((5, 6, 7, 0), (8, 9, 10, 11), (12, 13, 0, 0))
    blocks = Blocks(ids, tuple(tuple(-100 if t == 0 else t for t in r) for r in ids),
                    tuple(tuple(int(t != 0) for t in r) for r in ids), seq_len=4, source_samples=3)
    table = token_table(blocks)
    b = table.batch([2, 0], "cpu")
    assert len(table) == 3 and table.tokens([2, 0]) == 5
    for k in ("input_ids", "labels", "attention_mask"):
        assert b[k].dtype == torch.long and b[k].is_contiguous()
        assert b[k].tolist() == [list(getattr(blocks, k)[2]), list(getattr(blocks, k)[0])]


def test_step_stats_one_process():
    torch = pytest.importorskip("torch")
    from scaletrain.trainer.distributed import step_stats

    class Acc:
        device = torch.device("cpu")

    st = step_stats(Acc(), 1, [torch.tensor(3.5), 2.0, 128], torch.tensor(0.25))
    assert st.sums == (3.5, 2.0, 128.0) and st.grad_norm == 0.25
    assert len(st.peaks) == 1 and st.peaks[0].host_rss_bytes > 0 and st.peaks[0].allocated_bytes is None
    assert step_stats(Acc(), 1, [1.0], None).grad_norm is None


def test_metrics_carry_the_steps_cpu_time_only_when_measured():
    from scaletrain.engine.run.metrics import StepMetrics

    rec = StepMetrics(step=1, total_steps=2, epoch=0.5, loss=1.0, lr=1e-3, tokens_per_second=10.0,
                      step_seconds=0.1, world_size=1, time=0.0, cpu_seconds=0.08)
    assert StepMetrics.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert "cpu_seconds" not in replace(rec, cpu_seconds=None).to_json()          # older lines read as before

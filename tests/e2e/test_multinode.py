"""Beyond one machine: multi-node accelerate configs, sbatch.sh, per-node launches, and the inter-node link.

The loopback tests run two real "nodes" on 127.0.0.1 (each its own accelerate launch → torchrun → 2 gloo ranks):
once through `scaletrain launch RUN_DIR --machine-rank R` (static rendezvous), once through the written sbatch.sh
itself, with stand-ins for SLURM's `srun` and `scontrol` (c10d rendezvous). No test leaves a process behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from scaletrain.engine.run import scripts
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run import writers
from scaletrain.engine.doctor.logs import run_dir_inputs
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.scripts import launch_argv
from scaletrain.engine.estimate.time_constants import DEFAULT_CONSTANTS
from scaletrain.engine.estimate.timing import bus_bandwidth, estimate_time
from scaletrain.trainer.train import FAIL_AT_STEP_ENV, FAIL_RANK_ENV
from scaletrain.tui.cli.main import main

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
LOOPBACK_STEPS = 4               # optimizer steps per loopback run: enough to see every rank train together
RUN_LIMIT_SECONDS = 180          # one loopback run (two nodes); each takes ~25 s on the 2-core dev VM
STOP_GRACE_SECONDS = 30          # after SIGTERM the launcher stops its ranks (it escalates to SIGKILL by itself)


# ---- helpers -----------------------------------------------------------------------------------------------------
def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stop_all(procs: list[subprocess.Popen], seen: list[psutil.Process]) -> None:
    """SIGTERM (the launcher then stops its own ranks), then SIGKILL to every process ever seen under them."""
    seen = seen + [p for proc in procs for p in _descendants(proc)]
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(seen, timeout=STOP_GRACE_SECONDS)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    for proc in procs:
        proc.wait(timeout=5)


def _watch(procs: list[subprocess.Popen], limit_s: float) -> list[psutil.Process]:
    """Wait for every process to end, or for one to fail (its partner would wait for it until the rendezvous
    timeout); remember each descendant seen (ranks run in sessions of their own)."""
    seen: dict[int, psutil.Process] = {}
    end = time.monotonic() + limit_s
    while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
        for proc in procs:
            for d in _descendants(proc):
                seen.setdefault(d.pid, d)
        if time.monotonic() > end:
            raise TimeoutError(f"the two nodes did not finish within {limit_s} s")
        time.sleep(0.25)
    return list(seen.values())


def _write_cpu_tiny(run_dir: Path, *extra: str) -> RunDir:
    assert main(["--preset", "cpu-tiny", "--nodes", "2", "--headless", "--dry-run", "--run-dir", str(run_dir),
                 "--set", f"train.max_steps={LOOPBACK_STEPS}", "--set", "train.checkpoint_every=1000", *extra]) == 0
    return RunDir(run_dir)


# ---- done when: the 16-GPU seed as 2 machines × 8 ----------------------------------------------------------------
@pytest.fixture(scope="module")
def seed16(tmp_path_factory) -> RunDir:
    d = tmp_path_factory.mktemp("seed16") / "run"
    assert main(["--preset", "4090x16-bs256", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return RunDir(d)


# accelerate's own loader and launch-argument preparation (what it hands torchrun on node 1), out of process so the
# test process stays free of torch
_ACCELERATE_NODE_ARGS = textwrap.dedent('''
    import json, sys
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser, _validate_launch_command
    from accelerate.utils.launch import prepare_deepspeed_cmd_env
    yml, rank, ip = sys.argv[1:]
    cfg = load_config_from_file(yml)                      # rejects unknown keys
    args = launch_command_parser().parse_args(["--config_file", yml, "--machine_rank", rank,
                                               "--main_process_ip", ip, "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    prepare_deepspeed_cmd_env(args)                       # multinode launcher "standard": torchrun arguments
    print("ARGS=" + json.dumps({"num_machines": cfg.num_machines, "num_processes": cfg.num_processes,
                                "nnodes": args.nnodes, "nproc_per_node": args.nproc_per_node,
                                "node_rank": args.node_rank, "rdzv_endpoint": args.rdzv_endpoint}))
''')


@pytest.mark.long
def test_seed16_dry_run_writes_two_machines_that_accelerate_accepts(seed16):
    cfg = yaml.safe_load(seed16.accelerate_config.read_text())
    assert (cfg["num_machines"], cfg["num_processes"], cfg["machine_rank"]) == (2, 16, 0)
    assert cfg["rdzv_backend"] == "static" and cfg["same_network"] is True
    assert cfg["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"   # torchrun per node, no pdsh
    r = subprocess.run([sys.executable, "-c", _ACCELERATE_NODE_ARGS, str(seed16.accelerate_config), "1", "10.0.0.1"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ARGS=")), None)
    assert line is not None, r.stderr[-3000:]
    got = json.loads(line[len("ARGS="):])
    assert got == {"num_machines": 2, "num_processes": 16, "nnodes": "2", "nproc_per_node": "8", "node_rank": 1,
                   "rdzv_endpoint": f"10.0.0.1:{cfg['main_process_port']}"}


def test_seed16_sbatch_one_task_per_node_with_the_plans_time(seed16):
    sb = seed16.sbatch_sh.read_text()
    subprocess.run(["bash", "-n", str(seed16.sbatch_sh)], check=True)
    directives = dict(ln[len("#SBATCH "):].split("=", 1) for ln in sb.splitlines() if ln.startswith("#SBATCH "))
    assert directives["--nodes"] == "2" and directives["--ntasks-per-node"] == "1"
    assert directives["--gres"] == "gpu:8"
    assert directives["--cpus-per-task"] == str(scripts.SBATCH_CPUS_PER_PROCESS * 8)
    doc = json.loads(seed16.plan.read_text())
    want = doc["time"]["total_seconds"] * scripts.SBATCH_TIME_MARGIN + scripts.SBATCH_STARTUP_SECONDS
    assert directives["--time"] == scripts.slurm_time(want)
    assert "##SBATCH --partition=" in sb and "##SBATCH --account=" in sb and "SBATCH_PARTITION=" in sb
    # the srun task runs the launcher's own argv, with the rank and head node left to each node's shell
    srun = next(ln for ln in sb.splitlines() if ln.startswith("srun "))
    assert '--output="$RUN_DIR"/logs/node-%n.log' in srun and str(seed16.path) not in sb    # found at run time
    threads, command = shlex.split(srun)[-1].rsplit("; exec ", 1)
    assert "nproc) / 8 ))" in threads and 'export OMP_NUM_THREADS="$THREADS"' in threads   # each node's cores ÷ 8
    inner = shlex.split("exec " + command)
    expected = [a.replace(str(seed16.path), "$RUN_DIR") for a in launch_argv(
        seed16, TrainOptions.from_json(doc["train"]), machine_rank=0, main_process_ip="$HEAD_NODE", python="$PYTHON",
        threads="$THREADS")]
    expected[expected.index("--machine_rank") + 1] = "$SLURM_NODEID"
    at = expected.index("$HEAD_NODE") + 1
    expected[at:at] = ["--main_process_port", str(yaml.safe_load(seed16.accelerate_config.read_text())
                                                  ["main_process_port"]), "--rdzv_backend", "c10d"]
    assert inner[1:] == expected
    assert 'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"' in sb


def test_sbatch_finds_the_head_node_of_a_long_node_list_under_pipefail(seed16, tmp_path):
    """The head-node line as sbatch.sh runs it (`set -euo pipefail`), with an scontrol that lists 100,000 nodes:
    `| head -n 1` left scontrol writing into a closed pipe, SIGPIPE ended the script (141) before anything
    started; seen on this VM with two nodes too, when scontrol's second line came after head had exited."""
    line = next(ln for ln in seed16.sbatch_sh.read_text().splitlines() if ln.startswith("HEAD_NODE="))
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nseq -f 'node%06g' 1 100000\n")
    fake.chmod(0o755)
    script = f"set -euo pipefail\n{line}\necho \"HEAD=$HEAD_NODE\"\n"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
                                SLURM_JOB_NODELIST="node[000001-100000]"))
    assert (r.returncode, r.stdout) == (0, "HEAD=node000001\n"), (r.returncode, r.stderr)


def test_slurm_time_rounds_up_to_minutes_and_counts_days():
    assert scripts.slurm_time(1) == "00:01:00"
    assert scripts.slurm_time(3600) == "01:00:00"
    assert scripts.slurm_time(3601) == "01:01:00"
    assert scripts.slurm_time(86400 + 3600 + 61) == "1-01:02:00"


def test_launch_sh_takes_the_rank_from_argument_or_environment(seed16):
    sh = str(seed16.launch_sh)
    subprocess.run(["bash", "-n", sh], check=True)
    for argv, env, needle in ((["bash", sh], {}, "MACHINE_RANK"),
                              (["bash", sh, "2", "10.0.0.1"], {}, "outside this plan's 2 nodes"),
                              (["bash", sh], {"MACHINE_RANK": "x"}, "MACHINE_RANK"),
                              (["bash", sh], {"SLURM_NODEID": "1"}, "head node's address")):
        clean = {k: v for k, v in os.environ.items() if k not in ("MACHINE_RANK", "SLURM_NODEID", "MAIN_PROCESS_IP")}
        r = subprocess.run(argv, capture_output=True, text=True, env={**clean, **env}, timeout=30)
        assert r.returncode == 2 and needle in r.stderr, (argv, env, r.stderr)


# ---- bad input: one line, nothing started ------------------------------------------------------------------------
def test_multi_node_launch_refusals_are_one_line(seed16, tmp_path, capsys):
    capsys.readouterr()
    assert main(["launch", str(seed16.path), "--machine-rank", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--main-process-ip" in err and len(err.splitlines()) == 1
    assert main(["launch", str(seed16.path), "--machine-rank", "2", "--main-process-ip", "10.0.0.1"]) == 2
    assert "outside this plan's 2 nodes" in capsys.readouterr().err
    assert main(["launch", str(seed16.path), "--machine-rank", "0", "--main-process-ip", "10.0.0.1; rm -rf /"]) == 2
    assert "not a host name" in capsys.readouterr().err
    single = tmp_path / "single"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(single)]) == 0
    capsys.readouterr()
    assert main(["launch", str(single), "--machine-rank", "1"]) == 2
    assert "single-node plan" in capsys.readouterr().err
    assert main(["--preset", "cpu-tiny", "--nodes", "2", "--main-process-ip", "$(reboot)", "--headless",
                 "--dry-run", "--run-dir", str(tmp_path / "bad-ip")]) == 2
    assert not (tmp_path / "bad-ip").exists()
    assert not list(seed16.path.glob("status*.json"))


def test_overwrite_moves_every_nodes_status_aside(tmp_path):
    run = _write_cpu_tiny(tmp_path / "run")
    for path in (run.status, run.node_status(1)):
        path.write_text('{"state": "finished"}\n')
    assert run.node_statuses() == [run.status, run.path / "status-node-1.json"]
    assert main(["--preset", "cpu-tiny", "--nodes", "2", "--headless", "--dry-run", "--run-dir", str(run.path),
                 "--set", "train.max_steps=7", "--overwrite"]) == 0
    assert run.node_statuses() == []
    [old] = run.path.glob(f"{writers.SUPERSEDED_PREFIX}*")
    assert {p.name for p in old.glob("status*.json")} == {"status.json", "status-node-1.json"}


# ---- the time model: cross-node collectives ride the inter-node link ---------------------------------------------
def test_a_slower_inter_node_link_slows_two_nodes_but_not_one(capsys):
    req = PlanRequest(model="Qwen/Qwen3-4B", strategy="zero3", offload="none", grad_ckpt=True, micro_batch=2,
                      grad_accum=8, seq_len=2048, attn="flash")
    two_fast, two_slow = (base_setup(req.with_(gpus="2x8xRTX4090", inter_node_gbps=g)) for g in (400, 25))
    one_fast, one_slow = (base_setup(req.with_(gpus="8xRTX4090", inter_node_gbps=g)) for g in (400, 25))
    # 25 Gb/s is below the 4090s' host-staged PCIe ring: the NIC bounds every cross-node collective
    bw_slow, what = bus_bandwidth(two_slow)
    assert bw_slow == pytest.approx(25 / 8 * DEFAULT_CONSTANTS.inter_node_efficiency * 1e9)
    assert "inter-node" in what
    # 400 Gb/s is faster than the intra-node link, which then bounds the ring, as on one node
    assert bus_bandwidth(two_fast)[0] == bus_bandwidth(one_fast)[0] > bw_slow
    assert estimate_time(two_slow).step_seconds > estimate_time(two_fast).step_seconds
    assert estimate_time(one_slow).step_seconds == estimate_time(one_fast).step_seconds
    # the flag flows CLI → PlanRequest → Hardware → time, as a number or a link name
    times = {}
    for link in ("25", "ndr"):
        capsys.readouterr()
        assert main(["plan", "--preset", "4090x16-bs256", "--inter-node-gbps", link, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        times[doc["hardware"]["inter_node_gbps"]] = doc["time"]["step_seconds"]
    assert set(times) == {25.0, 400.0} and times[25.0] > times[400.0]
    assert parse_gpus("2x8xH100", inter_node_gbps="hdr").inter_node_gbit_s == 200.0
    assert main(["plan", "--preset", "4090x16-bs256", "--inter-node-gbps", "fast"]) == 2
    assert "edr, hdr, ndr" in capsys.readouterr().err


# ---- done when: two local "nodes" train together on 127.0.0.1 ----------------------------------------------------
@pytest.mark.slow
def _two_loopback_nodes(run: RunDir, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[list, dict]:
    """Both nodes' `scaletrain launch` on this host (node 1 first, in the background): exit codes, outputs."""
    out = {r: (tmp_path / f"node-{r}.out").open("w") for r in (0, 1)}
    procs: list[subprocess.Popen] = []
    seen: list[psutil.Process] = []
    try:
        for r in (1, 0):                         # node 1 in the background first, then the head node
            procs.append(subprocess.Popen([*CLI, "launch", str(run.path), "--machine-rank", str(r)],
                                          stdout=out[r], stderr=subprocess.STDOUT, start_new_session=True,
                                          env={**os.environ, **(env or {})}))
        seen = _watch(procs, RUN_LIMIT_SECONDS)
        codes = [p.returncode for p in procs]
    finally:
        _stop_all(procs, seen)
        for f in out.values():
            f.close()
    return codes, {r: (tmp_path / f"node-{r}.out").read_text() for r in (0, 1)}


@pytest.mark.slow
def test_two_loopback_nodes_train_together_through_scaletrain_launch(tmp_path, capsys):
    run = _write_cpu_tiny(tmp_path / "run", "--main-process-ip", "127.0.0.1")
    cfg = yaml.safe_load(run.accelerate_config.read_text())
    assert (cfg["num_machines"], cfg["num_processes"], cfg["main_process_ip"]) == (2, 4, "127.0.0.1")
    codes, logs = _two_loopback_nodes(run, tmp_path)
    assert codes == [0, 0], logs
    steps = read_metrics(run.metrics)
    assert [m.step for m in steps] == list(range(1, LOOPBACK_STEPS + 1))
    assert {m.world_size for m in steps} == {4}                       # the planned 2 nodes × 2 processes
    assert {p.rank for p in steps[-1].peak_memory} == {0, 1, 2, 3}
    # each node wrote its own status and launcher log; global rank numbering keeps rank logs apart
    head, other = (json.loads(p.read_text()) for p in (run.status, run.node_status(1)))
    assert (head["state"], head["machine_rank"], head["local_ranks"]) == ("finished", 0, [0, 1])
    assert (other["state"], other["machine_rank"], other["local_ranks"]) == ("finished", 1, [2, 3])
    assert set(head["rank_pids"]) == {"0", "1"} and set(other["rank_pids"]) == {"2", "3"}
    assert run.launcher_log(1).exists() and run.launcher_log(0).exists()
    for r in range(4):
        assert "==> scaletrain launch" in run.rank_log(r).read_text()
    assert "node 1 of 2" in logs[1] and "finished" in logs[1]
    _, _, codes_seen, _ = run_dir_inputs(run.path)                    # the doctor reads every node's status
    assert codes_seen == {0: 0, 1: 0, 2: 0, 3: 0}
    # issue 23: every rank reported its node (torchrun's GROUP_RANK) with its peak; the monitor shows the job
    assert {p.rank: p.node for p in steps[-1].peak_memory} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert all(p.telemetry.compute_seconds > 0 and p.telemetry.host for p in steps[-1].peak_memory)
    capsys.readouterr()
    assert main(["monitor", str(run.path), "--headless", "--once"]) == 0
    text = capsys.readouterr().out
    assert f"step {LOOPBACK_STEPS}: 4 ranks, 2 nodes" in text
    for r in range(4):
        assert f"rank {r} node {r // 2} peak host RSS vs tensors:" in text and "(predicted " in text


@pytest.mark.slow
def test_a_rank_killed_on_node_1_is_named_with_its_node_and_the_peers_peaks(tmp_path, capsys):
    """Rank 3 (node 1's second process) is SIGKILLed after step 2: the doctor names it and its node, and how far
    the other ranks' last logged peaks were from the plan."""
    run = _write_cpu_tiny(tmp_path / "run", "--main-process-ip", "127.0.0.1")
    codes, logs = _two_loopback_nodes(run, tmp_path, {FAIL_AT_STEP_ENV: "2", FAIL_RANK_ENV: "3"})
    assert codes[0] != 0 or codes[1] != 0, logs
    capsys.readouterr()
    main(["diagnose", str(run.path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (out["rank"], out["node"]) == (3, 1), out
    assert "rank 3 on node 1" in out["summary"]
    peers = out["peers"]
    assert peers.startswith("at step 2, before rank 3 (node 1) failed, the other ranks' peaks:")
    assert all(f"rank {r} (node {r // 2})" in peers for r in (0, 1, 2)) and "rank 3 (node" not in peers[60:]


SRUN = textwrap.dedent('''\
    #!{python}
    """Stand-in for SLURM's srun on one host: one task per "node", SLURM_NODEID set, --output=...%n... per node.
    The head node (task 0) binds the rendezvous port before the others start, as a separate head host would."""
    import os, re, subprocess, sys, time
    args, nodes, output = sys.argv[1:], 1, None
    while args and args[0].startswith("--"):
        opt, _, value = args.pop(0).partition("=")
        if opt == "--nodes":
            nodes = int(value)
        elif opt == "--output":
            output = value
    port = int(re.search(r"--main_process_port (\\d+)", " ".join(args)).group(1))

    def listening():                  # a LISTEN (state 0A) socket on the port, IPv4 or IPv6
        want = ":%04X" % port
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                rows = [ln.split() for ln in open(table).read().splitlines()[1:]]
            except OSError:
                continue
            if any(r[1].endswith(want) and r[3] == "0A" for r in rows):
                return True
        return False

    procs = []
    for n in range(nodes):
        env = dict(os.environ, SLURM_NODEID=str(n), SLURM_PROCID=str(n), SLURM_LOCALID="0")
        log = open(output.replace("%n", str(n)), "w")
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
        end = time.time() + 120
        while n == 0 and not listening() and time.time() < end and procs[0].poll() is None:
            time.sleep(0.2)
    codes = [p.wait() for p in procs]
    sys.exit(next((c for c in codes if c), 0))
''')
SCONTROL = textwrap.dedent('''\
    #!/bin/sh
    # Stand-in for `scontrol show hostnames LIST`: every node of this job is this host.
    [ "$1 $2" = "show hostnames" ] && echo 127.0.0.1 && echo 127.0.0.1
''')


@pytest.mark.slow
def test_sbatch_script_runs_both_nodes_with_c10d_rendezvous(tmp_path):
    run = _write_cpu_tiny(tmp_path / "slurm-run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN.format(python=sys.executable)), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_NODELIST="fake[1-2]", SLURM_JOB_ID="1",
               SCALETRAIN_VENV=sys.prefix)
    out = (tmp_path / "sbatch.out").open("w")
    procs: list[subprocess.Popen] = []
    seen: list[psutil.Process] = []
    try:
        procs.append(subprocess.Popen(["bash", str(run.sbatch_sh)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
        seen = _watch(procs, RUN_LIMIT_SECONDS)
    finally:
        _stop_all(procs, seen)
        out.close()
    node_logs = [run.logs / f"node-{n}.log" for n in (0, 1)]
    detail = (tmp_path / "sbatch.out").read_text() + "".join(p.read_text()[-3000:] for p in node_logs if p.exists())
    assert procs[0].returncode == 0, detail
    assert "head node 127.0.0.1" in (tmp_path / "sbatch.out").read_text()
    steps = read_metrics(run.metrics)
    assert len(steps) == LOOPBACK_STEPS and {m.world_size for m in steps} == {4}
    assert {p.rank for p in steps[-1].peak_memory} == {0, 1, 2, 3}
    # one log per node; global rank 0 (on whichever node c10d made it) prints the steps, with its rank prefix
    assert sum(f"[rank0]:step {LOOPBACK_STEPS}/{LOOPBACK_STEPS}" in p.read_text() for p in node_logs) == 1, detail
    # each node's torchrun started its own two ranks (their own stdout/stderr files under logs/elastic/)
    per_node = sorted(sorted(d.name for d in attempt.iterdir()) for attempt in run.logs.glob("elastic/*/attempt_0"))
    assert per_node == [["0", "1"], ["0", "1"]]

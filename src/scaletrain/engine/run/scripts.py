"""Plan → the commands that run it: the `accelerate launch` argv, launch.sh (by hand, per node) and sbatch.sh.

launch.sh holds the argument list `scaletrain launch` runs (launch_argv); a multi-node plan's launch.sh takes the
node's rank and the head node's address, and sbatch.sh starts one srun task per node with c10d rendezvous and a
--time from the plan's predicted run time. Both scripts are portable: they find their run directory at run time
(their own folder; sbatch.sh also the submission folder, since SLURM runs a copy of the script) and the Python of
the `scaletrain` on PATH, or of the venv named by $SCALETRAIN_VENV, so a run folder copied or moved to another
machine or path runs as it is. Nothing of the writing machine (its Python, the folder's old path) is baked in.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path

from scaletrain.engine.catalog.hardware import host_cores, threads_per_process
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.run.configs import main_process_port
from scaletrain.engine.run.layout import LAUNCH_SH, LINE_PREFIX, LINE_PREFIX_ENV, SBATCH_SH, RunDir
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.units import fmt_seconds

# The bundled trainer, as `python -m` runs it under accelerate.
TRAINER_MODULE = "scaletrain.trainer.train"
# `accelerate launch` itself, as `python -m` runs it: accelerate's launcher with the garbage collector paused while
# it loads torch (trainer/launch_agent.py: each launch starts and ends about 0.36 s sooner)
ACCELERATE_LAUNCH_MODULE = "scaletrain.trainer.launch_agent"


def launch_argv(run: RunDir, train: TrainOptions, *, machine_rank: int | None = None,
                main_process_ip: str | None = None, python: str | None = None,
                deepspeed: bool | None = None, threads: int | str | None = None) -> list[str]:
    """The exact `accelerate launch` argument list (no shell) for this run; launch.sh holds the same words.

    Every run-directory path is derived from `run` here, at launch time, never read back from the written files:
    DeepSpeed's config file is passed on the command line (it overrides the accelerate YAML's absolute path), so a
    moved run folder launches from where it is. `deepspeed` None: whether the folder holds ds_config.json.
    `threads`: CPU threads per process (cpu_threads: the node's cores ÷ its processes), or None to leave accelerate's
    default (1 per process)."""
    argv = [python or sys.executable, "-m", ACCELERATE_LAUNCH_MODULE, "--config_file", str(run.accelerate_config)]
    if deepspeed if deepspeed is not None else run.ds_config.is_file():
        argv += ["--deepspeed_config_file", str(run.ds_config)]
    if threads is not None:
        argv += ["--num_cpu_threads_per_process", str(threads)]
    # per-rank output: torchrun tees each rank's stdout+stderr to files under logs/elastic/ and prefixes its console
    # lines with the rank, which engine.launch.launcher splits into logs/rank-<i>.log
    argv += ["--tee", "3", "--log_dir", str(run.logs / "elastic")]
    if machine_rank is not None:
        argv += ["--machine_rank", str(machine_rank)]
    if main_process_ip:
        argv += ["--main_process_ip", main_process_ip]
    argv += elastic_args(train, multi_node=bool(main_process_ip))
    if train.script:
        argv += [train.script, *train.script_args]
    else:
        argv += ["-m", TRAINER_MODULE, "--run-dir", str(run.path)]
    return argv


def elastic_args(train: TrainOptions, *, multi_node: bool) -> list[str]:
    """torchrun's elastic agent for train.max_restarts > 0: restart every rank up to N times after one dies (each
    restart resumes from the newest checkpoint: the trainer reads TORCHELASTIC_RESTART_COUNT). The rendezvous is
    c10d: across nodes on the plan's port (so every node's agent restarts its ranks together), on one node
    torchrun's standalone c10d store on a free port (elastic_env). accelerate's default static rendezvous cannot
    restart: its store keeps the first round's addresses and the restarted ranks' gloo mesh connects to the dead
    ones ("Gloo connectFullMesh failed ... Connection refused", measured on torch 2.13)."""
    if not train.max_restarts:
        return []
    return ["--max_restarts", str(train.max_restarts), *(["--rdzv_backend", "c10d"] if multi_node else [])]


# torchrun's --standalone, which `accelerate launch` has no flag for: torchrun's own argument parser (which accelerate
# runs its arguments through) reads PET_<OPTION> from the environment.
STANDALONE_ENV = "PET_STANDALONE"
# torch 2.13's c10d rendezvous shares one TCPStore server with the workers for every round, and the workers' gloo
# keys in it are not per round: a restarted rank 0 read its peer's address from the dead round and failed
# ("Gloo connectFullMesh failed ... Connection refused", measured on 2 CPU ranks). Opting out of the sharing gives
# each round a store of its own, hosted by the new rank 0 on a free port.
UNSHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def elastic_env(train: TrainOptions, *, multi_node: bool) -> dict[str, str]:
    """The environment an elastic launch needs: a store per rendezvous round, and on one node torchrun's
    standalone c10d rendezvous (a fresh store on a free port)."""
    if not train.max_restarts:
        return {}
    return {UNSHARED_STORE_ENV: "1", **({} if multi_node else {STANDALONE_ENV: "1"})}


def _env_lines(train: TrainOptions, *, multi_node: bool) -> list[str]:
    return [f"export {k}={v}" for k, v in elastic_env(train, multi_node=multi_node).items()]


def cpu_threads(processes_per_node: int) -> int:
    """Threads per process for a launch on this machine: its cores (affinity mask) ÷ the processes it starts."""
    return threads_per_process(host_cores(), processes_per_node)


def threads_env(threads: int) -> dict[str, str]:
    """The environment that carries the thread count to every rank. accelerate 1.15 applies
    --num_cpu_threads_per_process only in its simple and DeepSpeed launchers (OMP_NUM_THREADS in their env); its
    torchrun path (DDP, FSDP, 2 CPU ranks) ignores it and torchrun sets OMP_NUM_THREADS=1 unless it is already set
    (torch/distributed/run.py), so it is exported too."""
    return {OMP_THREADS_ENV: str(threads)}


OMP_THREADS_ENV = "OMP_NUM_THREADS"
_RANK_TOKEN = "__SCALETRAIN_MACHINE_RANK__"
_THREADS_TOKEN = "__SCALETRAIN_CPU_THREADS__"
_IP_TOKEN = "__SCALETRAIN_MAIN_PROCESS_IP__"
_RUN_TOKEN = "/__SCALETRAIN_RUN_DIR__"
_PY_TOKEN = "__SCALETRAIN_PYTHON__"
# The one variable that names the environment to run with (a venv or conda prefix holding bin/python).
VENV_ENV = "SCALETRAIN_VENV"
# SLURM --time: the plan's predicted run time × this margin, plus start-up. The time model is a planning estimate
# (uncalibrated until `scaletrain validate --save` has measured these cards), and SLURM kills a job at its limit,
# losing everything since the last checkpoint: overestimating costs queue priority, underestimating costs the run.
SBATCH_TIME_MARGIN = 1.5
# Start-up the step time does not cover: rendezvous, loading the model from a shared filesystem, the final save.
SBATCH_STARTUP_SECONDS = 15 * 60
# --cpus-per-task: cores per training process for its Python loop, NCCL's proxy thread and data loading (the
# bundled trainer tokenizes up front and loads no worker processes). Override with `sbatch --cpus-per-task=N`.
SBATCH_CPUS_PER_PROCESS = 4
SECONDS_PER_MINUTE = 60
MINUTES_PER_DAY = 24 * 60


def _comment(text: object) -> str:
    """Text for a `#` comment line: anything that could end the comment (a newline, a control character) becomes
    '?', so a model folder or plan name can never start a command of its own."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(text))


def _shell_words(argv: list[str], subst: dict[str, str]) -> str:
    return " ".join(_shell_word(a, subst) for a in argv)


def _shell_word(arg: str, subst: dict[str, str]) -> str:
    """One word: a placeholder's shell text, "$RUN_DIR"/rest for a path inside the run directory, else quoted."""
    if arg in subst:
        return subst[arg]
    if arg == _RUN_TOKEN:
        return '"$RUN_DIR"'
    if arg.startswith(_RUN_TOKEN + "/"):
        return '"$RUN_DIR"/' + shlex.quote(arg[len(_RUN_TOKEN) + 1:])
    if arg == _PY_TOKEN:
        return '"$PYTHON"'
    if arg == _THREADS_TOKEN:
        return '"$THREADS"'
    return shlex.quote(arg)


def _portable_argv(train: TrainOptions, deepspeed: bool, **kw: str | int | None) -> list[str]:
    """launch_argv with the run directory, the Python and the thread count left to the script (placeholders)."""
    return launch_argv(RunDir(Path(_RUN_TOKEN)), train, python=_PY_TOKEN, deepspeed=deepspeed,  # type: ignore
                       threads=_THREADS_TOKEN, **kw)


def _threads_lines(processes_per_node: int) -> list[str]:
    """Shell lines setting and exporting $THREADS (OMP_NUM_THREADS): this node's cores, as nproc counts them (its
    affinity mask; SLURM's --cpus-per-task inside a task) with any OMP variable set outside ignored, ÷ the plan's
    processes per node, at least 1; computed where the script runs, so a moved run folder fits its new machine."""
    return [
        f"THREADS=$(( $(env -u {OMP_THREADS_ENV} -u OMP_THREAD_LIMIT nproc) / {processes_per_node} ))",
        '[ "$THREADS" -ge 1 ] || THREADS=1',
        f'export {OMP_THREADS_ENV}="$THREADS"',
    ]


def _node_argv(train: TrainOptions, deepspeed: bool) -> list[str]:
    """The portable argv with placeholders for the machine rank and the head-node address (filled in per node)."""
    argv = _portable_argv(train, deepspeed, machine_rank=0, main_process_ip=_IP_TOKEN)
    argv[argv.index("--machine_rank") + 1] = _RANK_TOKEN
    return argv


def _find_python(script: str) -> list[str]:
    """Shell lines setting $PYTHON: $SCALETRAIN_VENV/bin/python, else the Python beside the `scaletrain` on PATH
    (symlinks followed: pipx), else python3; refused in one line unless it imports scaletrain and has accelerate."""
    return [
        f'if [ -n "${{{VENV_ENV}:-}}" ]; then',
        f'  PYTHON="${VENV_ENV}/bin/python"',
        "elif SCALETRAIN_BIN=\"$(command -v scaletrain)\"; then",
        '  PYTHON="$(dirname -- "$(readlink -f -- "$SCALETRAIN_BIN" || echo "$SCALETRAIN_BIN")")/python"',
        '  [ -x "$PYTHON" ] || PYTHON=python3',
        "else",
        "  PYTHON=python3",
        "fi",
        "if ! \"$PYTHON\" -c 'import importlib.util as u, scaletrain; assert u.find_spec(\"accelerate\")' "
        ">/dev/null 2>&1; then",
        f'  echo "{script}: no Python with scaletrain and accelerate (tried $PYTHON): put scaletrain on PATH, or set '
        f'{VENV_ENV}=/path/to/venv" >&2',
        "  exit 2",
        "fi",
    ]


# launch.sh's folder, found at run time (also when sourced): the run directory, wherever it was moved.
_HERE = 'RUN_DIR="$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"'


def launch_script(plan: Plan, run: RunDir, train: TrainOptions, *, main_process_ip: str | None = None,
                  deepspeed: bool | None = None) -> str:
    """launch.sh: the argument list the launcher runs, runnable by hand from wherever the folder now is
    (multi-node: one call per node). `deepspeed`: whether the run has a ds_config.json (default: it is there)."""
    s = plan.setup
    hw = s.hardware
    ds = run.ds_config.is_file() if deepspeed is None else deepspeed
    lines = ["#!/usr/bin/env bash",
             _comment(f"# scaletrain run {plan.name!r}: {s.model.name} on {hw.describe()} ({s.strategy}, "
                      f"{s.precision})."),
             "# The same argument list `scaletrain launch RUN_DIR` runs, from this file's folder (the run directory,",
             f"# wherever it is now) with the Python of the `scaletrain` on PATH or of ${VENV_ENV}. Each of the node's",
             f"# {hw.gpus_per_node} process(es) runs with the node's cores ÷ {hw.gpus_per_node} CPU threads "
             "(--num_cpu_threads_per_process, OMP_NUM_THREADS)."]
    if hw.nodes <= 1:
        lines += ["set -euo pipefail", _HERE, *_find_python(LAUNCH_SH), *_threads_lines(hw.gpus_per_node),
                  *_env_lines(train, multi_node=False),
                  "exec " + _shell_words(_portable_argv(train, ds), {})]
        return "\n".join(lines) + "\n"
    last = hw.nodes - 1
    ip = main_process_ip or ""
    usage = "bash launch.sh MACHINE_RANK [MAIN_PROCESS_IP]"
    lines += [
        f"# Multi-node, {hw.nodes} nodes × {hw.gpus_per_node} processes: the same files on every node, each",
        f"# started with its machine rank (0 on the head node, up to {last}) and the head node's address:",
        f"#   {usage}",
        "# The rank may instead come from $MACHINE_RANK, or $SLURM_NODEID inside an srun task; the address from",
        "# $MAIN_PROCESS_IP" + (f" (default {ip}, given at plan time)." if ip else "."),
        "# `scaletrain launch RUN_DIR --machine-rank R [--main-process-ip HEAD]` does the same with per-rank logs.",
        "set -euo pipefail",
        'MACHINE_RANK="${1:-${MACHINE_RANK:-${SLURM_NODEID:-}}}"',
        f'MAIN_PROCESS_IP="${{2:-${{MAIN_PROCESS_IP:-{ip}}}}}"',          # ip: check_host's characters only
        'case "$MACHINE_RANK" in',
        f"  ''|*[!0-9]*) echo \"launch.sh: which node is this? give its MACHINE_RANK (0 on the head node, up to "
        f"{last}): {usage}\" >&2; exit 2 ;;",
        "esac",
        f'if [ "$MACHINE_RANK" -gt {last} ]; then',
        f'  echo "launch.sh: MACHINE_RANK $MACHINE_RANK is outside this plan\'s {hw.nodes} nodes (0 to {last})" >&2',
        "  exit 2",
        "fi",
        'if [ -z "$MAIN_PROCESS_IP" ]; then',
        f'  echo "launch.sh: give the head node\'s address: {usage} (or set MAIN_PROCESS_IP)" >&2; exit 2',
        "fi",
        _HERE,
        *_find_python(LAUNCH_SH),
        *_threads_lines(hw.gpus_per_node),
        *_env_lines(train, multi_node=True),
        f"export {LINE_PREFIX_ENV}={shlex.quote(LINE_PREFIX)}",
        "exec " + _shell_words(_node_argv(train, ds),
                               {_RANK_TOKEN: '"$MACHINE_RANK"', _IP_TOKEN: '"$MAIN_PROCESS_IP"'}),
    ]
    return "\n".join(lines) + "\n"


def node_launch_commands(plan: Plan, run: RunDir, *, main_process_ip: str | None = None) -> list[str]:
    """`scaletrain launch` for each node of a multi-node plan, head node first (empty for one node)."""
    nodes = plan.setup.hardware.nodes
    if nodes <= 1:
        return []
    ip = [] if main_process_ip else ["--main-process-ip", "HEAD_ADDRESS"]
    return [shlex.join(["scaletrain", "launch", str(run.path), "--machine-rank", str(r), *ip]) for r in range(nodes)]


def predicted_run_seconds(plan: Plan, train: TrainOptions) -> float | None:
    """What the trainer will run: max_steps × the step time when set, else the plan's epochs (needs a dataset
    size); None when the plan cannot say."""
    t = plan.time
    if t is None:
        return None
    if train.max_steps is not None:
        return train.max_steps * t.step_seconds
    return t.total_seconds


def slurm_time(seconds: float) -> str:
    """SLURM's --time, whole minutes rounded up: HH:MM:SS, or D-HH:MM:SS from a day on."""
    minutes = max(1, math.ceil(seconds / SECONDS_PER_MINUTE))
    days, rest = divmod(minutes, MINUTES_PER_DAY)
    hhmmss = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{hhmmss}" if days else hhmmss


def _sbatch_path(path: Path, pattern: str) -> str:
    """A path with a SLURM filename pattern (%j, %n) appended; a literal % in the path is doubled."""
    return str(path).replace("%", "%%") + "/" + pattern


def _sbatch_arg(text: str) -> str:
    """An #SBATCH value: bare when safe, else in double quotes (sbatch's own directive parser reads those)."""
    return text if re.fullmatch(r"[A-Za-z0-9._/%:=+-]+", text) else '"' + text.replace('"', "") + '"'


def sbatch_script(plan: Plan, run: RunDir, train: TrainOptions, *, deepspeed: bool | None = None) -> str | None:
    """sbatch.sh for multi-node plans: one srun task per node starting that node's `accelerate launch`.

    Head node from the job's node list, c10d rendezvous on the plan's port, the machine rank from each task's
    $SLURM_NODEID (single-quoted `bash -c`, so it expands on the node: shared/reference/tui-launch-monitor.md §4),
    one log per node, --time from the plan's predicted time. The run directory is found at run time: SLURM runs a
    copy of the script from its spool, so it is the script's folder when that holds plan.json (bash by hand), else
    the folder sbatch was called from ($SLURM_SUBMIT_DIR), else $SCALETRAIN_RUN_DIR. None for single-node plans.
    """
    s = plan.setup
    hw = s.hardware
    if hw.nodes <= 1:
        return None
    port = main_process_port(run)
    ds = run.ds_config.is_file() if deepspeed is None else deepspeed
    argv = _node_argv(train, ds)
    at = argv.index(_IP_TOKEN) + 1
    rdzv = [] if "--rdzv_backend" in argv else ["--rdzv_backend", "c10d"]      # already there under max_restarts
    argv[at:at] = ["--main_process_port", str(port), *rdzv]
    inner = "; ".join([*_threads_lines(hw.gpus_per_node),
                       "exec " + _shell_words(argv, {_RANK_TOKEN: '"$SLURM_NODEID"', _IP_TOKEN: '"$HEAD_NODE"'})])
    cpus = SBATCH_CPUS_PER_PROCESS * hw.gpus_per_node
    predicted = predicted_run_seconds(plan, train)
    head = [
        "#!/bin/bash",
        _comment(f"# scaletrain plan {plan.name!r}: {s.model.name} on {hw.describe()} ({s.strategy}, "
                 f"{s.precision}), {s.world_size} processes."),
        "# Submit from a login node, inside the run directory (wherever it is now): cd RUN_DIR && sbatch sbatch.sh",
        "# Partition and account: sbatch reads them from the environment, so this file needs no edit:",
        "#   SBATCH_PARTITION=gpu SBATCH_ACCOUNT=myproject sbatch sbatch.sh",
        "# (or sbatch -p gpu -A myproject ...), or delete one '#' from the ##SBATCH lines below. Options given to",
        "# sbatch override the #SBATCH lines here (e.g. sbatch --time=2-00:00:00 or --cpus-per-task=N).",
        f"#SBATCH --job-name={re.sub(r'[^A-Za-z0-9._-]', '-', plan.name) or 'scaletrain'}",
        f"#SBATCH --nodes={hw.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if hw.gpu.key != "CPU":
        head.append(f"#SBATCH --gres=gpu:{hw.gpus_per_node}")
    head.append(f"#SBATCH --cpus-per-task={cpus}")
    if predicted is not None:
        head.append(f"#SBATCH --time={slurm_time(predicted * SBATCH_TIME_MARGIN + SBATCH_STARTUP_SECONDS)}")
    head += [f"#SBATCH --output={_sbatch_arg(_sbatch_path(Path(run.logs.name), 'slurm-%j.out'))}",
             "##SBATCH --partition=YOUR_PARTITION",
             "##SBATCH --account=YOUR_ACCOUNT",
             "#"]
    steps = train.max_steps if train.max_steps is not None else (plan.time.total_steps if plan.time else None)
    if predicted is not None:
        head.append(f"# --time: {steps:,} steps × {fmt_seconds(plan.time.step_seconds)} predicted = "
                    f"{fmt_seconds(predicted)}, × {SBATCH_TIME_MARGIN:g} margin + "
                    f"{fmt_seconds(SBATCH_STARTUP_SECONDS)} start-up, rounded up to the minute.")
    else:
        head.append("# --time: the plan has no run-time estimate (give --dataset-size, or train.max_steps): set "
                    "it with sbatch --time=..., else the partition's default limit applies.")
    head += [f"# --cpus-per-task: {SBATCH_CPUS_PER_PROCESS} cores × {hw.gpus_per_node} processes per node; each process "
             f"runs with the task's",
             f"# cores ÷ {hw.gpus_per_node} threads (OMP_NUM_THREADS; DeepSpeed's CPU-Adam under offload uses them).",
             f"# Every node runs the Python of the `scaletrain` on PATH (or ${VENV_ENV}/bin/python): the same",
             "# environment and run directory must exist there (a shared filesystem)."]
    body = [
        "set -euo pipefail",
        ': "${SLURM_JOB_NODELIST:?submit this script with sbatch}"',
        'RUN_DIR="$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"',
        'if [ ! -f "$RUN_DIR/plan.json" ]; then RUN_DIR="${SLURM_SUBMIT_DIR:-}"; fi',
        'if [ ! -f "$RUN_DIR/plan.json" ]; then RUN_DIR="${SCALETRAIN_RUN_DIR:-}"; fi',
        'if [ ! -f "$RUN_DIR/plan.json" ]; then',
        '  echo "sbatch.sh: cannot find the run directory; submit from inside it (cd RUN_DIR && sbatch sbatch.sh)'
        ' or set SCALETRAIN_RUN_DIR" >&2',
        "  exit 2",
        "fi",
        *_find_python(SBATCH_SH),
        "export RUN_DIR PYTHON",
        # sed reads every line: `head -n 1` exits after the first, and under pipefail a long node list's scontrol,
        # still writing, dies of SIGPIPE (exit 141) and ends the script before anything starts
        'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
        "export HEAD_NODE",
        *_env_lines(train, multi_node=True),
        f"export {LINE_PREFIX_ENV}={shlex.quote(LINE_PREFIX)}      # every line carries its global rank",
        "export PYTHONUNBUFFERED=1",
        # printf with the path as its own argument: inside "…" a $(…) or `…` in the path would not run either
        f"printf 'scaletrain: %s nodes, head node %s, c10d rendezvous on port %s; logs in %s/node-<N>.log\\n' "
        f'{hw.nodes} "$HEAD_NODE" {port} "$RUN_DIR/logs"',
        "# One task per node, so $SLURM_NODEID (here equal to $SLURM_PROCID) is the machine rank. The single quotes",
        "# leave $SLURM_NODEID, $HEAD_NODE, $RUN_DIR and $PYTHON to each node's own shell.",
        f"srun --nodes={hw.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f'--output="$RUN_DIR"/logs/node-%n.log bash -c {shlex.quote(inner)}',
    ]
    return "\n".join(head + body) + "\n"

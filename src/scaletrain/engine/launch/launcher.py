"""Run a run directory: `accelerate launch` as an argument list in its own session, per-rank logs, a clean stop.

Why the care: torchrun starts every rank with start_new_session=True, so the ranks are not in the launcher's
process group and a killed `accelerate launch` leaves them running. This module therefore tracks every descendant
it has ever seen (pid + start time, so a recycled pid is never signalled) and stops them all:
SIGINT to accelerate (torchrun forwards it to the ranks) → SIGTERM to every tracked process group → SIGKILL.

Per-rank logs: launch_argv passes `--tee 3 --log_dir logs/elastic`, and the environment sets torchrun's line prefix
to `[rank<global rank>]:`; lines are split into logs/rank-<i>.log, the launcher's own into logs/launcher.log.

Multi-node: `launch(run_dir, machine_rank=R)` starts node R's share (accelerate's `--machine_rank R`) from the same
files as every other node. Global rank numbering keeps the rank logs of nodes sharing a run directory apart; node
R > 0 writes its own logs/launcher-node-<R>.log and status-node-<R>.json (layout.RunDir.node_status).

Whatever ends the launcher, nothing it started outlives it and status.json ends in a final state: Ctrl-C, SIGTERM
and SIGHUP (a closed terminal) stop the run here; a SIGKILLed launcher is cleaned up after by its watchdog
(watchdog.py, a separate process that inherits the run directory's lock). One launch per run directory and node:
prepare_launch takes an exclusive flock (runlock.py) held until the last process is gone. Refused before any start:
a GPU plan on a machine without its GPUs (it would run silently on CPU), files edited to run an unplanned batch.

The process tree is processes.py, the per-rank logs rank_logs.py, torchrun's failure summary elastic.py, status.json
status.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from scaletrain.engine.devices.detect import require_local_gpus
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import os_error_reason, read_text_bounded, writing
from scaletrain.engine.launch.elastic import parse_failures, restarts
from scaletrain.engine.run.configs import check_planned, check_strategy
from scaletrain.engine.run.disk import check_room, free_bytes
from scaletrain.engine.run.layout import LINE_PREFIX, LINE_PREFIX_ENV, RunDir, check_host
from scaletrain.engine.request.options import TrainOptions, bundled_demo_dataset
from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
from scaletrain.engine.launch.prefetch import prefetch
from scaletrain.engine.request.data_source import is_hub_dataset
from scaletrain.engine.launch.attempts import set_aside_earlier
from scaletrain.engine.launch.processes import TRACK_SECONDS, ProcessTree, oom_kill_count, process_start
from scaletrain.engine.launch.rank_logs import RankLogs
from scaletrain.engine.launch.registry import register_quietly
from scaletrain.engine.launch.runlock import RunLock
from scaletrain.engine.run.scripts import cpu_threads, elastic_env, launch_argv, threads_env
from scaletrain.engine.launch.status import StatusWriter, read_status
from scaletrain.engine.launch.watchdog import Watchdog
STOP_GRACE_SECONDS = (20.0, 5.0)   # after SIGINT (torchrun forwards it; its own shutdown waits up to 30 s), after SIGTERM
POLL_SECONDS = 0.25
READER_JOIN_SECONDS = 5.0
EXIT_INTERRUPTED = 130                      # shell convention for SIGINT
SIGNAL_EXIT_BASE = 128                      # shell convention: killed by signal N → 128 + N


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int                          # the training's: failing rank's (signal N → 128+N), else accelerate's
    launcher_exit_code: int | None          # accelerate launch's own return code
    first_failing_rank: int | None
    failing_rank_exit_code: int | None      # raw, as torchrun reports it (negative = signal)
    exit_codes: dict[int, int]              # every rank torchrun reported (all 0 after a clean finish)
    interrupted: bool
    rank_pids: dict[int, int]
    pids: tuple[int, ...]
    argv: tuple[str, ...]
    run_dir: Path

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _Stop(Exception):
    """Raised in the main thread by the SIGTERM handler: stop the run like Ctrl-C."""


def _shell_code(code: int) -> int:
    return SIGNAL_EXIT_BASE - code if code < 0 else code


# ---- launching -------------------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    from scaletrain.engine.yamlsafe import MAX_YAML_BYTES, YamlLimitError, load_yaml

    try:
        d = load_yaml(read_text_bounded(path, MAX_YAML_BYTES, "accelerate config"))
    except FileNotFoundError:
        raise ScaletrainError(f"{path} is missing; write the run directory first (scaletrain ... --dry-run)") from None
    except YamlLimitError as e:
        raise ScaletrainError(f"{path} is refused: {e}") from None
    except yaml.YAMLError as e:
        raise ScaletrainError(f"{path} is not valid YAML ({str(e).splitlines()[0][:200]})") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        raise ScaletrainError(f"cannot read {path} ({why})") from None
    if not isinstance(d, dict):
        raise ScaletrainError(f"{path} is not an accelerate config (a YAML mapping is needed)")
    return d


def preflight(run: RunDir, doc: PlanDocument, train: TrainOptions,
              machine_rank: int | None = None) -> dict[str, Any]:
    """Refuse what would fail after the processes start: missing files, this node's share already running."""
    for path, kind in ((run.logs, "directory"), (run.checkpoints, "directory"), (run.metrics, "file"),
                       (run.node_status(machine_rank), "file")):
        if path.exists() and path.is_dir() != (kind == "directory"):
            other = "a directory" if path.is_dir() else "a file"
            raise ScaletrainError(f"{path} should be a {kind} of the run, but is {other}; move it away (the run "
                                  "writes there)")
    cfg = _read_yaml(run.accelerate_config)
    pid = read_status(run.node_status(machine_rank)).running_elsewhere()
    if pid is not None:
        raise ScaletrainError(f"{_what(run, machine_rank)} is already running (launcher pid {pid}); stop it first")
    if train.script:
        if not Path(train.script).expanduser().is_file():
            raise ScaletrainError(f"script {train.script} does not exist")
        return cfg
    doc.check_trainable()                 # what the trainer reads of plan.json: bad options fail here, once
    check_strategy(run.accelerate_config, cfg.get("distributed_type"), doc.training.strategy, doc.batch.world_size,
                   doc.recorded("objective") or "sft", doc.on_cpu)
    check_planned(run, cfg, doc.replan()[1], train)
    if train.dataset and not is_hub_dataset(train.dataset) and not Path(train.dataset).expanduser().exists():
        raise ScaletrainError(f"dataset {train.dataset} does not exist; give a data file or folder, or an HF id")
    if train.dataset is None:
        if not bundled_demo_dataset().is_file():
            raise ScaletrainError(f"the bundled demo data {bundled_demo_dataset()} is missing; set a dataset")
    if cfg.get("distributed_type") == "DEEPSPEED" and not run.ds_config.is_file():
        raise ScaletrainError(f"{run.ds_config} is missing; rewrite the run directory")
    return cfg


def _what(run: RunDir, machine_rank: int | None) -> str:
    return f"node {machine_rank} of {run.path}" if machine_rank else str(run.path)


@dataclass(frozen=True)
class PreparedLaunch:
    """A checked launch: the argv to run and what the launcher needs to attribute output to ranks."""

    run: RunDir
    argv: list[str]
    num_processes: int
    single_process: bool
    rank_offset: int
    local_ranks: range
    machine_rank: int = 0
    num_machines: int = 1
    main_process_ip: str | None = None
    threads: int | None = None              # CPU threads per process (OMP_NUM_THREADS for every rank)
    lock: RunLock | None = field(default=None, compare=False, repr=False)   # held until launch() returns
    notes: tuple[str, ...] = ()          # what the user should know before the ranks start (one line each)
    # set for accelerate launch and the ranks: scripts.elastic_env, prefetch.py's HF_HUB_OFFLINE once fetched
    env: tuple[tuple[str, str], ...] = ()

    @property
    def status(self) -> Path:
        return self.run.node_status(self.machine_rank)

    @property
    def launcher_log(self) -> Path:
        return self.run.launcher_log(self.machine_rank)


def prepare_launch(run_dir: str | os.PathLike[str], *, machine_rank: int | None = None,
                   main_process_ip: str | None = None, resume: bool = False, script: str | None = None,
                   script_args: Sequence[str] = (), progress: bool | None = None, keep_earlier: bool = True
                   ) -> PreparedLaunch:
    """Everything short of starting the ranks: read and check the run directory, fetch its hub weights and data
    (prefetch.py; `progress`: a download bar, None: on a terminal), build the argv; `keep_earlier` False: a scratch
    folder (validate's) whose earlier training is not kept in attempts/ (attempts.py).
    Raises ScaletrainError (one line) for anything that would only fail after the ranks start."""
    if not str(os.fspath(run_dir)).strip():
        raise ScaletrainError("RUN_DIR is empty; give a run directory written by scaletrain (it holds plan.json)")
    run = RunDir(run_dir)
    if run.path.exists() and not run.path.is_dir():
        raise ScaletrainError(f"{run.path} is a file, not a run directory; give the directory holding plan.json")
    doc = read_plan_document(run.plan)
    train = doc.train
    if script:
        train = replace(train, script=str(Path(script).expanduser().resolve()), script_args=tuple(script_args))
    if main_process_ip is not None:
        main_process_ip = check_host(main_process_ip)
    cfg = preflight(run, doc, train, machine_rank)
    try:
        nprocs = int(cfg.get("num_processes") or 1)
        nmachines = int(cfg.get("num_machines") or 1)
        cfg_rank = int(cfg.get("machine_rank") or 0)
    except (TypeError, ValueError):
        raise ScaletrainError(f"{run.accelerate_config}: num_processes, num_machines and machine_rank must be "
                              "whole numbers") from None
    single = nprocs <= 1 or bool(cfg.get("use_cpu")) or cfg.get("distributed_type") == "NO"
    per_node = max(1, nprocs // max(1, nmachines))
    threads = cpu_threads(1 if single else per_node)        # this node's cores ÷ the processes it starts
    argv = launch_argv(run, train, machine_rank=machine_rank, main_process_ip=main_process_ip,
                       deepspeed=isinstance(cfg.get("deepspeed_config"), dict), threads=threads)
    if resume:
        if train.script:
            raise ScaletrainError("--resume is for the bundled trainer; pass your script its own resume flag")
        argv.append("--resume")
    node = machine_rank if machine_rank is not None else cfg_rank
    head = main_process_ip or cfg.get("main_process_ip")
    _check_node(run, node, nmachines, head)
    per_node_gpus = doc.gpus_per_node if isinstance(doc.gpus_per_node, int) else 1
    require_local_gpus("cpu" if doc.on_cpu else "cuda", per_node_gpus, f"{run.path} ({doc.gpu or 'GPU'})")
    offset = node * per_node
    # the bundled trainer's checkpoints and logs must fit the disk; a fresh start's old checkpoints stay on it
    if not train.script:
        check_room(run.path, doc.replan()[1], train, written_bytes=_bytes_under(run.checkpoints) if resume else 0)
    fetched = prefetch(train, progress)                  # the hub's files on this node, the tokenizer checked
    lock = RunLock(run.node_lock(node)).acquire(_what(run, node))       # last: a refused launch leaves no lock
    # a fresh start over earlier training keeps it aside (attempts.py); on the head node (another node's partitions
    # follow the head's commit)
    aside = set_aside_earlier(run) if keep_earlier and not resume and not train.script and node == 0 else None
    return PreparedLaunch(run, argv, nprocs, single, offset, range(offset, offset + (1 if single else per_node)),
                          machine_rank=node, num_machines=nmachines, main_process_ip=str(head) if head else None,
                          threads=threads, lock=lock,
                          notes=loop_notes(doc, train) + fetched.notes + ((aside,) if aside else ()),
                          env=tuple({**elastic_env(train, multi_node=nmachines > 1), **fetched.env}.items()))


def loop_notes(doc: PlanDocument, train: TrainOptions) -> tuple[str, ...]:
    """Which loop the plan's numbers are for, when it is not the loop that runs: a user script, or the bundled
    trainer on a supervised plan made for another loop."""
    loop = doc.training.loop
    if not train.script:
        if loop == "trainer" or (doc.recorded("objective") or "sft") != "sft":
            return ()
        return (f"plan.json's memory numbers are for --loop {loop}; the bundled trainer runs its own loop (plan "
                "with --loop trainer for its numbers)",)
    if loop == "trainer":
        return (f"plan.json's memory numbers are for the bundled trainer's loop (--loop trainer), which drops the "
                f"model's outputs before backward; if {Path(train.script).name} keeps `outputs` alive through "
                "backward (accelerate's examples do), it needs its B·S·V logits more: plan it with --loop "
                "accelerate-loop (a plan written with the script does by default)",)
    return (f"plan.json's memory numbers are for --loop {loop}",)


def _check_node(run: RunDir, node: int, nmachines: int, head: Any) -> None:
    """A node's rank must exist in the plan, and a multi-node launch needs the head node's address."""
    if node < 0 or node >= nmachines:
        if nmachines == 1:
            raise ScaletrainError(f"--machine-rank {node}: {run.path} is a single-node plan (machine rank 0 only); "
                                  "plan with --nodes N for a multi-node run")
        raise ScaletrainError(f"--machine-rank {node} is outside this plan's {nmachines} nodes; give 0 (the head "
                              f"node) to {nmachines - 1}")
    if nmachines > 1 and not head:
        raise ScaletrainError(f"this plan runs on {nmachines} nodes and names no head-node address; pass "
                              "--main-process-ip HEAD (the address of machine rank 0, reachable from every node) "
                              "to `scaletrain launch`, or when writing the plan")


def launch(run_dir: str | os.PathLike[str], *, machine_rank: int | None = None, main_process_ip: str | None = None,
           on_output: Callable[[int | None, str], None] | None = None, on_tick: Callable[[], None] | None = None,
           resume: bool = False, script: str | None = None, script_args: Sequence[str] = (),
           env: dict[str, str] | None = None, stop: threading.Event | None = None,
           stop_grace_seconds: tuple[float, float] = STOP_GRACE_SECONDS,
           prepared: PreparedLaunch | None = None) -> LaunchResult:
    """Run the run directory's launch argv to the end (or until Ctrl-C / SIGTERM / `stop` set) and record
    status.json.

    on_output(rank, line) sees every console line (rank None: the launcher itself); on_tick() runs every poll.
    Signals reach only the main thread: a caller running this in a worker thread stops the run by setting `stop`.
    script/script_args run a user script under the written configs instead of the bundled trainer.
    prepared: what prepare_launch returned for these same arguments (a caller that checked first), not redone.
    """
    prep = prepared or prepare_launch(run_dir, machine_rank=machine_rank, main_process_ip=main_process_ip,
                                      resume=resume, script=script, script_args=script_args)
    try:
        return _run(prep, on_output, on_tick, env, stop, stop_grace_seconds)
    finally:
        if prep.lock is not None:
            prep.lock.release()


def _starting(prep: PreparedLaunch, logs: RankLogs) -> StatusWriter:
    """status.json says "starting"; a run nobody can watch or diagnose (status.json unwritable) is refused here."""
    status = StatusWriter(prep.status)
    started = datetime.now().isoformat(timespec="seconds")
    status.write(state="starting", started=started, argv=tuple(prep.argv), host=socket.gethostname(),
                 launcher_pid=os.getpid(), launcher_start=process_start(os.getpid()))
    if status.failed is not None:
        logs.close()
        raise ScaletrainError(f"cannot write {prep.status}: {os_error_reason(status.failed)}")
    note = register_quietly(prep.run.path)            # `scaletrain runs` lists it, wherever the folder is
    if note:
        logs.feed_raw(prep.launcher_log.name, note)
    return status


def _spawn(prep: PreparedLaunch, logs: RankLogs, env: dict[str, str] | None) -> tuple[subprocess.Popen, Any]:
    """`accelerate launch` in its own session, its output piped (rank-prefixed lines); the launcher's signal
    handlers are installed first (the child must not inherit an ignored SIGINT) and returned for restoring."""
    argv = prep.argv
    child_env = dict(os.environ if env is None else env)
    child_env[LINE_PREFIX_ENV] = LINE_PREFIX
    child_env["PYTHONUNBUFFERED"] = "1"
    if prep.threads is not None:
        child_env.update(threads_env(prep.threads))
    child_env.update(prep.env)
    old_signals = _install_signals()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=child_env, cwd=str(prep.run.path), start_new_session=True)
    except OSError as e:
        _restore_signals(old_signals)
        logs.close()
        raise ScaletrainError(f"cannot start {argv[0]} ({e.strerror})") from None
    except BaseException:
        _restore_signals(old_signals)
        logs.close()
        raise
    return proc, old_signals


def _run(prep: PreparedLaunch, on_output: Callable[[int | None, str], None] | None,
         on_tick: Callable[[], None] | None, env: dict[str, str] | None, stop: threading.Event | None,
         stop_grace_seconds: tuple[float, float]) -> LaunchResult:
    with writing(f"the logs of {prep.run.path}"):
        logs = RankLogs(prep.run, single_process=prep.single_process, rank_offset=prep.rank_offset,
                        launcher_log=prep.launcher_log.name)
    logs.start(prep.local_ranks)
    status = _starting(prep, logs)
    ooms_before = oom_kill_count()
    proc, old_signals = _spawn(prep, logs, env)
    tree = ProcessTree(proc.pid)
    rank_pids: dict[int, int] = {}
    watchdog: Watchdog | None = None

    def reader(stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            rank, text = logs.feed(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            if on_output is not None and text is not None:
                try:
                    on_output(rank, text)
                except Exception:          # a viewer's bug (or a hung-up terminal) must not stop log capture
                    pass
        stream.close()

    last_scan = [0.0]

    def refresh(every_poll: bool = True) -> None:
        # a rank caught between fork and exec still has accelerate's environment (no RANK): look again until
        # every local rank is known; after that, every TRACK_SECONDS (the loop's calls pass every_poll=False)
        nonlocal rank_pids
        settled = set(prep.local_ranks) <= set(rank_pids)
        if not every_poll and settled and time.monotonic() - last_scan[0] < TRACK_SECONDS:
            return
        last_scan[0] = time.monotonic()
        grew = tree.snapshot()
        if grew or not set(prep.local_ranks) <= set(rank_pids):
            found = {**rank_pids, **tree.rank_pids(prep.single_process)}
            if grew or found != rank_pids:
                rank_pids = found
                status.write(**_pid_fields(proc.pid, rank_pids, tree))

    readers = [threading.Thread(target=reader, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    interrupted = False
    try:
        for t in readers:
            t.start()
        watchdog = Watchdog.start(proc.pid, prep.status, prep.lock.fd if prep.lock is not None else None)
        if not watchdog.ready:
            logs.feed_raw(prep.launcher_log.name, "scaletrain: warning: the watchdog did not start; if this launcher "
                                                  "is killed with SIGKILL its processes keep running")
        status.write(state="running", machine_rank=prep.machine_rank if prep.num_machines > 1 else None,
                     num_machines=prep.num_machines, local_ranks=tuple(prep.local_ranks),
                     **_pid_fields(proc.pid, {}, tree))
        while proc.poll() is None:
            refresh(every_poll=False)
            if on_tick is not None:
                on_tick()
            if stop is not None and stop.wait(POLL_SECONDS):
                raise _Stop()
            if stop is None:
                time.sleep(POLL_SECONDS)
    except (KeyboardInterrupt, _Stop):
        interrupted = True
    except BaseException:
        interrupted = True                     # the caller's own exception (a deadline, a viewer): stop, record
        raise
    finally:
        logs.stopping = interrupted            # the agent's answer to the stop is not a crash (rank_logs.py)
        try:
            _stop(proc, tree, refresh, stop_grace_seconds if proc.poll() is None else (0.0, stop_grace_seconds[1]))
        except (KeyboardInterrupt, _Stop):      # a second Ctrl-C: go straight to SIGKILL
            interrupted = True
            tree.signal_all(signal.SIGKILL)
            proc.wait()
        finally:
            _restore_signals(old_signals)
            for t in readers:
                if t.is_alive() or t.ident is not None:
                    t.join(READER_JOIN_SECONDS)
            logs.close()
            ooms_after = oom_kill_count()
            ooms = ooms_after - ooms_before if ooms_after is not None and ooms_before is not None else None
            result = _finish(prep, proc, tree, logs, status, rank_pids, interrupted, ooms)
            if watchdog is not None:
                watchdog.done()
    if on_tick is not None:
        on_tick()
    return result


def _finish(prep: PreparedLaunch, proc: subprocess.Popen, tree: ProcessTree, logs: RankLogs, status: StatusWriter,
            rank_pids: dict[int, int], interrupted: bool, oom_kills: int | None) -> LaunchResult:
    """Every process is gone: status.json's final state, and the result."""
    rc = proc.returncode
    # a run the elastic agent restarted and then finished (rc 0) has "failed" lines from the restarted rounds:
    # they are restarts, not the run's failure
    rank, rank_code, codes = ((None, None, {}) if interrupted or rc == 0
                              else parse_failures(logs.launcher_lines, prep.rank_offset))
    restarted = restarts(logs.launcher_lines, rc == 0 and not interrupted, prep.rank_offset)
    if rc == 0 and not codes:
        codes = {r: 0 for r in prep.local_ranks}
    if interrupted:
        code = EXIT_INTERRUPTED
    elif rank_code is not None and rank_code != 0:
        code = _shell_code(rank_code)
    else:
        code = _shell_code(rc) if rc else 0
    state = "interrupted" if interrupted else ("finished" if code == 0 else "failed")
    status.write(state=state, ended=datetime.now().isoformat(timespec="seconds"), exit_code=code,
                 launcher_exit_code=rc, first_failing_rank=rank, failing_rank_exit_code=rank_code,
                 exit_codes=dict(codes), disk_full=status.status.disk_full or logs.disk_full,
                 disk_free_bytes=free_bytes(prep.run.path), oom_kills=oom_kills,
                 restarts=tuple((r.number, r.rank, r.exit_code) for r in restarted),
                 **_pid_fields(proc.pid, rank_pids, tree))
    return LaunchResult(exit_code=code, launcher_exit_code=rc, first_failing_rank=rank,
                        failing_rank_exit_code=rank_code, exit_codes=codes, interrupted=interrupted,
                        rank_pids=dict(rank_pids), pids=tuple(sorted(tree.known)), argv=tuple(prep.argv),
                        run_dir=prep.run.path)


def _bytes_under(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return 0


def _pid_fields(accelerate_pid: int, rank_pids: dict[int, int], tree: ProcessTree) -> dict[str, Any]:
    """status.json's pids: the launcher, accelerate and each rank, plus every process the launcher tracked."""
    return {"launcher_pid": os.getpid(), "accelerate_pid": accelerate_pid, "rank_pids": dict(rank_pids),
            "tracked_pids": tuple(sorted(tree.known))}


def _stop(proc: subprocess.Popen, tree: ProcessTree, refresh: Callable[[], None],
          grace: tuple[float, float]) -> None:
    """SIGINT to accelerate's group, then SIGTERM, then SIGKILL to everything tracked; returns when none is left."""
    refresh()
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    for sig, wait_s in ((signal.SIGTERM, grace[0]), (signal.SIGKILL, grace[1]), (None, grace[1])):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is None:
                refresh()
            if proc.poll() is not None and not tree.alive():
                return
            time.sleep(POLL_SECONDS / 5)
        if sig is None:
            break
        tree.signal_all(sig)
    proc.wait()


def _install_signals() -> Any:
    """SIGTERM and SIGHUP (a closed terminal) stop the run like Ctrl-C, and SIGINT raises KeyboardInterrupt even
    where the parent shell ignored it (background jobs of a script start with SIGINT ignored). Main thread only;
    elsewhere the caller handles signals."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise _Stop()

    return (signal.signal(signal.SIGTERM, handler), signal.signal(signal.SIGINT, signal.default_int_handler),
            signal.signal(signal.SIGHUP, handler))


def _restore_signals(old: Any) -> None:
    if old is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        signal.signal(signal.SIGHUP, old[2])


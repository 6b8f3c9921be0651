"""Run a run directory: `accelerate launch` as an argument list in its own session, per-rank logs, a clean stop.

Why the care: torchrun starts every rank with start_new_session=True, so the ranks are not in the launcher's
process group and a killed `accelerate launch` leaves them running. This module therefore tracks every descendant
it has ever seen (pid + start time, so a recycled pid is never signalled) and stops them all:
SIGINT to accelerate (torchrun forwards it to the ranks) → SIGTERM to every tracked process group → SIGKILL.

Per-rank logs: launch_argv passes `--tee 3 --log_dir logs/elastic`, and the environment sets torchrun's line
prefix to `[rank<global rank>]:`; lines are split into logs/rank-<i>.log, the launcher's own into
logs/launcher.log.

Multi-node: `launch(run_dir, machine_rank=R)` starts node R's share (accelerate's `--machine_rank R`) from the same
files as every other node. Global rank numbering keeps the rank logs of nodes sharing a run directory apart; node
R > 0 writes its own logs/launcher-node-<R>.log and status-node-<R>.json (rundir.RunDir.node_status).

status.json: {"state": running|finished|failed|interrupted, "exit_code" (the training's: the first failing rank's,
signal N → 128+N; 130 after Ctrl-C), "launcher_exit_code" (accelerate's own), "first_failing_rank",
"failing_rank_exit_code", "exit_codes" {rank: code as torchrun reports it}, "pids" {"launcher", "accelerate",
"<rank>": pid}, "rank_pids", "tracked_pids", "argv", "started", "ended"}.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.layout import LINE_PREFIX, LINE_PREFIX_ENV, RunDir, TrainOptions, atomic_write, check_host, launch_argv

# "[rank3]:" (ours) or torchrun's default "[<role><local rank>]:" when launch.sh is run by hand
_PREFIX_RE = re.compile(r"^\[(rank|[A-Za-z_]\w*?)(\d+)\]:")
_ROOT_CAUSE = "Root Cause (first observed failure)"   # torch/distributed/elastic/multiprocessing/errors
_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_AGENT_FAIL_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
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


# ---- the process tree ------------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) from /proc/<pid>/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return int(rest[1]), rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


class ProcessTree:
    """Every descendant of a root ever observed, identified by (pid, start time)."""

    def __init__(self, root: int):
        self.root = root
        self.known: dict[int, int] = {}
        st = _stat(root)
        if st:
            self.known[root] = st[2]

    def snapshot(self) -> bool:
        """Add the current descendants of the root and of every known process; True when something was new."""
        children: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return False
        for name in entries:
            if not name.isdigit():
                continue
            st = _stat(int(name))
            if st:
                children.setdefault(st[0], []).append(int(name))
                starts[int(name)] = st[2]
        before = len(self.known)
        queue = [p for p in self.known if starts.get(p) == self.known[p]]
        while queue:
            p = queue.pop()
            for c in children.get(p, ()):
                if c not in self.known:
                    self.known[c] = starts[c]
                    queue.append(c)
        return len(self.known) > before

    def alive(self) -> list[int]:
        out = []
        for pid, start in self.known.items():
            st = _stat(pid)
            if st and st[2] == start and st[1] != "Z":
                out.append(pid)
        return sorted(out)

    def signal_all(self, sig: int) -> None:
        """Send sig to every live tracked process and its process group (ranks lead their own)."""
        for pid in self.alive():
            for fn, target in ((os.killpg, pid), (os.kill, pid)):
                try:
                    if fn is os.killpg and os.getpgid(pid) != pid:
                        continue
                    fn(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def rank_pids(self, single_process: bool = False) -> dict[int, int]:
        """Global rank → pid: the shallowest tracked process whose environment carries RANK. accelerate's
        single-process launcher sets no RANK: its one child is rank 0."""
        if single_process:
            kids = [p for p in self.alive() if (st := _stat(p)) and st[0] == self.root]
            return {0: kids[0]} if len(kids) == 1 else {}
        found: dict[int, tuple[int, int]] = {}
        for pid in self.alive():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
            if rank is None or not rank.isdigit() or pid == self.root:
                continue
            depth, p = 0, pid
            while p and p != self.root and depth < 64:
                st = _stat(p)
                p = st[0] if st else 0
                depth += 1
            r = int(rank)
            if r not in found or depth < found[r][1]:
                found[r] = (pid, depth)
        return {r: v[0] for r, v in sorted(found.items())}


# ---- logs ------------------------------------------------------------------------------------------------------
class RankLogs:
    """Split prefixed console lines into logs/rank-<i>.log; the rest goes to logs/launcher.log."""

    def __init__(self, run: RunDir, *, single_process: bool, rank_offset: int = 0, launcher_log: str | None = None):
        self.run = run
        self.single = single_process
        self.rank_offset = rank_offset
        self.launcher_log = launcher_log or run.launcher_log().name
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.launcher_lines: list[str] = []
        run.logs.mkdir(parents=True, exist_ok=True)

    def start(self, ranks: range) -> None:
        """Open (create) this machine's rank logs and mark where this launch begins in each."""
        stamp = datetime.now().isoformat(timespec="seconds")
        for r in ranks:
            self.feed_raw(self.run.rank_log(r).name, f"==> scaletrain launch {stamp} <==")
        self.feed_raw(self.launcher_log, f"==> scaletrain launch {stamp} <==")

    def feed_raw(self, name: str, text: str) -> None:
        with self._lock:
            self._write(name, text)

    def _write(self, name: str, text: str) -> None:
        """Append one line to logs/<name> and flush (caller holds the lock)."""
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = (self.run.logs / name).open("a", encoding="utf-8")
        f.write(text + "\n")
        f.flush()

    def feed(self, line: str) -> tuple[int | None, str]:
        """Route one line; returns (rank or None for the launcher, the line without its prefix)."""
        m = _PREFIX_RE.match(line)
        if m:
            rank = int(m.group(2)) + (0 if m.group(1) == "rank" else self.rank_offset)
            text = line[m.end():]
            name = self.run.rank_log(rank).name
        else:
            rank, text, name = (0 if self.single else None), line, self.launcher_log
            self.launcher_lines.append(line)
        with self._lock:
            self._write(name, text)
            if rank is not None and name == self.launcher_log:
                self._write(self.run.rank_log(rank).name, text)
        return rank, text

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


def parse_failures(lines: Sequence[str], rank_offset: int = 0) -> tuple[int | None, int | None, dict[int, int]]:
    """From torchrun's failure summary: (first failing rank, its exit code, every reported rank's exit code).

    The first failing rank is the "Root Cause (first observed failure)" block; the ranks torchrun then stopped
    (exit -15) are listed under "Failures:". Without a summary, the agent's "failed (exitcode: N) local_rank: R"
    (a local rank: this node's first global rank, rank_offset, is added).
    """
    codes: dict[int, int] = {}
    root: tuple[int | None, int | None] = (None, None)
    in_root = False
    rank: int | None = None
    for line in lines:
        if _ROOT_CAUSE in line:
            in_root = True
        elif m := _RANK_RE.match(line):
            rank = int(m.group(1))
        elif (m := _EXIT_RE.match(line)) and rank is not None:
            codes[rank] = int(m.group(1))
            if in_root and root[0] is None:
                root = (rank, codes[rank])
            rank = None
    if root[0] is None:
        for line in lines:
            if m := _AGENT_FAIL_RE.search(line):
                codes.setdefault(int(m.group(2)) + rank_offset, int(m.group(1)))
                if root[0] is None:
                    root = (int(m.group(2)) + rank_offset, int(m.group(1)))
    return root[0], root[1], codes


def _shell_code(code: int) -> int:
    return SIGNAL_EXIT_BASE - code if code < 0 else code


# ---- launching -------------------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        d = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ScaletrainError(f"{path} is missing; write the run directory first (scaletrain ... --dry-run)") from None
    except yaml.YAMLError as e:
        raise ScaletrainError(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise ScaletrainError(f"{path} is not an accelerate config (a YAML mapping is needed)")
    return d


def _pid_alive(pid: int) -> bool:
    st = _stat(pid)
    return bool(st) and st[1] != "Z"


def preflight(run: RunDir, train: TrainOptions, machine_rank: int | None = None) -> dict[str, Any]:
    """Refuse what would fail after the processes start: missing files, this node's share already running."""
    cfg = _read_yaml(run.accelerate_config)
    status = run.node_status(machine_rank)
    if status.exists():
        try:
            old = json.loads(status.read_text())
        except ValueError:
            old = {}
        pid = (old.get("pids") or {}).get("launcher")
        if old.get("state") == "running" and isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid):
            what = f"node {machine_rank} of {run.path}" if machine_rank else str(run.path)
            raise ScaletrainError(f"{what} is already running (launcher pid {pid}); stop it first")
    if train.script:
        if not Path(train.script).expanduser().is_file():
            raise ScaletrainError(f"script {train.script} does not exist")
        return cfg
    from scaletrain.trainer.train import read_run_config
    read_run_config(run.path)             # the trainer's own reading of plan.json: bad options fail here, once
    if train.dataset is not None and not Path(train.dataset).expanduser().is_file():
        raise ScaletrainError(f"dataset {train.dataset} does not exist; give a JSONL file (text, prompt/response or "
                              "messages per line)")
    if train.dataset is None:
        from scaletrain.trainer.data import bundled_demo_dataset
        if not bundled_demo_dataset().is_file():
            raise ScaletrainError(f"the bundled demo data {bundled_demo_dataset()} is missing; set a dataset")
    if cfg.get("distributed_type") == "DEEPSPEED" and not run.ds_config.is_file():
        raise ScaletrainError(f"{run.ds_config} is missing; rewrite the run directory")
    return cfg


@dataclass
class _Status:
    path: Path                              # this node's status file (RunDir.node_status)
    doc: dict[str, Any] = field(default_factory=dict)

    def write(self, **changes: Any) -> None:
        self.doc.update(changes)
        atomic_write(self.path, json.dumps(self.doc, indent=2) + "\n", backup=False)


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

    @property
    def status(self) -> Path:
        return self.run.node_status(self.machine_rank)

    @property
    def launcher_log(self) -> Path:
        return self.run.launcher_log(self.machine_rank)


def prepare_launch(run_dir: str | os.PathLike[str], *, machine_rank: int | None = None,
                   main_process_ip: str | None = None, resume: bool = False, script: str | None = None,
                   script_args: Sequence[str] = ()) -> PreparedLaunch:
    """Everything short of starting a process: read and check the run directory, build the argv.
    Raises ScaletrainError (one line) for anything that would only fail after the ranks start."""
    run = RunDir(run_dir)
    plan = run.read_plan()
    if script:
        plan = dict(plan)
        plan["train"] = {**(plan.get("train") or {}), "script": str(Path(script).expanduser().resolve()),
                         "script_args": list(script_args)}
    train = TrainOptions.from_json(plan.get("train"))
    if main_process_ip is not None:
        main_process_ip = check_host(main_process_ip)
    cfg = preflight(run, train, machine_rank)
    argv = launch_argv(run, plan, machine_rank=machine_rank, main_process_ip=main_process_ip)
    if resume:
        if train.script:
            raise ScaletrainError("--resume is for the bundled trainer; pass your script its own resume flag")
        argv.append("--resume")
    try:
        nprocs = int(cfg.get("num_processes") or 1)
        nmachines = int(cfg.get("num_machines") or 1)
        cfg_rank = int(cfg.get("machine_rank") or 0)
    except (TypeError, ValueError):
        raise ScaletrainError(f"{run.accelerate_config}: num_processes, num_machines and machine_rank must be "
                              "whole numbers") from None
    node = machine_rank if machine_rank is not None else cfg_rank
    head = main_process_ip or cfg.get("main_process_ip")
    _check_node(run, node, nmachines, head)
    single = nprocs <= 1 or bool(cfg.get("use_cpu")) or cfg.get("distributed_type") == "NO"
    per_node = max(1, nprocs // max(1, nmachines))
    offset = node * per_node
    return PreparedLaunch(run, argv, nprocs, single, offset, range(offset, offset + (1 if single else per_node)),
                          machine_rank=node, num_machines=nmachines, main_process_ip=str(head) if head else None)


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
    run, argv = prep.run, prep.argv
    logs = RankLogs(run, single_process=prep.single_process, rank_offset=prep.rank_offset,
                    launcher_log=prep.launcher_log.name)
    logs.start(prep.local_ranks)
    child_env = dict(os.environ if env is None else env)
    child_env[LINE_PREFIX_ENV] = LINE_PREFIX
    child_env["PYTHONUNBUFFERED"] = "1"

    status = _Status(prep.status)
    started = datetime.now().isoformat(timespec="seconds")
    old_signals = _install_signals()          # before Popen: the child must not inherit an ignored SIGINT
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env,
                                cwd=str(run.path), start_new_session=True)
    except OSError as e:
        _restore_signals(old_signals)
        logs.close()
        raise ScaletrainError(f"cannot start {argv[0]} ({e.strerror})") from None
    except BaseException:
        _restore_signals(old_signals)
        logs.close()
        raise
    tree = ProcessTree(proc.pid)
    rank_pids: dict[int, int] = {}

    def reader(stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            rank, text = logs.feed(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            if on_output is not None:
                try:
                    on_output(rank, text)
                except Exception:          # a viewer's bug must not stop log capture
                    pass
        stream.close()

    def refresh() -> None:
        # a rank caught between fork and exec still has accelerate's environment (no RANK): look again until
        # every local rank is known
        nonlocal rank_pids
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
        status.write(state="running", started=started, argv=argv, machine_rank=machine_rank,
                     num_machines=prep.num_machines, local_ranks=list(prep.local_ranks),
                     **_pid_fields(proc.pid, {}, tree))
        while proc.poll() is None:
            refresh()
            if on_tick is not None:
                on_tick()
            if stop is not None and stop.wait(POLL_SECONDS):
                raise _Stop()
            if stop is None:
                time.sleep(POLL_SECONDS)
    except (KeyboardInterrupt, _Stop):
        interrupted = True
    finally:
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
    if on_tick is not None:
        on_tick()

    rc = proc.returncode
    rank, rank_code, codes = ((None, None, {}) if interrupted
                              else parse_failures(logs.launcher_lines, prep.rank_offset))
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
                 exit_codes={str(r): c for r, c in sorted(codes.items())}, **_pid_fields(proc.pid, rank_pids, tree))
    return LaunchResult(exit_code=code, launcher_exit_code=rc, first_failing_rank=rank,
                        failing_rank_exit_code=rank_code, exit_codes=codes, interrupted=interrupted, rank_pids=dict(rank_pids),
                        pids=tuple(sorted(tree.known)), argv=tuple(argv), run_dir=run.path)


def _pid_fields(accelerate_pid: int, rank_pids: dict[int, int], tree: ProcessTree) -> dict[str, Any]:
    """status.json's pids: {"launcher", "accelerate", "<rank>": pid...}, plus every process the launcher tracked."""
    pids: dict[str, int] = {"launcher": os.getpid(), "accelerate": accelerate_pid}
    pids.update({str(r): p for r, p in sorted(rank_pids.items())})
    return {"pids": pids, "rank_pids": {str(r): p for r, p in sorted(rank_pids.items())},
            "tracked_pids": sorted(tree.known)}


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
    """SIGTERM stops the run like Ctrl-C, and SIGINT raises KeyboardInterrupt even where the parent shell ignored it
    (background jobs of a script start with SIGINT ignored). Main thread only; elsewhere the caller handles signals."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise _Stop()

    return (signal.signal(signal.SIGTERM, handler), signal.signal(signal.SIGINT, signal.default_int_handler))


def _restore_signals(old: Any) -> None:
    if old is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])


def rank_log_tail(run_dir: str | os.PathLike[str], rank: int, lines: int = 20) -> list[str]:
    """The last lines of one rank's log (for a failure report)."""
    try:
        text = RunDir(run_dir).rank_log(rank).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return text.splitlines()[-lines:]


if __name__ == "__main__":       # python -m scaletrain.engine.run.launcher RUN_DIR (no progress view)
    try:
        sys.exit(launch(sys.argv[1]).exit_code)
    except ScaletrainError as e:
        print(f"scaletrain: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)

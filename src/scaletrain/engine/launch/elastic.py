"""torchelastic's output, read in one place: its per-line rank prefix, the "Root Cause" failure summary, and the
agent's "failed (exitcode: N) local_rank: R" line (torch 2.13, tests/fixtures/logs/elastic_*.log).

The launcher reads the summary of a run it started (parse_failures); the doctor scans logs line by line with the
same patterns (root_cause, agent_failure, split_prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

# torchrun's console prefix: "[rank3]:" (scaletrain's template: the global rank) or its default "[<role><local
# rank>]:" ("[default3]:") when launch.sh runs by hand
RE_PREFIX = re.compile(r"^\[(rank|[A-Za-z_]\w*?)(\d+)\]:")
RE_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
RE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)(?: \(local_rank: (\d+)\))?")
RE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?: \(pid: (\d+)\))?")
RE_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
RE_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)(?: \(pid: (\d+)\))?")
RE_BLOCK_END = re.compile(r"^=====")
SIGTERM = 15           # what torchrun sends the surviving ranks once one has failed
# How many lines after "Root Cause" the block's rank / exitcode / signal lines are looked for.
ROOT_CAUSE_WINDOW = 9


@dataclass(frozen=True)
class Prefix:
    role: str              # "rank" (a global rank) or torchrun's role name (a local rank)
    number: int
    end: int               # where the prefix ends in the line


def split_prefix(line: str) -> Prefix | None:
    m = RE_PREFIX.match(line)
    return Prefix(m.group(1), int(m.group(2)), m.end()) if m else None


@dataclass(frozen=True)
class AgentFailure:
    exit_code: int
    local_rank: int
    pid: int | None


def agent_failure(line: str) -> AgentFailure | None:
    """The agent's "failed (exitcode: N) local_rank: R (pid: P)" line."""
    m = RE_AGENT_FAILED.search(line)
    if not m:
        return None
    return AgentFailure(int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None)


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    exit_code: int
    pid: int | None
    evidence: tuple[int, ...]          # indexes into the lines after the mark that prove it


def root_cause(line: str, following: Sequence[str]) -> RootCause | None:
    """The "Root Cause (first observed failure):" block starting at `line` (None: not one, or no exit code)."""
    if not RE_ROOT_CAUSE.search(line):
        return None
    rank = code = pid = None
    evidence = []
    for i, nxt in enumerate(following[:ROOT_CAUSE_WINDOW]):
        r, e, s = RE_RANK.search(nxt), RE_EXIT.search(nxt), RE_SIGNAL.search(nxt)
        if r:
            rank = int(r.group(1))
            evidence.append(i)
        elif e:
            code, pid = int(e.group(1)), int(e.group(2)) if e.group(2) else None
            evidence.append(i)
        elif s:
            evidence.append(i)
        if RE_BLOCK_END.match(nxt):
            break
    if code is None:
        return None
    return RootCause(rank, code, pid, tuple(evidence))


def parse_failures(lines: Sequence[str], rank_offset: int = 0) -> tuple[int | None, int | None, dict[int, int]]:
    """From torchrun's failure summary: (first failing rank, its exit code, every reported rank's exit code).

    The first failing rank is the "Root Cause (first observed failure)" block; the ranks torchrun then stopped
    (exit -15) are listed under "Failures:". Without a summary, the agent's "failed (exitcode: N) local_rank: R"
    (a local rank: this node's first global rank, rank_offset, is added).

    torchrun's "first observed" is by timestamp, and a rank that exits with an error because its peer vanished
    (gloo "Connection closed by peer", NCCL "remote process exited") can be observed before the peer that was
    killed: a rank killed by a signal torchrun does not send first (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, not
    SIGTERM) did not choose to die, so it is the first failure when the observed one only exited with an error.
    """
    codes: dict[int, int] = {}
    root: tuple[int | None, int | None] = (None, None)
    in_root = False
    rank: int | None = None
    for line in lines:
        if RE_ROOT_CAUSE.search(line):
            in_root = True
        elif m := RE_RANK.match(line):
            rank = int(m.group(1))
        elif (m := RE_EXIT.match(line)) and rank is not None:
            codes[rank] = int(m.group(1))
            if in_root and root[0] is None:
                root = (rank, codes[rank])
            rank = None
    if root[1] is not None and root[1] > 0:
        killed = [(r, c) for r, c in sorted(codes.items()) if c < 0 and c != -SIGTERM]
        if killed:
            root = killed[0]
    if root[0] is None:
        for line in lines:
            if a := agent_failure(line):
                codes.setdefault(a.local_rank + rank_offset, a.exit_code)
                if root[0] is None:
                    root = (a.local_rank + rank_offset, a.exit_code)
    return root[0], root[1], codes


# ---- restarts under torchelastic (train.max_restarts) ------------------------------------------------------------
# torchrun starts every worker of a restarted group with TORCHELASTIC_RESTART_COUNT (1 on the first restart) and
# TORCHELASTIC_MAX_RESTARTS (torch/distributed/elastic/agent/server/local_elastic_agent.py); its own "will restart
# worker group" line is logged at INFO, below torchrun's default level, so the trainer's rank 0 says it instead.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"
RE_RESTART = re.compile(r"scaletrain: elastic restart (\d+) of (\d+)")


def restart_count(env: dict[str, str] | Any) -> int:
    """Which restart of the worker group this process belongs to (0: the first start, or not under torchrun)."""
    try:
        return max(0, int(env.get(RESTART_COUNT_ENV, "0") or 0))
    except ValueError:
        return 0


def restart_line(count: int, env: dict[str, str] | Any) -> str:
    """Rank 0's line on a restarted worker group (RE_RESTART reads it back)."""
    limit = env.get(MAX_RESTARTS_ENV) or "?"
    return (f"scaletrain: elastic restart {count} of {limit}: torchrun restarted every rank after a rank failed; "
            "resuming from the newest checkpoint")


@dataclass(frozen=True)
class Restart:
    """One restart of the worker group: the rank whose failure caused it and how it ended (negative: a signal)."""
    number: int
    rank: int | None
    exit_code: int | None

    def describe(self) -> str:
        import signal as _signal

        how = "?"
        if self.exit_code is not None and self.exit_code < 0:
            try:
                how = f"killed by {_signal.Signals(-self.exit_code).name}"
            except ValueError:
                how = f"killed by signal {-self.exit_code}"
        elif self.exit_code is not None:
            how = f"exit code {self.exit_code}"
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        return f"restart {self.number}: {who} {how}"

    def to_json(self) -> dict[str, Any]:
        return {"restart": self.number, "rank": self.rank, "exit_code": self.exit_code}


def restarts(launcher_lines: Sequence[str], finished: bool, rank_offset: int = 0) -> list[Restart]:
    """The worker-group restarts in a launcher's output: each agent "failed (exitcode: N) local_rank: R" line is one
    failed round; all of them were restarted when the run finished, all but the last when it failed."""
    rounds = [a for line in launcher_lines if (a := agent_failure(line)) is not None]
    if not finished and rounds:
        rounds = rounds[:-1]
    return [Restart(i + 1, a.local_rank + rank_offset, a.exit_code) for i, a in enumerate(rounds)]

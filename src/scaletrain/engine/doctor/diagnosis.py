"""Failure doctor: read a dead run's logs and exit codes, name the first real failure, and say how to fix it.

Why a separate pass: when one rank dies, torchrun SIGTERMs the others and the survivors print NCCL timeouts
and aborted-communicator errors that look just as alarming. The doctor collects every signature it knows
(regexes below, each with its source), ranks them by how causal they are (an OOM beats the NCCL timeout it
caused; a SIGTERM never causes anything), then by time, and reports the first failing rank with the log lines
that prove it. Remedies come from the planner's ranking for OOMs (engine.remedies) and from known fixes for
NCCL, host-memory, fp16 and config failures, each with the plan's predicted per-GPU bytes and step time.

No torch import: diagnosing is text processing plus the memory/time model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.units import fmt_bytes
from scaletrain.engine.vocabulary import Offload

KINDS = ("cuda_oom", "cuda_oom_zero3_gather", "host_oom", "nccl_timeout", "nccl_error", "fp16_overflow",
         "config_error", "unknown")

# How causal a signature is. A rank's own resource failure or a rejected config causes a crash; an exception
# is probably the cause; NCCL timeouts / aborted communicators are usually the *effect* of another rank dying
# (reference tui-launch-monitor.md §5.3: "The rank that hangs is usually not the one that failed"); a SIGTERM
# is torchrun tearing down survivors (§5.5: "These are not the root cause").
CAUSE, EXCEPTION, CONSEQUENCE, TEARDOWN = 3, 2, 1, 0

# Lines kept as evidence per diagnosis (enough to show the proof, short enough for a terminal panel).
MAX_EVIDENCE_LINES = 8
# How far back from an OOM line the traceback is searched for ZeRO-3 gather frames (lines of the same rank).
TRACEBACK_LOOKBACK_LINES = 200
# Exit codes (negative = killed by that signal, as Popen and torchelastic report them).
SIGKILL_EXIT, SIGABRT_EXIT, SIGTERM_EXIT = -9, -6, -15

_SIZE = r"([\d.]+ ?(?:bytes|[KMGT]i?B|B))"
_UNITS = {"bytes": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}

# ---- signatures (reference/tui-launch-monitor.md §5; torch c10/cuda/CUDACachingAllocator.cpp, DeepSpeed 0.19.8,
# accelerate 1.15 and torch 2.13 elastic output reproduced on CPU in tests/fixtures/logs) --------------------------
# PyTorch ≥ 2.1: "Tried to allocate X. GPU N has a total capacity of T of which F is free." (2.1 spells "capacty";
# some builds print an empty GPU id; ROCm says "HIP out of memory").
RE_OOM_NEW = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _SIZE + r"\. GPU ?(\d*) has a total "
                        r"capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free")
# PyTorch 1.x / 2.0: "Tried to allocate X (GPU N; T total capacity; A already allocated; F free; R reserved ...)".
RE_OOM_OLD = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE +
                        r" total capacity(?:; " + _SIZE + r" already allocated)?(?:; " + _SIZE + r" free)?")
RE_OOM_BREAKDOWN = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:with .*? allocated "
                              r"in private pools .*?, )?and " + _SIZE + r" is reserved by PyTorch but unallocated")
RE_OOM_GENERIC = re.compile(r"CUDA out of memory|CUDA error: out of memory|torch\.(?:cuda\.)?OutOfMemoryError")
RE_HOST_ALLOC = re.compile(r"DefaultCPUAllocator: can't allocate memory(?:: you tried to allocate (\d+) bytes)?")
RE_KERNEL_OOM = re.compile(r"Out of memory: Killed process (\d+)|oom-kill:|oom_kill")
RE_ZERO3_FRAME = re.compile(r"partitioned_param_coordinator\.py|__all_gather_params|partition_parameters\.py|"
                            r"fetch_sub_module|all_gather_coalesced|_allgather_params")
RE_NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
                             r".*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")
RE_NCCL_HEARTBEAT = re.compile(r"Heartbeat monitor timed out!|watchdog got stuck for (\d+) seconds")
RE_NCCL_TEARDOWN = re.compile(r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are "
                              r"taking the entire process down")
RE_NCCL_ERROR = re.compile(r"NCCL error in: ([^,]+), (.+?)(?:, NCCL version ([\d.]+\w*))?$")
RE_NCCL_CLASS = re.compile(r"(nccl(?:UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote)Error)"
                           r"(?::\s*(.*))?")
RE_NCCL_REMOTE = re.compile(r"ncclRemoteError|remote process exited or there was a network error")
RE_PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer")     # gloo (CPU runs) when a peer process dies
RE_NCCL_ABORTED = re.compile(r"NCCL communicator was aborted on rank (\d+)")
RE_FP16_MIN = re.compile(r"Current loss scale already at minimum")
RE_FP16_OVERFLOW = re.compile(r"\[deepspeed\] OVERFLOW! (?:Rank (\d+) )?Skipping step")
RE_CONFIG = re.compile(
    r"Check batch related parameters\. train_batch_size is not equal.*"
    r"|When using `deepspeed_config_file`, the following accelerate config variables will be ignored.*"
    r"|had unknown keys \(\[.*"
    r"|validation errors? for DeepSpeed\w*Config.*"
    r"|Please correct the following DeepSpeed config values that mismatch.*"
    r"|Specified distributed type .* but only using 1 GPU.*")
RE_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt))(?::\s*(.*))?$")
RE_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
# torchelastic summary and agent lines (torch 2.13 output, tests/fixtures/logs/elastic_*.log).
RE_ELASTIC_ROOT = re.compile(r"Root Cause \(first observed failure\):")
RE_ELASTIC_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
RE_ELASTIC_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")
RE_ELASTIC_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
RE_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# Per-line rank attribution: torch's "[rank3]:" prefix, torchrun --tee's "[default3]:", "[Rank 3]" in c10d text.
RE_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
RE_RANK_INLINE = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
RE_LAUNCH_MARK = re.compile(r"^==> scaletrain launch .* <==$")   # engine/launcher.py RankLogs.start
RE_RANK_FILE = re.compile(r"(?:^|__)rank-(\d+)\.log$")      # the rundir contract: logs/rank-<i>.log
# Timestamps: glog ("E1122 00:20:47.170000" / "[E709 17:05:39.08]"), python logging ("2024-07-09 17:05:39,081"),
# torchelastic ("2026-11-22_00:20:47"), scaletrain's trainer (ISO "2024-07-09T17:05:39").
RE_TIME_GLOG = re.compile(r"\b[IWEF](\d{1,2})(\d{2}) (\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")
RE_TIME_ISO = re.compile(r"\b\d{4}-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2}(?:[.,]\d+)?)")


def parse_size(text: str) -> int:
    """'2.00 GiB' → bytes (torch's format_size units, plus SI units some tools print)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


@dataclass(frozen=True)
class LogLine:
    source: str           # file name
    number: int           # 1-based line number in its file
    text: str             # the line as written (trailing newline removed)
    body: str             # the line without a "[rankN]:" prefix
    rank: int | None      # from the prefix, else the file name
    time_key: float | None


@dataclass
class Event:
    """One matched signature."""

    kind: str
    strength: int
    line: LogLine
    rank: int | None
    gpu: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    evidence: list[LogLine] = field(default_factory=list)

    def order_key(self, file_order: dict[str, int]) -> tuple:
        # events known only from exit codes sort after any log line saying the same
        return (file_order.get(self.line.source, len(file_order)), self.line.number)


@dataclass(frozen=True)
class RemedyOut:
    """A remedy as the doctor reports it (planner remedies and known fixes share this shape)."""

    title: str
    changes: dict[str, Any]
    predicted_per_gpu_bytes: int | None
    predicted_step_seconds: float | None
    effective_batch: int | None
    keeps_effective_batch: bool | None = None
    fits: bool | None = None
    applicable: bool = True            # can `relaunch.apply_remedy` apply it (vs. a manual step)?
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "changes": dict(self.changes),
                "predicted_per_gpu_bytes": self.predicted_per_gpu_bytes,
                "predicted_step_seconds": self.predicted_step_seconds, "effective_batch": self.effective_batch}


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    rank: int | None
    gpu: int | None
    summary: str
    evidence: tuple[str, ...]
    remedies: tuple[RemedyOut, ...] = ()
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    secondary: tuple[str, ...] = ()    # what else was seen (SIGTERMed ranks, NCCL fallout), one line each

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "gpu": self.gpu, "summary": self.summary,
                "evidence": list(self.evidence), "remedies": [r.to_json() for r in self.remedies]}

    def failure_dict(self) -> dict[str, Any]:
        """The failure as the planner's remedy ranking takes it."""
        kind = "cuda_oom" if self.kind.startswith("cuda_oom") else self.kind   # a gather OOM is still an OOM
        return {**self.details, "kind": kind, "rank": self.rank, "gpu": self.gpu}


# ---- reading ---------------------------------------------------------------------------------------------------
def _time_key(text: str) -> float | None:
    m = RE_TIME_ISO.search(text) or RE_TIME_GLOG.search(text)
    if not m:
        return None
    mon, day, hh, mm, ss = m.groups()
    return ((int(mon) * 31 + int(day)) * 24 + int(hh)) * 3600 + int(mm) * 60 + float(ss.replace(",", "."))


def read_lines(path: Path) -> list[LogLine]:
    try:
        raw = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise ScaletrainError(f"log {path} does not exist; pass log files or a run directory") from None
    except IsADirectoryError:
        raise ScaletrainError(f"{path} is a directory; pass its log files, or a run directory with plan.json") from None
    m = RE_RANK_FILE.search(Path(path).name)
    file_rank = int(m.group(1)) if m else None
    out = []
    all_lines = raw.splitlines()
    # the launcher appends a marker per launch; a relaunched run's earlier failures are history, not this one
    start = max((i for i, t in enumerate(all_lines) if RE_LAUNCH_MARK.match(t)), default=-1) + 1
    for i, text in enumerate(all_lines[start:], start + 1):
        p = RE_RANK_PREFIX.match(text)
        body = text[p.end():] if p else text
        rank = int(p.group(1)) if p else file_rank
        out.append(LogLine(Path(path).name, i, text, body, rank, _time_key(body)))
    return out


# ---- matching --------------------------------------------------------------------------------------------------
def _scan(lines: list[LogLine]) -> list[Event]:
    events: list[Event] = []
    for i, ln in enumerate(lines):
        ev = (_match_oom(lines, i) or _match_host(ln) or _match_nccl(lines, i) or _match_fp16(ln)
              or _match_config(lines, i) or _match_elastic(lines, i) or _match_exception(lines, i))
        if ev is not None:
            events.append(ev)
    return events


def _same_rank_before(lines: list[LogLine], i: int, rank: int | None, limit: int) -> Iterable[LogLine]:
    j = i - 1
    seen = 0
    while j >= 0 and seen < limit:
        if lines[j].rank == rank:
            seen += 1
            yield lines[j]
        j -= 1


def _traceback_of(lines: list[LogLine], i: int) -> list[LogLine]:
    """The traceback lines (same rank) that lead to line i, oldest first."""
    tb: list[LogLine] = []
    for prev in _same_rank_before(lines, i, lines[i].rank, TRACEBACK_LOOKBACK_LINES):
        tb.append(prev)
        if RE_TRACEBACK.search(prev.body):
            return list(reversed(tb))
    return []


def _match_oom(lines: list[LogLine], i: int) -> Event | None:
    ln = lines[i]
    b = ln.body
    d: dict[str, Any] = {}
    gpu = None
    m = RE_OOM_NEW.search(b)
    if m:
        d["tried_to_allocate_bytes"] = parse_size(m.group(1))
        gpu = int(m.group(2)) if m.group(2) else None
        d["gpu_total_bytes"] = parse_size(m.group(3))
        d["gpu_free_bytes"] = parse_size(m.group(4))
        bm = RE_OOM_BREAKDOWN.search(b)
        if bm:
            d["allocated_bytes"] = parse_size(bm.group(1))
            d["reserved_unallocated_bytes"] = parse_size(bm.group(2))
    else:
        m = RE_OOM_OLD.search(b)
        if m:
            d["tried_to_allocate_bytes"] = parse_size(m.group(1))
            gpu = int(m.group(2))
            d["gpu_total_bytes"] = parse_size(m.group(3))
            if m.group(4):
                d["allocated_bytes"] = parse_size(m.group(4))
            if m.group(5):
                d["gpu_free_bytes"] = parse_size(m.group(5))
        elif RE_OOM_GENERIC.search(b):
            # A bare "CUDA error: out of memory" (cudaMalloc outside the allocator: NCCL buffers, cuBLAS workspace);
            # skip the class-name-only line that precedes a message already matched on the next line.
            if not re.search(r"out of memory", b, re.IGNORECASE):
                return None
        else:
            return None
    tb = _traceback_of(lines, i)
    zero3 = any(RE_ZERO3_FRAME.search(t.body) for t in tb)
    kind = "cuda_oom_zero3_gather" if zero3 else "cuda_oom"
    evidence = [ln]
    if zero3:
        evidence = [t for t in tb if RE_ZERO3_FRAME.search(t.body)][-2:] + evidence
    elif tb:
        frames = [t for t in tb if t.body.lstrip().startswith("File ")]
        evidence = frames[-1:] + evidence
    return Event(kind, CAUSE, ln, ln.rank, gpu, d, evidence)


def _match_host(ln: LogLine) -> Event | None:
    m = RE_HOST_ALLOC.search(ln.body)
    if m:
        d = {"tried_to_allocate_bytes": int(m.group(1))} if m.group(1) else {}
        return Event("host_oom", CAUSE, ln, ln.rank, None, d, [ln])
    if RE_KERNEL_OOM.search(ln.body):
        return Event("host_oom", CAUSE, ln, ln.rank, None, {"kernel_oom_kill": True}, [ln])
    return None


def _match_nccl(lines: list[LogLine], i: int) -> Event | None:
    ln = lines[i]
    b = ln.body
    m = RE_NCCL_TIMEOUT.search(b)
    if m:
        r = RE_RANK_INLINE.search(b)
        rank = int(r.group(1)) if r else ln.rank
        d = {"seq": int(m.group(1)), "op": m.group(2), "timeout_ms": int(m.group(3)), "ran_ms": int(m.group(4))}
        return Event("nccl_timeout", CONSEQUENCE, ln, rank, None, d, [ln])
    m = RE_NCCL_HEARTBEAT.search(b)
    if m:
        return Event("nccl_timeout", CONSEQUENCE, ln, ln.rank, None, {"heartbeat": True}, [ln])
    m = RE_NCCL_ERROR.search(b)
    if m:
        d: dict[str, Any] = {"where": m.group(1).strip(), "error": m.group(2).strip()}
        if m.group(3):
            d["nccl_version"] = m.group(3)
        evidence = [ln]
        # the class line ("ncclSystemError: ...") and "Last error:" detail follow on the next lines
        for nxt in lines[i + 1:i + 5]:
            if nxt.rank != ln.rank:
                continue
            c = RE_NCCL_CLASS.search(nxt.body)
            if c and "nccl_class" not in d:
                d["nccl_class"] = c.group(1)
                evidence.append(nxt)
            elif nxt.body.strip() and not nxt.body.startswith("Last error") and "nccl_class" in d:
                d["last_error"] = nxt.body.strip()
                evidence.append(nxt)
                break
        remote = d.get("nccl_class") == "ncclRemoteError" or bool(RE_NCCL_REMOTE.search(b))
        return Event("nccl_error", CONSEQUENCE if remote else CAUSE, ln, ln.rank, None, d, evidence)
    if RE_NCCL_REMOTE.search(b) or RE_NCCL_ABORTED.search(b) or RE_PEER_LOST.search(b):
        return Event("nccl_error", CONSEQUENCE, ln, ln.rank, None, {"remote": True, "peer_lost": True}, [ln])
    c = RE_NCCL_CLASS.search(b)
    if c and not any(RE_NCCL_ERROR.search(p.body) for p in lines[max(0, i - 3):i]):
        remote = c.group(1) == "ncclRemoteError"
        return Event("nccl_error", CONSEQUENCE if remote else CAUSE, ln, ln.rank, None, {"nccl_class": c.group(1)},
                     [ln])
    if RE_NCCL_TEARDOWN.search(b):
        return Event("nccl_timeout", TEARDOWN, ln, ln.rank, None, {"teardown": True}, [ln])
    return None


def _match_fp16(ln: LogLine) -> Event | None:
    if RE_FP16_MIN.search(ln.body):
        return Event("fp16_overflow", CAUSE, ln, ln.rank, None, {"fatal": True}, [ln])
    m = RE_FP16_OVERFLOW.search(ln.body)
    if m:
        return Event("fp16_overflow", TEARDOWN, ln, int(m.group(1)) if m.group(1) else ln.rank, None,
                     {"skipped_step": True}, [ln])
    return None


def _match_config(lines: list[LogLine], i: int) -> Event | None:
    ln = lines[i]
    if not RE_CONFIG.search(ln.body):
        return None
    msg = re.sub(r"^\s*(?:[\w.]+(?:Error|Exception)):\s*", "", ln.body).strip()
    evidence = [ln]
    if "validation error" in msg:
        # pydantic names the offending field and the reason on the next two lines of the same rank
        nxt = [x for x in lines[i + 1:i + 4] if x.rank == ln.rank][:2]
        evidence += nxt
        msg += ": " + " ".join(x.body.strip() for x in nxt)
    return Event("config_error", CAUSE, ln, ln.rank, None, {"message": msg}, evidence)


def _match_elastic(lines: list[LogLine], i: int) -> Event | None:
    """torchelastic's root-cause block and the agent's 'failed (exitcode: N) local_rank: R' line."""
    ln = lines[i]
    m = RE_AGENT_FAILED.search(ln.body)
    if m:
        code, local = int(m.group(1)), int(m.group(2))
        return _exit_event(ln, None, code, {"local_rank": local, "pid": int(m.group(3)), "agent": True}, [ln])
    if not RE_ELASTIC_ROOT.search(ln.body):
        return None
    rank = code = pid = None
    ev = [ln]
    for nxt in lines[i + 1:i + 10]:
        r = RE_ELASTIC_RANK.search(nxt.body)
        e = RE_ELASTIC_EXIT.search(nxt.body)
        s = RE_ELASTIC_SIGNAL.search(nxt.body)
        if r:
            rank = int(r.group(1))
            ev.append(nxt)
        elif e:
            code, pid = int(e.group(1)), int(e.group(2))
            ev.append(nxt)
        elif s:
            ev.append(nxt)
        if nxt.body.startswith("====="):
            break
    if code is None:
        return None
    return _exit_event(ln, rank, code, {"pid": pid, "root_cause_block": True}, ev)


def _exit_event(ln: LogLine, rank: int | None, code: int, d: dict[str, Any], ev: list[LogLine]) -> Event:
    d = {**d, "exit_code": code}
    if code == SIGKILL_EXIT:
        return Event("host_oom", CAUSE, ln, rank, None, d, ev)
    if code == SIGTERM_EXIT:
        return Event("unknown", TEARDOWN, ln, rank, None, d, ev)
    # SIGABRT is a C++ abort (a cause in itself); exit 1 is a Python exception whose traceback, when the logs
    # have it, is the better evidence
    return Event("unknown", EXCEPTION if code == SIGABRT_EXIT else CONSEQUENCE, ln, rank, None, d, ev)


def _match_exception(lines: list[LogLine], i: int) -> Event | None:
    """The last line of a Python traceback that no specific signature explained."""
    ln = lines[i]
    m = RE_EXCEPTION.match(ln.body.strip())
    if not m:
        return None
    tb = _traceback_of(lines, i)
    if not tb:
        return None
    name = m.group(1)
    if name in ("ChildFailedError", "CalledProcessError", "KeyboardInterrupt"):
        return None  # the launcher reporting a child's death, or a user's ^C: not a cause by itself
    if name in ("DistBackendError", "DistNetworkError") or "NCCL" in (m.group(2) or "") \
            or RE_PEER_LOST.search(m.group(2) or ""):
        return Event("nccl_error", CONSEQUENCE, ln, ln.rank, None, {"exception": name}, [ln])
    return Event("unknown", EXCEPTION, ln, ln.rank, None, {"exception": name, "message": (m.group(2) or "")[:300]},
                 tb[-2:-1] + [ln])


# ---- choosing the first failure -------------------------------------------------------------------------------
def _pick(events: list[Event], file_order: dict[str, int], hint_rank: int | None) -> Event | None:
    if not events:
        return None
    top = max(e.strength for e in events)
    best = [e for e in events if e.strength == top]
    timed = [e for e in best if e.line.time_key is not None]
    if len(timed) == len(best) and len({e.rank for e in best}) > 1:
        first = min(e.line.time_key for e in timed)
        best = [e for e in best if e.line.time_key == first] or best
    elif hint_rank is not None and any(e.rank == hint_rank for e in best):
        best = [e for e in best if e.rank == hint_rank]
    return min(best, key=lambda e: e.order_key(file_order))


def _hint_rank(events: list[Event], exit_codes: dict[int, int], first_failing: int | None) -> int | None:
    if first_failing is not None:
        return first_failing
    for e in events:
        if e.details.get("root_cause_block") and e.rank is not None:
            return e.rank
    real = sorted(r for r, c in exit_codes.items() if c not in (0, SIGTERM_EXIT))
    return real[0] if real else None


def _merge_details(chosen: Event, events: list[Event]) -> None:
    """Fill rank/gpu from other events about the same failure (elastic summary names the rank; OOM the GPU)."""
    if chosen.rank is None:
        for e in events:
            if e.details.get("root_cause_block") and e.rank is not None:
                chosen.rank = e.rank
                chosen.details.setdefault("exit_code", e.details.get("exit_code"))
                chosen.evidence.extend(x for x in e.evidence if x not in chosen.evidence)
                break
    if chosen.rank is None and chosen.details.get("local_rank") is not None:
        chosen.rank = chosen.details["local_rank"]
    for e in events:        # the same failure seen elsewhere (rank log, launcher summary, exit code): more proof
        if e is not chosen and e.kind == chosen.kind and e.rank == chosen.rank and e.strength == chosen.strength:
            chosen.evidence.extend(x for x in e.evidence if x not in chosen.evidence)


def _silent_rank(chosen: Event, events: list[Event], by_rank: dict[int, list[LogLine]]) -> Event | None:
    """Every other rank lost a peer and one rank's log just stops: that rank died first, without a word
    (a SIGKILL leaves no traceback). Only used when no exit codes are known."""
    noisy = {e.rank for e in events if e.strength >= CONSEQUENCE}
    silent = [r for r in by_rank if r not in noisy]
    if len(silent) != 1 or len(by_rank) < 2:
        return None
    r = silent[0]
    last = by_rank[r][-1]
    return Event("unknown", chosen.strength, last, r, None, {"silent": True, "peers_saw": chosen.kind}, [last])


def _events_from_exit_codes(exit_codes: dict[int, int], lines_by_rank: dict[int, list[LogLine]]) -> list[Event]:
    """A rank SIGKILLed with no traceback in its own log: the host OOM killer (§5.5)."""
    out = []
    for rank, code in sorted(exit_codes.items()):
        if code != SIGKILL_EXIT:
            continue
        own = lines_by_rank.get(rank, [])
        if any(RE_TRACEBACK.search(x.body) for x in own):
            continue
        anchor = own[-1] if own else LogLine("exit codes", 0, f"rank {rank} exit code {code} (SIGKILL)",
                                             f"rank {rank} exit code {code} (SIGKILL)", rank, None)
        ev = [anchor]
        if own:
            ev.append(LogLine("exit codes", 0, f"rank {rank} exit code {code} (SIGKILL), no traceback",
                              f"rank {rank} exit code {code} (SIGKILL), no traceback", rank, None))
        out.append(Event("host_oom", CAUSE, anchor, rank, None, {"exit_code": code, "from_exit_code": True}, ev))
    return out


# ---- entry point -----------------------------------------------------------------------------------------------
def diagnose(logs: list[Path], plan_json: dict[str, Any] | None = None, exit_codes: dict | None = None, *,
             first_failing_rank: int | None = None, with_remedies: bool = True) -> Diagnosis:
    """Classify a failed run from its logs (and, when known, per-rank exit codes and the plan)."""
    if not logs and not exit_codes:
        raise ScaletrainError("diagnose needs at least one log file (or a run directory)")
    codes = {int(k): int(v) for k, v in (exit_codes or {}).items() if v is not None}
    all_lines: list[LogLine] = []
    events: list[Event] = []
    file_order: dict[str, int] = {}
    for n, p in enumerate(logs):
        lines = read_lines(Path(p))
        file_order.setdefault(Path(p).name, n)
        all_lines.extend(lines)
        events.extend(_scan(lines))
    by_rank: dict[int, list[LogLine]] = {}
    for ln in all_lines:
        if ln.rank is not None:
            by_rank.setdefault(ln.rank, []).append(ln)
    events.extend(_events_from_exit_codes(codes, by_rank))
    hint = _hint_rank(events, codes, first_failing_rank)
    chosen = _pick(events, file_order, hint)
    if chosen is None:
        return _unknown(all_lines, codes, hint, plan_json, with_remedies)
    _merge_details(chosen, events)
    if chosen.strength <= CONSEQUENCE and not codes:
        chosen = _silent_rank(chosen, events, by_rank) or chosen
    if chosen.kind == "unknown" and chosen.details.get("exit_code") == SIGABRT_EXIT:
        # a C++ abort: the NCCL watchdog teardown is the usual reason (§5.5)
        nccl = [e for e in events if e.kind == "nccl_timeout" and (e.rank == chosen.rank or chosen.rank is None)]
        if nccl:
            chosen = Event("nccl_timeout", CAUSE, nccl[0].line, chosen.rank, None,
                           {**nccl[0].details, **chosen.details}, nccl[0].evidence + chosen.evidence)
    gpu = chosen.gpu
    if gpu is None and chosen.kind.startswith("cuda_oom") and chosen.rank is not None:
        gpu = _local_rank(chosen.rank, plan_json)
    if chosen.kind.startswith("cuda_oom") and "gpu_total_bytes" not in chosen.details and plan_json:
        cap = ((plan_json.get("hardware") or {}).get("gpu_memory_bytes"))
        if cap:
            chosen.details["gpu_total_bytes"] = int(cap)
    secondary = _secondary_lines(events, chosen)
    evidence = tuple(_dedupe(x.text for x in chosen.evidence))[:MAX_EVIDENCE_LINES]
    diag = Diagnosis(kind=chosen.kind, rank=chosen.rank, gpu=gpu, summary="", evidence=evidence,
                     details=dict(chosen.details), secondary=secondary)
    diag = _with_summary(diag, plan_json)
    if with_remedies:
        diag = _replace(diag, remedies=tuple(remedies_for(diag, plan_json)))
    return diag


def _replace(d: Diagnosis, **changes: Any) -> Diagnosis:
    from dataclasses import replace
    return replace(d, **changes)


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _local_rank(rank: int, plan_json: dict[str, Any] | None) -> int:
    """accelerate/torchrun give local rank r the device cuda:r, so the GPU index is rank mod GPUs per node."""
    per_node = ((plan_json or {}).get("hardware") or {}).get("gpus_per_node")
    return rank % int(per_node) if per_node else rank


def _secondary_lines(events: list[Event], chosen: Event) -> tuple[str, ...]:
    out = []
    for e in events:
        if e is chosen or e.rank == chosen.rank or e.details.get("local_rank") == chosen.rank:
            continue          # the chosen rank's own exit and summary are the same failure, not another one
        who = f"rank {e.rank}" if e.rank is not None else e.line.source
        if e.details.get("peer_lost") or (e.kind == "nccl_error" and e.strength == CONSEQUENCE):
            what = "lost a peer"
        elif e.kind != "unknown":
            what = e.kind
        else:
            what = f"exit {e.details['exit_code']}" if "exit_code" in e.details else e.details.get("exception", "error")
        out.append(f"{who}: {what} (after the first failure; not the cause)")
    return tuple(_dedupe(out))[:MAX_EVIDENCE_LINES]


def _unknown(lines: list[LogLine], codes: dict[int, int], hint: int | None, plan_json: dict[str, Any] | None,
             with_remedies: bool) -> Diagnosis:
    failed = {r: c for r, c in codes.items() if c not in (0, SIGTERM_EXIT)}
    if not failed and not any(c for c in codes.values()):
        summary = "no failure signature found in the logs" + (" and every rank exited 0" if codes else "")
    else:
        who = ", ".join(f"rank {r} exit {c}" for r, c in sorted(failed.items())) or "the run"
        summary = f"{who}: no known failure signature in the logs; read the log tail below"
    tail = [ln.text for ln in lines if ln.body.strip()][-3:]
    return Diagnosis("unknown", hint, None, summary, tuple(tail), ())


def _with_summary(d: Diagnosis, plan_json: dict[str, Any] | None) -> Diagnosis:
    x = d.details
    who = f"rank {d.rank}" if d.rank is not None else "a rank"
    mem = (plan_json or {}).get("memory") or {}
    predicted = (mem.get("per_gpu_bytes") or {}).get("total")
    if d.kind in ("cuda_oom", "cuda_oom_zero3_gather"):
        where = f"GPU {d.gpu}" if d.gpu is not None else "its GPU"
        s = f"{who} ran out of memory on {where}"
        if d.kind == "cuda_oom_zero3_gather":
            s += " while DeepSpeed ZeRO-3 gathered parameters"
        parts = []
        if "tried_to_allocate_bytes" in x:
            parts.append(f"tried to allocate {fmt_bytes(x['tried_to_allocate_bytes'])}")
        if "gpu_free_bytes" in x:
            parts.append(f"{fmt_bytes(x['gpu_free_bytes'])} free")
        if "gpu_total_bytes" in x:
            parts.append(f"of {fmt_bytes(x['gpu_total_bytes'])}")
        if predicted:
            parts.append(f"plan predicted a {fmt_bytes(predicted)} peak")
        if x.get("reserved_unallocated_bytes") and x.get("allocated_bytes"):
            frag = x["reserved_unallocated_bytes"] / max(1, x["allocated_bytes"] + x["reserved_unallocated_bytes"])
            if frag >= FRAGMENTATION_HINT_FRACTION:
                parts.append(f"{frag:.0%} of reserved memory unallocated (fragmentation)")
        s += (": " + ", ".join(parts)) if parts else ""
    elif d.kind == "host_oom":
        if x.get("from_exit_code") or x.get("exit_code") == SIGKILL_EXIT:
            s = (f"{who} was killed with SIGKILL and printed no traceback: almost always the host (kernel or cgroup) "
                 "OOM killer; a scheduler time limit does the same")
        else:
            s = f"{who} ran out of host memory"
            if x.get("tried_to_allocate_bytes"):
                s += f" (tried to allocate {fmt_bytes(x['tried_to_allocate_bytes'])})"
        host = mem.get("host_bytes_per_gpu")
        if host:
            s += f"; plan keeps {fmt_bytes(host)} of offloaded state in host RAM per GPU"
    elif d.kind == "nccl_timeout":
        if "op" in x:
            s = (f"{who}: NCCL {x['op']} (seq {x['seq']}) timed out after {x['ran_ms'] / 1000:.0f} s "
                 f"(limit {x['timeout_ms'] / 1000:.0f} s); a peer stopped taking part")
        else:
            s = f"{who}: the NCCL watchdog took the process down (collective hang)"
    elif d.kind == "nccl_error":
        s = f"{who}: NCCL error"
        if x.get("error"):
            s += f" ({x['error']})"
        if x.get("nccl_class"):
            s += f", {x['nccl_class']}"
        if x.get("last_error"):
            s += f": {x['last_error']}"
    elif d.kind == "fp16_overflow":
        s = f"{who}: fp16 loss scale hit its minimum (gradients overflow at every scale); the run stopped"
    elif d.kind == "config_error":
        s = f"{who if d.rank is not None else 'launch'}: configuration rejected: {x.get('message', '')}"
    else:
        if x.get("silent"):
            s = (f"{who} stopped logging with no error while the other ranks reported {x['peers_saw']}: it died "
                 "first, without a traceback (a SIGKILL, e.g. the host OOM killer, looks like this); its exit code "
                 "is in status.json")
        elif "exception" in x:
            s = f"{who} failed with {x['exception']}: {x.get('message', '')}".rstrip(": ")
        elif "exit_code" in x:
            s = f"{who} exited with {x['exit_code']}" + (" (SIGABRT: a C++ abort)" if x["exit_code"] == -6 else "")
        else:
            s = f"{who} failed"
    return _replace(d, summary=s)


# Share of the reserved pool that is reserved-but-unallocated above which the summary names fragmentation
# (PyTorch's own hint: "If reserved but unallocated memory is large try ... expandable_segments").
FRAGMENTATION_HINT_FRACTION = 0.25


# ---- run directories -------------------------------------------------------------------------------------------
def run_dir_inputs(run_dir: Path) -> tuple[list[Path], dict[str, Any] | None, dict[int, int], int | None]:
    """Logs, plan, exit codes and first failing rank of a run directory (the rundir contract)."""
    from scaletrain.engine.run.layout import RunDir

    rd = RunDir(run_dir)
    logs = sorted(rd.logs.glob("*.log"), key=_log_sort_key) if rd.logs.is_dir() else []
    plan = None
    if rd.plan.exists():
        plan = rd.read_plan()
    codes: dict[int, int] = {}
    first = None
    for path in rd.node_statuses():        # status.json, plus status-node-<R>.json from the other nodes
        node_codes, node_first = read_status(path)
        codes.update(node_codes)
        first = first if first is not None else node_first
    return logs, plan, codes, first


def _log_sort_key(p: Path) -> tuple:
    m = RE_RANK_FILE.search(p.name)
    return (0, int(m.group(1)), p.name) if m else (1, 0, p.name)


def read_status(path: Path) -> tuple[dict[int, int], int | None]:
    """Per-rank exit codes and the first failing rank from the launcher's status.json (absent → nothing known)."""
    try:
        st = json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}, None
    return status_codes(st)


def status_codes(st: dict[str, Any]) -> tuple[dict[int, int], int | None]:
    """Per-rank exit codes and the first failing rank from a parsed status.json."""
    codes: dict[int, int] = {}
    raw = st.get("exit_codes") or st.get("rank_exit_codes") or {}
    if isinstance(raw, dict):
        codes = {int(k): int(v) for k, v in raw.items() if v is not None}
    elif isinstance(raw, list):
        codes = {i: int(v) for i, v in enumerate(raw) if v is not None}
    for r in st.get("ranks") or []:
        if isinstance(r, dict) and r.get("rank") is not None and r.get("exit_code") is not None:
            codes[int(r["rank"])] = int(r["exit_code"])
    first = st.get("first_failing_rank")
    return codes, int(first) if first is not None else None


def diagnose_paths(paths: list[Path], plan_json: dict[str, Any] | None = None,
                   exit_codes: dict[int, int] | None = None, **kw: Any) -> Diagnosis:
    """`scaletrain diagnose` inputs: log files and/or run directories (a run dir brings its plan and status).
    Explicit `exit_codes` win over status.json's."""
    logs: list[Path] = []
    codes: dict[int, int] = {}
    first = None
    plan = plan_json
    for p in paths:
        p = Path(p)
        if p.is_dir():
            if not (p / "plan.json").exists() and not (p / "logs").is_dir():
                raise ScaletrainError(f"{p} is a directory but not a run directory (no plan.json or logs/)")
            l2, pj, c2, f2 = run_dir_inputs(p)
            logs += l2
            codes.update(c2)
            first = first if first is not None else f2
            plan = plan if plan is not None else pj
        else:
            logs.append(p)
    codes.update(exit_codes or {})
    return diagnose(logs, plan, codes, first_failing_rank=first, **kw)


# ---- the plan a run was made from --------------------------------------------------------------------------------
def plan_from_json(plan_json: dict[str, Any]) -> tuple[Any, Any]:
    """Rebuild (PlanRequest, Plan) from a plan.json, pinned to the choices it made and the hardware it had.

    Pinning matters: a request with free fields would be re-solved by the planner and could come back different,
    and `--gpus auto` would re-detect this machine instead of the one the run died on.
    """
    from dataclasses import replace

    from scaletrain.engine.catalog.hardware import Hardware, find_gpu
    from scaletrain.engine.plan.request import PlanRequest
    from scaletrain.engine.plan.planner import make_plan

    try:
        hw_j = plan_json["hardware"]
        tr = plan_json["training"]
        batch = plan_json["batch"]
        req_j = dict(plan_json.get("request") or {})
        model = req_j.get("model") or plan_json["model"]["name"]
    except (KeyError, TypeError):
        raise ScaletrainError("the plan JSON lacks hardware/training/batch/model; pass a plan.json written by "
                              "scaletrain (run directory) or `scaletrain plan --json`") from None
    known = PlanRequest.field_names()
    fields_: dict[str, Any] = {k: v for k, v in req_j.items() if k in known}
    fields_["residents"] = tuple((r["model"], int(r["bits"])) if isinstance(r, dict) else (r[0], int(r[1]))
                                 for r in (fields_.get("residents") or tr.get("residents") or ()))
    fields_.update(
        model=model, gpus=f"{hw_j['nodes']}x{hw_j['gpus_per_node']}x{hw_j['gpu']}", nodes=hw_j["nodes"],
        method=tr["method"], strategy=tr["strategy"], offload=tr["offload"], precision=tr["precision"],
        optimizer=tr["optimizer"], attn=tr["attn"], grad_ckpt=bool(tr["grad_ckpt"]), seq_len=int(tr["seq_len"]),
        micro_batch=int(batch["micro_batch"]), grad_accum=int(batch["grad_accum"]), effective_batch=None,
        device=tr.get("device"))
    if tr.get("lora_rank"):
        fields_["lora_rank"] = int(tr["lora_rank"])
    targets = tr.get("lora_targets") or fields_.get("lora_targets")
    fields_["lora_targets"] = tuple(targets) if targets else None
    if tr.get("base_bits") is not None and tr["method"] != "full":
        fields_["base_bits"] = int(tr["base_bits"])
    mem = plan_json.get("memory") or {}
    if mem.get("headroom_fraction") is not None:
        fields_["headroom"] = float(mem["headroom_fraction"])
    req = PlanRequest(**fields_)
    spec = find_gpu(hw_j["gpu"])
    if hw_j.get("gpu_memory_bytes"):
        spec = replace(spec, memory_bytes=int(hw_j["gpu_memory_bytes"]))
    hw = Hardware(gpu=spec, gpus_per_node=int(hw_j["gpus_per_node"]), nodes=int(hw_j["nodes"]),
                  source=hw_j.get("source") or "catalog")
    if hw_j.get("inter_node_gbps"):
        hw = replace(hw, inter_node_gbit_s=float(hw_j["inter_node_gbps"]))
    return req, make_plan(req, hardware=hw)


# ---- remedies --------------------------------------------------------------------------------------------------
# PyTorch's own advice for a fragmented pool (its OOM message); torch 2.13 reads this spelling too.
EXPANDABLE_SEGMENTS_ENV = {"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
# NCCL verbose log and flight-recorder dump: what finds the rank a timed-out collective was waiting for.
NCCL_DEBUG_ENV = {"env.NCCL_DEBUG": "INFO", "env.TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                  "env.TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
# Longer collective timeout for slow-but-alive steps (checkpoint saves, first-step compilation); DeepSpeed reads
# DEEPSPEED_TIMEOUT in minutes (deepspeed/constants.py default_pg_timeout, default 10 in 0.19.8).
NCCL_TIMEOUT_MINUTES = 30


def remedies_for(diag: Diagnosis, plan_json: dict[str, Any] | None) -> list[RemedyOut]:
    """Ranked remedies: the planner's for OOMs, known fixes (with the plan's numbers) for the rest."""
    req = plan = None
    if plan_json:
        try:
            req, plan = plan_from_json(plan_json)
        except ScaletrainError:
            req = plan = None
    k = diag.kind
    if k in ("cuda_oom", "cuda_oom_zero3_gather"):
        out = _planner_remedies(plan, diag) if plan is not None else []
        if k == "cuda_oom_zero3_gather":
            out.append(_known("lower ZeRO-3 gather buffers (stage3_prefetch_bucket_size, stage3_max_live_parameters)",
                              {}, plan, applicable=False,
                              why="DeepSpeed's advice for an OOM inside the parameter all-gather; edit ds_config.json"))
        frag = diag.details.get("reserved_unallocated_bytes", 0)
        if frag and frag / max(1, frag + diag.details.get("allocated_bytes", 0)) >= FRAGMENTATION_HINT_FRACTION:
            out.append(_known("reduce allocator fragmentation (expandable segments)", dict(EXPANDABLE_SEGMENTS_ENV),
                              plan, why="PyTorch's advice when reserved-but-unallocated memory is large"))
        return out
    if k == "host_oom":
        return _host_oom_remedies(req, plan)
    if k == "nccl_timeout":
        out = [_known(f"raise the collective timeout to {NCCL_TIMEOUT_MINUTES} min",
                      {"env.DEEPSPEED_TIMEOUT": str(NCCL_TIMEOUT_MINUTES)}, plan,
                      why="for slow but healthy steps (checkpoint saves, first-step compilation)"),
               _known("find the stalled rank (NCCL debug log + flight recorder dump)", dict(NCCL_DEBUG_ENV), plan,
                      why="the rank that timed out is usually waiting on another rank")]
        if plan is not None and plan.setup.hardware.gpu.interconnect.lower().startswith("pcie"):
            out.append(_known("disable NCCL peer-to-peer on PCIe cards", {"env.NCCL_P2P_DISABLE": "1"}, plan,
                              why="P2P over PCIe without NVLink hangs on some consumer boards"))
        return out
    if k == "nccl_error":
        out = []
        last = str(diag.details.get("last_error", "")) + str(diag.details.get("error", ""))
        if "shm" in last or "shared memory" in last:
            out.append(_known("enlarge /dev/shm (docker --ipc=host or --shm-size=16g)", {}, plan, applicable=False,
                              why="NCCL could not attach its shared-memory segment"))
        out.append(_known("rerun with NCCL debug logging", dict(NCCL_DEBUG_ENV), plan,
                          why="NCCL names the failing call and transport in its INFO log"))
        if plan is not None and plan.setup.hardware.nodes > 1:
            out.append(_known("test without InfiniBand (NCCL_IB_DISABLE=1; then set NCCL_SOCKET_IFNAME)",
                              {"env.NCCL_IB_DISABLE": "1"}, plan, why="multi-node: wrong interface or broken IB"))
        out.append(_known("disable NCCL peer-to-peer", {"env.NCCL_P2P_DISABLE": "1"}, plan,
                          why="rules out a P2P/IOMMU problem on this board"))
        return out
    if k == "fp16_overflow":
        return _fp16_remedies(req, plan, plan_json)
    if k == "config_error":
        return [_known("rewrite the run's configs from the plan (scaletrain writers)", {}, plan,
                       why="a hand-edited or stale accelerate/DeepSpeed config was rejected")]
    return []


def _known(title: str, changes: dict[str, Any], plan: Any, *, applicable: bool = True, why: str = "",
           base: Any = None) -> RemedyOut:
    """A known fix, carrying the numbers of the plan it leads to (the current plan when only env/files change)."""
    if plan is None:
        return RemedyOut(title, changes, None, None, None, None, None, applicable, why)
    t = getattr(plan, "time", None)
    keeps = plan.setup.effective_batch == base.setup.effective_batch if base is not None else True
    return RemedyOut(title, changes, plan.memory.total_bytes, getattr(t, "step_seconds", None),
                     plan.setup.effective_batch, keeps, plan.fits, applicable, why)


def _planner_remedies(plan: Any, diag: Diagnosis | None) -> list[RemedyOut]:
    from scaletrain.engine.plan.remedies import rank_remedies

    return [RemedyOut(title=r.title, changes=dict(r.changes), predicted_per_gpu_bytes=r.predicted_per_gpu_bytes,
                      predicted_step_seconds=r.predicted_step_seconds, effective_batch=r.effective_batch,
                      keeps_effective_batch=r.keeps_effective_batch, fits=r.fits,
                      applicable=not ({"gpus", "nodes"} & set(r.changes)), why=r.detail)
            for r in rank_remedies(plan, diag.failure_dict() if diag is not None else None)]


def _try_plan(req: Any, plan: Any, **changes: Any) -> Any:
    from scaletrain.engine.plan.planner import make_plan

    try:
        return make_plan(req.with_(**changes), hardware=plan.setup.hardware)
    except ScaletrainError:
        return None


def _host_oom_remedies(req: Any, plan: Any) -> list[RemedyOut]:
    if plan is None:
        return [_known("give the job more host RAM", {}, None, applicable=False, why="SLURM: --mem")]
    s = plan.setup
    out: list[RemedyOut] = []
    if s.device == "cpu":
        # on a CPU run host memory is the device memory: the planner's memory remedies are the fixes
        out += _planner_remedies(plan, None)
    for off in [o for o in reversed(Offload) if o.rank < s.offload.rank]:      # offload less, most first
        p = _try_plan(req, plan, offload=off)
        if p is not None:
            host = p.memory.host_bytes_per_gpu * s.hardware.gpus_per_node
            out.append(_known(f"offload {'only the optimizer' if off == 'optimizer' else 'nothing'} "
                              f"({fmt_bytes(host)} host RAM per node)", {"offload": off}, p, base=plan,
                              why="offloaded states live in pinned host RAM"))
    need = plan.memory.host_bytes_per_gpu * s.hardware.gpus_per_node
    out.append(_known("give the job more host RAM" + (f" (offloaded states alone: {fmt_bytes(need)} per node)"
                                                      if need else ""), {}, plan, applicable=False,
                      why="SLURM: --mem; containers: raise the memory limit"))
    if s.offload != "none":
        out.append(_known("stop pinning offloaded memory (pin_memory: false in ds_config.json)", {}, plan,
                          applicable=False, why="pinned pages cannot be swapped out"))
    return out


def _fp16_remedies(req: Any, plan: Any, plan_json: dict[str, Any] | None) -> list[RemedyOut]:
    if plan is None:
        return [_known("train in bf16 (no loss scaling)", {"precision": "bf16"}, None)]
    out: list[RemedyOut] = []
    if plan.setup.hardware.gpu.supports_bf16 and plan.setup.precision != "bf16":
        p = _try_plan(req, plan, precision="bf16")
        if p is not None:
            out.append(_known("train in bf16 (no loss scaling needed)", {"precision": "bf16"}, p, base=plan,
                              why="bf16 has fp32's exponent range"))
    lr = ((plan_json or {}).get("train") or {}).get("lr")
    if lr:
        out.append(_known(f"halve the learning rate ({lr:g} → {lr / 2:g})", {"train.lr": lr / 2}, plan, base=plan,
                          why="a diverging run overflows at every loss scale"))
    p = _try_plan(req, plan, precision="fp32")
    if p is not None:
        out.append(_known("train in fp32", {"precision": "fp32"}, p, base=plan, why="no overflow, more memory"))
    return out

"""The failure signatures the doctor knows, each with its source, and how causal each one is.

Why causality: when one rank dies, torchrun SIGTERMs the others and the survivors print NCCL timeouts and
aborted-communicator errors that look just as alarming. Every matched line becomes an Event with a strength
(an OOM beats the NCCL timeout it caused; a SIGTERM never causes anything); diagnosis.py picks the first failure.
No torch import: this is text processing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from scaletrain.engine.doctor.logs import LogLine
from scaletrain.engine.launch.elastic import ROOT_CAUSE_WINDOW, agent_failure, root_cause

KINDS = ("cuda_oom", "cuda_oom_zero3_gather", "host_oom", "nccl_timeout", "nccl_error", "fp16_overflow",
         "config_error", "disk_full", "export_failed", "interrupted", "killed", "restarted", "finished", "unknown")

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
# An OOM raised inside the causal-LM loss: transformers' loss_utils.py (ForCausalLMLoss → fixed_cross_entropy →
# F.cross_entropy / log_softmax over the B·S·V logits) or the logits' own upcast in the model's forward
RE_LOSS_FRAME = re.compile(r"loss_utils\.py|ForCausalLMLoss|fixed_cross_entropy|in cross_entropy|log_softmax|"
                           r"logits\.float\(\)|lm_head\(")
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
# transformers refusing an attention implementation at model build (modeling_utils._check_and_adjust_attn_impl),
# e.g. gpt_oss with sdpa (its attention sinks need the scores; seen on this project's CPU runs, transformers 5.24):
# "GptOssForCausalLM does not support an attention implementation through torch.nn.functional.scaled_dot_product_
# attention yet." — the remedy is another --attn.
RE_ATTN_UNSUPPORTED = re.compile(r"\b(\w+) does not support an attention implementation through "
                                 r"(torch\.nn\.functional\.scaled_dot_product_attention|Flash Attention|"
                                 r"torch's flex_attention)")
_ATTN_NAMES = {"torch.nn.functional.scaled_dot_product_attention": "sdpa", "Flash Attention": "flash",
               "torch's flex_attention": "flex"}
# A full disk: errno 28 (ENOSPC) as Python ("OSError: [Errno 28] No space left on device: 'path'"), Rust (safetensors:
# "I/O error: No space left on device (os error 28)", StorageFull) and C libraries (strerror) word it; a quota
# (errno 122); torch.save's stream writer.
# trainer/export.py export_at_end: the run trained, its end-of-run export did not (the checkpoint is intact)
RE_EXPORT_FAILED = re.compile(r"scaletrain: warning: the export of step (\d+) failed \((.*)\)")
RE_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|\bos error 28\b|\berrno:? ?28\b|\bENOSPC\b|StorageFull"
                          r"|Disk quota exceeded|\[Errno 122\]|PytorchStreamWriter failed writing file .*file write failed",
                          re.IGNORECASE)
RE_DISK_PATH = re.compile(r"No space left on device: '([^']+)'")
# Frames of a save (the bundled trainer's checkpoints, accelerate's save_state, transformers/torch/safetensors).
RE_SAVE_FRAME = re.compile(r"save_checkpoint|save_state|save_pretrained|save_file|torch/serialization\.py")
# The bundled trainer's and the CLI's own refusals: one line, "scaletrain: error: <what was wrong and what to do>"
# (trainer/train.py, tui/cli/main.py). A terminal may wrap it (rich's headless output at 80 columns).
RE_TRAINER_ERROR = re.compile(r"^scaletrain: error: (.+)$")
WRAP_MIN_CHARS = 60                  # a line this long or longer may continue on the next one (a wrapped terminal)
WRAP_MAX_LINES = 4
# Stopped from outside: the bundled trainer's Ctrl-C line, torchrun's agent receiving SIGINT/SIGTERM/SIGHUP.
RE_INTERRUPTED = re.compile(r"scaletrain: interrupted at step \d+|SignalException: Process \d+ got signal: \d+"
                            r"|Received (?:SIGINT|SIGTERM|SIGHUP|\d+) death signal, shutting down workers")
RE_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt))(?::\s*(.*))?$")
RE_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")
# torchelastic's root-cause block and agent line: engine.launch.elastic (the launcher reads them too). Per-line rank
# attribution: the "[rank3]:"/"[default3]:" prefix (elastic.split_prefix, in logs.read_lines), "[Rank 3]" in c10d text.
RE_RANK_INLINE = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")


def parse_size(text: str) -> int:
    """'2.00 GiB' → bytes (torch's format_size units, plus SI units some tools print)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


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


def scan(lines: list[LogLine]) -> list[Event]:
    """Every signature the lines match, in order (one event per line at most)."""
    events: list[Event] = []
    for i, ln in enumerate(lines):
        ev = (_match_export(ln) or _match_oom(lines, i) or _match_host(ln) or _match_disk(lines, i)
              or _match_nccl(lines, i)
              or _match_fp16(ln) or _match_config(lines, i) or _match_trainer_error(lines, i)
              or _match_interrupted(ln)
              or _match_elastic(lines, i) or _match_exception(lines, i))
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


def traceback_of(lines: list[LogLine], i: int) -> list[LogLine]:
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
    tb = traceback_of(lines, i)
    zero3 = any(RE_ZERO3_FRAME.search(t.body) for t in tb)
    if any(RE_LOSS_FRAME.search(t.body) for t in tb):
        d["in_loss"] = True          # the logits' cross-entropy ran out: --loss chunked is the first remedy
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
    a = RE_ATTN_UNSUPPORTED.search(ln.body)
    if a:
        attn = _ATTN_NAMES[a.group(2)]
        return Event("config_error", CAUSE, ln, ln.rank, None,
                     {"message": f"{a.group(1)} has no {attn} attention in transformers", "attn_unsupported": attn,
                      "model_class": a.group(1)}, [ln])
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


def _match_disk(lines: list[LogLine], i: int) -> Event | None:
    """A write that found the disk full (errno 28), with the frame that wrote and whether it was a save."""
    ln = lines[i]
    if not RE_DISK_FULL.search(ln.body):
        return None
    tb = traceback_of(lines, i)
    d: dict[str, Any] = {"message": ln.body.strip()[:300],
                         "while_saving": any(RE_SAVE_FRAME.search(t.body) for t in tb)}
    m = RE_DISK_PATH.search(ln.body)
    if m:
        d["path"] = m.group(1)
    frames = [t for t in tb if t.body.lstrip().startswith("File ")]
    return Event("disk_full", CAUSE, ln, ln.rank, None, d, frames[-1:] + [ln])


def _match_export(ln: LogLine) -> Event | None:
    m = RE_EXPORT_FAILED.search(ln.body)
    if not m:
        return None
    return Event("export_failed", EXCEPTION, ln, ln.rank, None, {"step": int(m.group(1)), "reason": m.group(2)[:300]},
                 [ln])


def _match_trainer_error(lines: list[LogLine], i: int) -> Event | None:
    """`scaletrain: error: …`: the trainer refused the run in one line; the line (and its wrapped continuation) is
    the evidence and the message."""
    ln = lines[i]
    m = RE_TRAINER_ERROR.match(ln.body.strip())
    if not m:
        return None
    evidence = [ln]
    prev = ln
    for nxt in lines[i + 1:i + 1 + WRAP_MAX_LINES]:
        body = nxt.body.strip()
        if (nxt.rank != ln.rank or len(prev.body.rstrip()) < WRAP_MIN_CHARS or not body
                or RE_TRACEBACK.search(body) or body.startswith(("scaletrain:", "File ", "[", "==>"))):
            break
        evidence.append(nxt)
        prev = nxt
    message = " ".join([m.group(1).strip()] + [x.body.strip() for x in evidence[1:]])
    return Event("config_error", CAUSE, ln, ln.rank, None, {"message": message, "trainer": True}, evidence)


def _match_interrupted(ln: LogLine) -> Event | None:
    """Ctrl-C, SIGTERM or a hang-up reached the job: it was stopped, it did not fail (an exception's strength, so a
    real cause seen before it still wins)."""
    if RE_INTERRUPTED.search(ln.body):
        return Event("interrupted", EXCEPTION, ln, ln.rank, None, {}, [ln])
    return None


def _match_elastic(lines: list[LogLine], i: int) -> Event | None:
    """torchelastic's root-cause block and the agent's 'failed (exitcode: N) local_rank: R' line."""
    ln = lines[i]
    a = agent_failure(ln.body)
    if a is not None:
        return _exit_event(ln, None, a.exit_code, {"local_rank": a.local_rank, "pid": a.pid, "agent": True}, [ln])
    window = lines[i + 1:i + 1 + ROOT_CAUSE_WINDOW]
    rc = root_cause(ln.body, [x.body for x in window])
    if rc is None:
        return None
    return _exit_event(ln, rc.rank, rc.exit_code, {"pid": rc.pid, "root_cause_block": True},
                       [ln, *(window[k] for k in rc.evidence)])


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
    tb = traceback_of(lines, i)
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

"""Failure doctor: read a dead run's logs and exit codes, name the first real failure, and say how to fix it.

Why a separate pass: when one rank dies, torchrun SIGTERMs the others and the survivors print NCCL timeouts
and aborted-communicator errors that look just as alarming. The doctor collects every signature it knows
(signatures.py, each with its source), ranks them by how causal they are, then by time, and reports the first
failing rank with the log lines that prove it (here), in one sentence (summary.py), with fixes ranked by
predicted cost (fixes.py: the planner's remedies for OOMs, known fixes for NCCL, host-memory, fp16 and config
failures, each with the plan's predicted per-GPU bytes and step time). Logs and run directories: logs.py.

No torch import: diagnosing is text processing plus the memory/time model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from scaletrain.engine.doctor.fixes import remedies_for
from scaletrain.engine.doctor.logs import LogLine, read_lines, run_dir_inputs, run_dir_status
from scaletrain.engine.doctor.signatures import (CAUSE, CONSEQUENCE, EXCEPTION, MAX_EVIDENCE_LINES, RE_TRACEBACK,
                                                 SIGABRT_EXIT, SIGKILL_EXIT, SIGTERM_EXIT, Event, scan)
from scaletrain.engine.doctor.summary import Diagnosis, with_summary
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.layout import STATUS, RunDir
from scaletrain.engine.doctor.peers import peer_report
from scaletrain.engine.doctor.restarts import restart_report
from scaletrain.engine.run.metrics import StepMetrics, read_metrics, steady_step_seconds
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.launch.status import RunStatus
from scaletrain.engine.units import fmt_seconds


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


def _events_from_exit_codes(exit_codes: dict[int, int], lines_by_rank: dict[int, list[LogLine]],
                            oom_kills: int | None = None) -> list[Event]:
    """A rank SIGKILLed with no traceback in its own log: the host OOM killer (§5.5), unless the launcher saw the
    kernel's OOM-kill count unchanged over the run (`oom_kills` 0): then something outside killed it."""
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
        if own:         # its last line is only where it was, not a cause: said so (a warning read as the reason)
            last = f"rank {rank}'s last line: {anchor.body.strip()}"
            ev = [LogLine(anchor.source, anchor.number, last, last, rank, anchor.time_key),
                  LogLine("exit codes", 0, f"rank {rank} exit code {code} (SIGKILL), no traceback",
                          f"rank {rank} exit code {code} (SIGKILL), no traceback", rank, None)]
        kind = "killed" if oom_kills == 0 else "host_oom"
        out.append(Event(kind, CAUSE, anchor, rank, None, {"exit_code": code, "from_exit_code": True}, ev))
    return out


# Free space below which a failed run's disk counts as full (a checkpoint of even a small model needs more).
LOW_DISK_BYTES = 16 << 20


def _events_from_status(status: RunStatus | None) -> list[Event]:
    """What the launcher recorded that no log line can say: a full disk it could not even log to (a cause), or a
    failed run that left its disk all but full (an exception's strength: a logged cause still wins)."""
    if status is None:
        return []
    free = status.disk_free_bytes
    if status.disk_full:
        text, strength = "the launcher met a full disk writing the run's files", CAUSE
    elif status.state == "failed" and free is not None and free < LOW_DISK_BYTES:
        text, strength = f"the run failed with {free:,} bytes left on the run directory's disk", EXCEPTION
    else:
        return []
    line = LogLine(STATUS, 0, f"{STATUS}: {text}", text, None, None)
    return [Event("disk_full", strength, line, None, None, {"disk_free_bytes": free}, [line])]


def _interrupted(status: RunStatus | None, chosen: Event | None) -> Event | None:
    """A run its launcher recorded as stopped from outside is `interrupted`, unless a real cause came first."""
    if status is None or status.state != "interrupted" or (chosen is not None and chosen.strength >= CAUSE):
        return None
    line = LogLine(STATUS, 0, f"{STATUS}: state interrupted, exit code {status.exit_code}"
                   + (f" ({status.reason})" if status.reason else ""), "", None, None)
    details = {"reason": status.reason} if status.reason else {}
    return Event("interrupted", CAUSE, line, None, None, details, [line] + (chosen.evidence[:1] if chosen else []))


def diagnose(logs: list[Path], plan: PlanDocument | None = None, exit_codes: dict[int, int] | None = None, *,
             first_failing_rank: int | None = None, with_remedies: bool = True,
             status: RunStatus | None = None, measured_step_seconds: float | None = None,
             last_step: StepMetrics | None = None) -> Diagnosis:
    """Classify a failed run from its logs (and, when known, per-rank exit codes, the plan, status.json, the
    steady step time the run measured: remedies' step times are scaled by it, and its last logged step: every
    rank's peak and node, for the failing rank's node and how close the others were to the plan)."""
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
        events.extend(scan(lines))
    by_rank: dict[int, list[LogLine]] = {}
    for ln in all_lines:
        if ln.rank is not None:
            by_rank.setdefault(ln.rank, []).append(ln)
    report = restart_report(status, all_lines)
    if report is not None and status is not None and status.state == "finished":
        return Diagnosis("restarted", report.first_rank, None, report.summary(True),
                         report.evidence[:MAX_EVIDENCE_LINES], restarts=report.lines)
    if status is not None and status.state == "finished" and not any(codes.values()):
        return _finished(status, codes, last_step)
    if report is not None:           # the agent's failure lines of the restarted rounds are not the run's failure
        restarted = [e for e in events if e.details.get("agent")][:len(report.lines)]
        events = [e for e in events if not any(e is r for r in restarted)]
    events.extend(_events_from_exit_codes(codes, by_rank, status.oom_kills if status is not None else None))
    events.extend(_events_from_status(status))
    hint = _hint_rank(events, codes, first_failing_rank)
    chosen = _pick(events, file_order, hint)
    chosen = _interrupted(status, chosen) or chosen
    if chosen is None:
        return _unknown(all_lines, codes, hint)
    _merge_details(chosen, events)
    if chosen.strength <= CONSEQUENCE and not codes and chosen.kind != "interrupted":
        chosen = _silent_rank(chosen, events, by_rank) or chosen
    if chosen.kind == "unknown" and chosen.details.get("exit_code") == SIGABRT_EXIT:
        # a C++ abort: the NCCL watchdog teardown is the usual reason (§5.5)
        nccl = [e for e in events if e.kind == "nccl_timeout" and (e.rank == chosen.rank or chosen.rank is None)]
        if nccl:
            chosen = Event("nccl_timeout", CAUSE, nccl[0].line, chosen.rank, None,
                           {**nccl[0].details, **chosen.details}, nccl[0].evidence + chosen.evidence)
    gpu = chosen.gpu
    if gpu is None and chosen.kind.startswith("cuda_oom") and chosen.rank is not None:
        gpu = _local_rank(chosen.rank, plan)
    if chosen.kind.startswith("cuda_oom") and "gpu_total_bytes" not in chosen.details and plan is not None:
        cap = plan.gpu_memory_bytes
        if cap:
            chosen.details["gpu_total_bytes"] = int(cap)
    secondary = _secondary_lines(events, chosen)
    evidence = tuple(_dedupe(x.text for x in chosen.evidence))[:MAX_EVIDENCE_LINES]
    peers = peer_report(chosen.rank, plan, last_step, stopped=chosen.kind == "interrupted")
    diag = Diagnosis(kind=chosen.kind, rank=chosen.rank, gpu=gpu, summary="", evidence=evidence,
                     details=dict(chosen.details), secondary=secondary, node=peers.node if peers else None,
                     peers=peers.line if peers else None)
    diag = with_summary(diag, plan)
    if report is not None:
        diag = replace(diag, summary=f"{diag.summary}; {report.summary(False)}", restarts=report.lines)
    if with_remedies:
        remedies, notes = remedies_for(diag, plan, measured_step_seconds,
                                       peers.peak_ratio if peers and diag.kind.startswith("cuda_oom") else None)
        diag = replace(diag, remedies=tuple(remedies), notes=notes)
    return diag


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _local_rank(rank: int, plan: PlanDocument | None) -> int:
    """accelerate/torchrun give local rank r the device cuda:r, so the GPU index is rank mod GPUs per node."""
    per_node = plan.gpus_per_node if plan is not None else None
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


def _finished(status: RunStatus, codes: dict[int, int], last_step: StepMetrics | None) -> Diagnosis:
    """A run that ended well (status.json: finished, no rank's exit code other than 0): nothing failed, and the
    verdict says so rather than "unknown" (a warning in its logs is not a failure)."""
    where = f" at step {last_step.step}/{last_step.total_steps}" if last_step is not None else ""
    took = status.wall_seconds()
    after = f" after {fmt_seconds(took)}" if took is not None else ""
    ranks = ", every rank exited 0" if codes else ""
    return Diagnosis("finished", None, None, f"the run finished{where}{after}{ranks}", ())


def _unknown(lines: list[LogLine], codes: dict[int, int], hint: int | None) -> Diagnosis:
    failed = {r: c for r, c in codes.items() if c not in (0, SIGTERM_EXIT)}
    if not failed and not any(c for c in codes.values()):
        summary = "no failure signature found in the logs" + (" and every rank exited 0" if codes else "")
    else:
        who = ", ".join(f"rank {r} exit {c}" for r, c in sorted(failed.items())) or "the run"
        summary = f"{who}: no known failure signature in the logs; read the log tail below"
    tail = [ln.text for ln in lines if ln.body.strip()][-3:]
    return Diagnosis("unknown", hint, None, summary, tuple(tail), ())


def diagnose_paths(paths: list[Path], plan: PlanDocument | None = None,
                   exit_codes: dict[int, int] | None = None, **kw: Any) -> Diagnosis:
    """`scaletrain diagnose` inputs: log files and/or run directories (a run dir brings its plan and status).
    Explicit `exit_codes` win over status.json's."""
    logs: list[Path] = []
    codes: dict[int, int] = {}
    first = measured = last = None
    status: RunStatus | None = None
    for p in paths:
        p = Path(p)
        if p.is_dir():
            run = RunDir(p)
            if not run.plan.exists() and not run.logs.is_dir():
                raise ScaletrainError(f"{p} is a directory but not a run directory (no plan.json or logs/)")
            l2, pj, c2, f2 = run_dir_inputs(p)
            if not l2 and not c2 and not exit_codes:
                why = ("its status.json names no exit codes" if run.status.is_file() else
                       f"it has not been launched (`scaletrain launch {p}` runs it)")
                raise ScaletrainError(f"{p} has no logs yet ({run.logs} holds no rank or launcher log) and "
                                      f"{why}: nothing to diagnose")
            logs += l2
            codes.update(c2)
            first = first if first is not None else f2
            plan = plan if plan is not None else pj
            status = status if status is not None else run_dir_status(p)
            if measured is None:
                series = read_metrics(run.metrics)
                measured, last = steady_step_seconds(series), (series[-1] if series else None)
        else:
            logs.append(p)
    codes.update(exit_codes or {})
    kw.setdefault("measured_step_seconds", measured)
    kw.setdefault("last_step", last)
    return diagnose(logs, plan, codes, first_failing_rank=first, status=status, **kw)

"""What a dead run left, read for the doctor: log lines with their rank and time, and a run directory's logs,
plan.json and status files (read through their own modules)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.launch.elastic import split_prefix
from scaletrain.engine.run.layout import RunDir, log_rank
from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
from scaletrain.engine.launch.rank_logs import LAUNCH_MARK_RE
from scaletrain.engine.launch.status import RunStatus, read_status

# Timestamps: glog ("E1122 00:20:47.170000" / "[E709 17:05:39.08]"), python logging ("2024-07-09 17:05:39,081"),
# torchelastic ("2026-11-22_00:20:47"), scaletrain's trainer (ISO "2024-07-09T17:05:39").
RE_TIME_GLOG = re.compile(r"\b[IWEF](\d{1,2})(\d{2}) (\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")
RE_TIME_ISO = re.compile(r"\b\d{4}-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2}(?:[.,]\d+)?)")


@dataclass(frozen=True)
class LogLine:
    source: str           # file name
    number: int           # 1-based line number in its file
    text: str             # the line as written (trailing newline removed)
    body: str             # the line without a "[rankN]:" prefix
    rank: int | None      # from the prefix, else the file name
    time_key: float | None


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
    except OSError as e:
        raise ScaletrainError(f"cannot read log {path} ({e.strerror or e.__class__.__name__})") from None
    file_rank = log_rank(Path(path).name)
    out = []
    all_lines = raw.splitlines()
    # the launcher appends a marker per launch; a relaunched run's earlier failures are history, not this one
    start = max((i for i, t in enumerate(all_lines) if LAUNCH_MARK_RE.match(t)), default=-1) + 1
    for i, text in enumerate(all_lines[start:], start + 1):
        p = split_prefix(text)
        body = text[p.end:] if p else text
        if p and body[:1].isspace():
            body = body[1:]                # "[rank3]: text": the space belongs to the prefix
        rank = p.number if p else file_rank
        out.append(LogLine(Path(path).name, i, text, body, rank, _time_key(body)))
    return out


def run_dir_inputs(run_dir: Path) -> tuple[list[Path], PlanDocument | None, dict[int, int], int | None]:
    """Logs, plan, exit codes and first failing rank of a run directory (the run-directory contract, layout.py)."""
    rd = RunDir(run_dir)
    logs = sorted(rd.logs.glob("*.log"), key=_log_sort_key) if rd.logs.is_dir() else []
    plan = read_plan_document(rd.plan) if rd.plan.exists() else None
    codes: dict[int, int] = {}
    first = None
    for path in rd.node_statuses():        # status.json, plus status-node-<R>.json from the other nodes
        st = read_status(path)
        codes.update(st.exit_codes)
        first = first if first is not None else st.first_failing_rank
    return logs, plan, codes, first


def _log_sort_key(p: Path) -> tuple[int, int, str]:
    r = log_rank(p.name)
    return (0, r, p.name) if r is not None else (1, 0, p.name)


def run_dir_status(run_dir: Path) -> RunStatus:
    """The head node's status.json (how the run ended: interrupted, a full disk, the host's OOM kills)."""
    return read_status(RunDir(run_dir).status)

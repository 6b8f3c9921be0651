"""What a dead run left, read for the doctor: log lines with their rank and time, and a run directory's logs,
plan.json and status files (read through their own modules)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import open_regular
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
    number: int           # 1-based line number in its file (counted through a large log's unread middle)
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


# A log is read where failures are written: its head (configuration warnings, the launch) and its tail (the
# traceback, the exit); a larger log's middle is only scanned for launch marks and counted for line numbers, in
# bounded chunks, so a 1 GB log costs one linear pass of bytes.count/find and the signatures see at most these bytes.
HEAD_BYTES = 2 << 20
TAIL_BYTES = 8 << 20
CHUNK_BYTES = 8 << 20
# A line longer than this is cut to its head and tail around " … ": every signature is within a line's first KiBs
# (an exception's name and message, an OOM's numbers) or its end, and no regex then sees a 50 MB line.
MAX_LINE_CHARS = 16 << 10
LINE_HEAD_CHARS = 12 << 10
_MARK = b"==> scaletrain launch "


def _cut(text: str) -> str:
    if len(text) <= MAX_LINE_CHARS:
        return text
    return text[:LINE_HEAD_CHARS] + " … " + text[-(MAX_LINE_CHARS - LINE_HEAD_CHARS):]


def _read_windows(path: Path) -> tuple[bytes, int, bytes | None, bool]:
    """(head, lines skipped between head and tail, tail or None when the log was read whole, a launch mark in the
    skipped middle). Regular files only: a FIFO or a device in a log's place is one line, not a wait."""
    with open_regular(path, "log") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= HEAD_BYTES + TAIL_BYTES:
            return f.read(), 0, None, False
        head = f.read(HEAD_BYTES)
        cut = head.rfind(b"\n") + 1 or len(head)
        head, pos = head[:cut], cut
        tail_start = size - TAIL_BYTES
        skipped, mark, prev = 0, False, b"\n"
        f.seek(pos)
        while pos < tail_start:
            chunk = f.read(min(CHUNK_BYTES, tail_start - pos))
            if not chunk:
                break
            skipped += chunk.count(b"\n")
            mark = mark or (prev + chunk).find(b"\n" + _MARK) >= 0
            prev, pos = chunk[-len(_MARK):], pos + len(chunk)
        tail = f.read(TAIL_BYTES)
    return head, skipped, tail, mark


def read_lines(path: Path) -> list[LogLine]:
    """A log's lines as the doctor reads them: after the last launch mark, giant lines cut (_cut), a log larger
    than HEAD_BYTES + TAIL_BYTES read as its head and tail (line numbers stay the file's)."""
    try:
        head, skipped, tail, mark_between = _read_windows(Path(path))
    except FileNotFoundError:
        raise ScaletrainError(f"log {path} does not exist; pass log files or a run directory") from None
    except OSError as e:
        raise ScaletrainError(f"cannot read log {path} ({e.strerror or e.__class__.__name__})") from None
    numbered = list(enumerate(head.decode("utf-8", errors="replace").splitlines(), 1))
    if tail is not None:
        tail_lines = tail.decode("utf-8", errors="replace").splitlines()
        # the tail's first line is usually the rest of a cut one; splitlines also breaks at \r (progress bars), so
        # the tail is numbered after the head's lines at least: the order of events stays the file's
        first = max(head.count(b"\n") + skipped + 1, len(numbered) + 1)
        if mark_between:
            numbered = []                          # a later launch began in the middle: the head is history
        numbered += list(enumerate(tail_lines, first))
    name = Path(path).name
    file_rank = log_rank(name)
    out = []
    # the launcher appends a marker per launch; a relaunched run's earlier failures are history, not this one
    start = max((k for k, (_, t) in enumerate(numbered) if LAUNCH_MARK_RE.match(t)), default=-1) + 1
    for i, text in numbered[start:]:
        text = _cut(text)
        p = split_prefix(text)
        body = text[p.end:] if p else text
        if p and body[:1].isspace():
            body = body[1:]                # "[rank3]: text": the space belongs to the prefix
        rank = p.number if p else file_rank
        out.append(LogLine(name, i, text, body, rank, _time_key(body)))
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

"""Restarts under torchelastic (train.max_restarts): when each happened, why, and where the run resumed.

Why its own pass: a restarted run's logs hold a rank's failure (the agent's "failed (exitcode: -9) local_rank: 1"
line, a traceback) although the run went on and may have finished; the doctor must say "restarted after rank 1 was
killed, resumed from step 4", not "killed". The launcher records each restart in status.json (elastic.restarts:
the failed rank and its exit code); the trainer's rank 0 says "scaletrain: elastic restart N of M" and then
"resumed from … at step S" in its log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scaletrain.engine.doctor.logs import LogLine
from scaletrain.engine.launch.elastic import RE_RESTART, Restart
from scaletrain.engine.launch.status import RunStatus

RE_RESUMED = re.compile(r"scaletrain: resumed from .+? at step (\d+)")


@dataclass(frozen=True)
class RestartReport:
    lines: tuple[str, ...]          # one per restart: "restart 1: rank 1 killed by SIGKILL; resumed from step 4"
    evidence: tuple[str, ...]       # the log lines that show it (the agent's failure line, the trainer's mark)
    first_rank: int | None

    def summary(self, finished: bool) -> str:
        n = len(self.lines)
        head = f"{n} elastic restart{'s' if n != 1 else ''}"
        return (f"the run finished after {head} ({'; '.join(self.lines)})" if finished
                else f"after {head} ({'; '.join(self.lines)})")


def restart_report(status: RunStatus | None, lines: list[LogLine]) -> RestartReport | None:
    """The run's restarts, from status.json and the logs (None: it was not restarted)."""
    recorded = [Restart(n, r, c) for n, r, c in (status.restarts if status is not None else ())]
    marks: dict[int, int | None] = {}              # restart number → the step it resumed from
    evidence: list[str] = []
    current: int | None = None
    for ln in lines:
        if (m := RE_RESTART.search(ln.body)) is not None:
            current = int(m.group(1))
            marks.setdefault(current, None)
            evidence.append(ln.text)
        elif current is not None and (m := RE_RESUMED.search(ln.body)) is not None and marks.get(current) is None:
            marks[current] = int(m.group(1))
            evidence.append(ln.text)
        elif "failed (exitcode:" in ln.body and ln.rank is None:
            evidence.append(ln.text)
    if not recorded:
        recorded = [Restart(n, None, None) for n in sorted(marks)]
    if not recorded:
        return None
    out = []
    for r in recorded:
        step = marks.get(r.number)
        out.append(r.describe() + (f", resumed from step {step}" if step is not None else
                                   ", started again from step 0 (no checkpoint yet)" if r.number in marks else ""))
    return RestartReport(tuple(out), tuple(dict.fromkeys(evidence)), recorded[0].rank)

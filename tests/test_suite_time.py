"""bench/suite_time.py --processes: every Python process records its own CPU as it ends, by kind, however it ends
(a normal exit, the trainer's os._exit), and a process killed by a signal records nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from suite_time import processes_by_kind  # noqa: E402

RECORDER = ROOT / "bench" / "process_recorder"
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"


def _python(argv: list[str], log: Path | None, **kw) -> subprocess.Popen:
    path = [str(RECORDER), *filter(None, [os.environ.get("PYTHONPATH")])]    # as suite_time.py: no empty entry
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("SUITE_TIME_PROCESSES", None)
    if log is not None:
        env["SUITE_TIME_PROCESSES"] = str(log)
    return subprocess.Popen([sys.executable, *argv], env=env, stdin=subprocess.DEVNULL, **kw)


def test_each_process_records_its_kind_and_cpu_however_it_ends(tmp_path):
    log = tmp_path / "processes.jsonl"
    rank = tmp_path / "train.py"                   # the trainer's file name: a rank, which ends with os._exit
    rank.write_text(BURN + "import os\nos._exit(3)\n")
    assert _python([str(rank), "--run-dir", "x"], log).wait() == 3
    assert _python(["-c", BURN], log).wait() == 0
    killed = _python(["-c", "import time\ntime.sleep(60)"], log)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    rows = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["rank (trainer/train.py)", "python -c (a test's or probe's child)"]
    assert rows[0]["argv"] == ["train.py", "--run-dir", "x"]
    assert all(r["cpu_seconds"] >= 0.2 and r["wall_seconds"] >= 0.2 and r["modules"] > 0 for r in rows)
    with log.open("a") as f:
        f.write('{"kind": "rank (trainer/tra')                # a writer killed mid-line: not counted
    summary = processes_by_kind(log)
    assert summary["recorded"] == 2 and summary["cpu_seconds"] >= 0.4
    assert [k["processes"] for k in summary["by_kind"]] == [1, 1]


def test_without_the_variable_nothing_is_written_and_exit_is_untouched(tmp_path):
    def exit_module(log):
        p = _python(["-c", "import os; print(os._exit.__module__)"], log, stdout=subprocess.PIPE, text=True)
        return p.communicate()[0].strip()

    assert exit_module(None) == "posix" and list(tmp_path.iterdir()) == []
    assert exit_module(tmp_path / "p.jsonl") == "sitecustomize" and (tmp_path / "p.jsonl").is_file()

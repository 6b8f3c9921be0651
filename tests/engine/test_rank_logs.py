"""The launcher's log split (engine/launch/rank_logs.py): during a stop the launcher asked for, torchrun's agent
answers the SIGINT with a traceback ending in SignalException; it read as a crash at the end of logs/launcher.log and
in the monitor's log tail. It is folded into one line that keeps the exception (the doctor's `interrupted` signature);
any other traceback is written as it came, and a held block is never lost."""

from __future__ import annotations

from pathlib import Path

from scaletrain.engine.doctor.signatures import RE_INTERRUPTED
from scaletrain.engine.launch.rank_logs import RankLogs
from scaletrain.engine.run.layout import RunDir

# torchrun's agent receiving the stop's SIGINT (torch 2.13, accelerate 1.15; a real launcher.log, paths shortened)
AGENT_TRACEBACK = (Path(__file__).parent.parent / "fixtures" / "agent_sigint_traceback.txt").read_text().splitlines()
OTHER_TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "    main()",
                   "RuntimeError: something real went wrong"]


def _fed(tmp_path: Path, lines: list[str], stopping: bool) -> tuple[list[str], list]:
    logs = RankLogs(RunDir(tmp_path), single_process=False)
    logs.stopping = stopping
    answers = [logs.feed(line) for line in lines]
    logs.close()
    return (tmp_path / "logs" / "launcher.log").read_text().splitlines(), answers


def test_the_agents_answer_to_a_stop_is_one_line_and_still_reads_as_interrupted(tmp_path):
    written, answers = _fed(tmp_path, ["before", *AGENT_TRACEBACK, "[rank0]:step 5", "after"], stopping=True)
    folded = ("scaletrain: torchrun's agent stopped as asked (SignalException: Process 10234 got signal: 2; its "
              "traceback left out)")
    assert written == ["before", folded, "after"]
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "step 5\n"
    assert RE_INTERRUPTED.search(folded)
    assert [a for a in answers if a[1] is not None] == [(None, "before"), (None, folded), (0, "step 5"),
                                                       (None, "after")]


def test_any_other_traceback_and_one_outside_a_stop_are_written_as_they_came(tmp_path):
    assert _fed(tmp_path / "a", ["x", *OTHER_TRACEBACK, "y"], stopping=True)[0] == ["x", *OTHER_TRACEBACK, "y"]
    assert _fed(tmp_path / "b", AGENT_TRACEBACK, stopping=False)[0] == AGENT_TRACEBACK
    cut = AGENT_TRACEBACK[:-1]                    # the launcher closed the logs mid-block: nothing lost
    assert _fed(tmp_path / "c", cut, stopping=True)[0] == cut


def test_an_agent_line_glued_to_a_dying_ranks_last_line_is_the_launchers(tmp_path):
    """Seen in make test: rank 0, terminated for the restart, printed nanobind's exit message without its newline, and
    torchrun's agent line reporting the killed rank 1 was glued to it. It went to rank 0's log, so the restart was
    never recorded (status.json said finished with no restarts). The glued line is cut at the agent's log header."""
    from scaletrain.engine.launch.elastic import restarts

    agent = ("E1203 19:29:56.004000 1485 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
             "local_rank: 1 (pid: 1493) of binary: /work/main/.venv/bin/python")
    rank0 = "See https://nanobind.readthedocs.io/en/latest/refleaks.html"
    logs = RankLogs(RunDir(tmp_path), single_process=False)
    answers = [logs.feed(line) for line in ["[rank0]:step 5", f"[rank0]:{rank0}{agent}", "[rank1]:" + agent[:5]]]
    logs.close()
    assert (tmp_path / "logs" / "rank-0.log").read_text().splitlines() == ["step 5", rank0]
    assert (tmp_path / "logs" / "launcher.log").read_text().splitlines() == [agent]
    assert restarts(logs.launcher_lines, finished=True) and restarts(logs.launcher_lines, True)[0].rank == 1
    assert answers[1] == (0, rank0)
    assert (tmp_path / "logs" / "rank-1.log").read_text() == "E1203\n"       # a rank's own text, not a header

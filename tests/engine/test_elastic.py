"""torchelastic's failure summary, read by the launcher: which rank failed first, with what exit code."""

from pathlib import Path

from scaletrain.engine.launch.elastic import parse_failures

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_root_cause_block_names_the_first_failure():
    rank, code, codes = parse_failures(lines("elastic_torch213_sigkill_r3.log"))
    assert (rank, code) == (3, -9)
    assert codes == {0: -15, 1: -15, 2: -15, 3: -9}
    rank, code, codes = parse_failures(lines("elastic_torch213_exception_r3.log"))
    assert (rank, code) == (3, 1) and codes[0] == -15


def test_agent_line_when_there_is_no_summary_block():
    # torch 2.0's single-rank log: the Root Cause block is there too; drop it to read the agent's line alone
    text = [ln for ln in lines("elastic_torch20_sigkill.log") if "failed (exitcode" in ln]
    assert parse_failures(text, rank_offset=8) == (8, -9, {8: -9})


def swap_root(text: list[str]) -> list[str]:
    """The race seen under load: rank 0 exits 1 (its peer vanished mid-allreduce) and is observed first; the rank
    that was SIGKILLed is listed under Failures."""
    out = "\n".join(text)
    out = out.replace("rank      : 3 (local_rank: 3)\n  exitcode  : -9", "rank      : 9 (local_rank: 9)\n  exitcode  : 1")
    out = out.replace("rank      : 0 (local_rank: 0)\n  exitcode  : -15", "rank      : 3 (local_rank: 3)\n  exitcode  : -9")
    out = out.replace("rank      : 9 (local_rank: 9)", "rank      : 0 (local_rank: 0)")
    return out.splitlines()


def test_a_killed_rank_outranks_one_that_only_exited_with_an_error():
    raced = swap_root(lines("elastic_torch213_sigkill_r3.log"))
    rank, code, codes = parse_failures(raced)
    assert codes[0] == 1 and codes[3] == -9           # the composition holds what the test says it does
    assert (rank, code) == (3, -9)


def test_sigterm_from_torchrun_is_never_the_cause():
    rank, code, _ = parse_failures(lines("elastic_torch213_exception_r3.log"))
    assert code == 1 and rank == 3                    # the -15s are torchrun's own doing

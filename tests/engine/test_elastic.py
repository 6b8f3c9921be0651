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


# ---- issue 33: restarts under torchelastic (train.max_restarts) ----------------------------------------------------
def test_restarts_are_the_failed_rounds_before_the_end():
    from scaletrain.engine.launch.elastic import restarts

    # a failed run without restarts: its one failure is the run's, not a restart
    assert restarts(lines("elastic_torch213_sigkill_r3.log"), finished=False) == []
    failed = [ln for ln in lines("elastic_torch213_sigkill_r3.log") if "failed (exitcode" in ln]
    assert len(failed) == 1
    # the same agent line before a finish: one restart after local rank 3 (global 7 on the second node) was killed
    (r,) = restarts(failed, finished=True, rank_offset=4)
    assert (r.number, r.rank, r.exit_code) == (1, 7, -9)
    assert r.describe() == "restart 1: rank 7 killed by SIGKILL"
    # two failed rounds, then the run failed: the first was restarted, the second ended it
    (first,) = restarts(failed * 2, finished=False)
    assert first.number == 1 and first.rank == 3


def test_the_restart_count_comes_from_torchrun():
    from scaletrain.engine.launch.elastic import RE_RESTART, restart_count, restart_line

    assert restart_count({}) == 0 and restart_count({"TORCHELASTIC_RESTART_COUNT": "x"}) == 0
    env = {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert restart_count(env) == 2
    m = RE_RESTART.search(restart_line(2, env))
    assert m and m.groups() == ("2", "3")


def test_status_json_keeps_the_restarts(tmp_path):
    from scaletrain.engine.launch.status import RunStatus, StatusWriter, read_status

    w = StatusWriter(tmp_path / "status.json")
    w.write(state="finished", exit_code=0, ended="now", restarts=((1, 1, -9),))
    assert read_status(tmp_path / "status.json").restarts == ((1, 1, -9),)
    assert RunStatus.from_json({"state": "finished", "restarts": [{"restart": "x"}, 3, {"restart": 2}]}).restarts \
        == ((2, None, None),)


def test_max_restarts_reach_the_launch_argv_and_launch_sh(tmp_path):
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.options import TrainOptions
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.run.layout import RunDir
    from scaletrain.engine.run.scripts import elastic_env, launch_argv, launch_script, sbatch_script

    run = RunDir(tmp_path)
    one = launch_argv(run, TrainOptions(max_restarts=3))
    assert one[one.index("--max_restarts") + 1] == "3" and "--rdzv_backend" not in one    # one node: static
    nodes = launch_argv(run, TrainOptions(max_restarts=3), machine_rank=1, main_process_ip="10.0.0.1")
    assert nodes[nodes.index("--rdzv_backend") + 1] == "c10d"                             # across nodes: c10d
    assert elastic_env(TrainOptions(max_restarts=3), multi_node=False) == {"PET_STANDALONE": "1",      # standalone,
                                                                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert elastic_env(TrainOptions(max_restarts=3), multi_node=True) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert elastic_env(TrainOptions(), multi_node=False) == {}
    assert "--max_restarts" not in launch_argv(run, TrainOptions())
    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", nodes=2, precision="fp32", strategy="ddp")
    plan = make_plan(req)
    sh = launch_script(plan, run, TrainOptions(max_restarts=2), main_process_ip="10.0.0.1", deepspeed=False)
    assert "--max_restarts 2 --rdzv_backend c10d" in sh and "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in sh
    sb = sbatch_script(plan, run, TrainOptions(max_restarts=2), deepspeed=False)
    assert sb.count("--rdzv_backend") == 1 and "--max_restarts 2" in sb
    assert sb.index("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1") < sb.index("srun ")
    one_node = make_plan(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", precision="fp32", strategy="ddp"))
    assert "export PET_STANDALONE=1" in launch_script(one_node, run, TrainOptions(max_restarts=1), deepspeed=False)
    assert "PET_STANDALONE" not in launch_script(one_node, run, TrainOptions(), deepspeed=False)

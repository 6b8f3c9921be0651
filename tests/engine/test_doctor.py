"""Failure doctor: classification of real log formats, the first failing rank, evidence, remedies, the CLI.

Fixtures (tests/fixtures/logs): `elastic_torch213_*`, `host_cpu_allocator_oom`, `config_accelerate_unknown_keys`
and `config_deepspeed_*` were produced by running torch 2.13 / accelerate 1.15 / DeepSpeed 0.19.8 on this CPU
host; the GPU-only ones (CUDA OOM wordings, NCCL, fp16 loss scale) are written in the formats of the sources the
reference quotes (CUDACachingAllocator.cpp, ProcessGroupNCCL.cpp, DeepSpeed loss_scaler.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaletrain.engine.doctor.signatures import KINDS, parse_size
from scaletrain.engine.doctor.diagnosis import diagnose, diagnose_paths
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.presets import load_preset
from scaletrain.engine.doctor.remedies import rank_remedies
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.tui.cli.main import main

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
GiB = 1024**3


def diag(name: str, **kw):
    return diagnose([LOGS / name], with_remedies=kw.pop("with_remedies", False), **kw)


# (fixture, kind, rank, gpu)
CASES = [
    ("torch_current_oom_4090x8_r3.log", "cuda_oom", 3, 3),
    ("torch2x_oom_gpu3.log", "cuda_oom", None, 3),
    ("torch21_oom_capacty_gpu1.log", "cuda_oom", None, 1),
    ("torch1x_oom_gpu3.log", "cuda_oom", None, 3),
    ("cuda_runtime_oom__rank-2.log", "cuda_oom", 2, 2),
    ("deepspeed_zero3_gather_oom_gpu2.log", "cuda_oom_zero3_gather", 2, 2),
    ("host_cpu_allocator_oom.log", "host_oom", None, None),
    ("elastic_torch213_sigkill_r3.log", "host_oom", 3, None),
    ("elastic_torch20_sigkill.log", "host_oom", 0, None),
    ("elastic_torch213_sigabrt_r3.log", "unknown", 3, None),
    ("elastic_torch213_exception_r3.log", "unknown", 3, None),
    ("nccl_watchdog_timeout_torch24.log", "nccl_timeout", 3, None),
    ("nccl_watchdog_timeout_torch113.log", "nccl_timeout", 6, None),
    ("nccl_error_unhandled_system.log", "nccl_error", 1, None),
    ("nccl_internal_error__rank-0.log", "nccl_error", 0, None),
    ("deepspeed_fp16_loss_scale_minimum.log", "fp16_overflow", 0, None),
    ("config_accelerate_unknown_keys.log", "config_error", None, None),
    ("config_accelerate_deepspeed_file_conflict.log", "config_error", None, None),
    ("config_deepspeed_batch_assertion.log", "config_error", 0, None),
    ("config_deepspeed_zero_validation.log", "config_error", 0, None),
    ("transformers_gpt_oss_no_sdpa__rank-0.log", "config_error", 0, None),
]


@pytest.mark.parametrize("name,kind,rank,gpu", CASES, ids=[c[0] for c in CASES])
def test_classifies_each_real_format(name, kind, rank, gpu):
    d = diag(name)
    assert (d.kind, d.rank, d.gpu) == (kind, rank, gpu), d.summary
    assert d.kind in KINDS
    text = (LOGS / name).read_text().splitlines()
    assert d.evidence and all(line in text for line in d.evidence)     # evidence is quoted, never paraphrased


def test_every_fixture_is_covered():
    named = {c[0] for c in CASES} | {p.name for p in LOGS.glob("set_*")}
    assert named == {p.name for p in LOGS.glob("*.log")}


@pytest.mark.parametrize("name,tried,total,free", [
    ("torch_current_oom_4090x8_r3.log", "2.32 GiB", "23.65 GiB", "1.19 GiB"),
    ("torch21_oom_capacty_gpu1.log", "6.37 GiB", "79.11 GiB", "2.93 GiB"),
    ("torch1x_oom_gpu3.log", "2.00 GiB", "23.65 GiB", "1.21 GiB"),
    ("deepspeed_zero3_gather_oom_gpu2.log", "512.00 MiB", "31.75 GiB", "301.50 MiB"),
])
def test_oom_numbers_are_parsed_from_every_wording(name, tried, total, free):
    x = diag(name).details
    assert x["tried_to_allocate_bytes"] == parse_size(tried)
    assert x["gpu_total_bytes"] == parse_size(total)
    assert x["gpu_free_bytes"] == parse_size(free)


def test_parse_size_units():
    assert parse_size("2.00 GiB") == 2 * GiB
    assert parse_size("274.00 MiB") == 274 * 1024**2
    assert parse_size("0 bytes") == 0
    assert parse_size("1.5 GB") == 1_500_000_000
    with pytest.raises(ValueError):
        parse_size("lots")


def test_sigtermed_ranks_are_not_the_cause():
    d = diag("elastic_torch213_sigkill_r3.log")           # ranks 0,1,2 are listed first, all -15
    assert d.rank == 3 and d.kind == "host_oom"
    assert any("(SIGKILL)" in line for line in d.evidence)


def test_first_failing_rank_from_exit_codes_beats_its_peers_fallout():
    logs = sorted(LOGS.glob("set_hostoom__rank-*.log"))
    d = diagnose(logs, exit_codes={0: -15, 1: -15, 2: -9, 3: -15}, with_remedies=False)
    assert (d.kind, d.rank) == ("host_oom", 2)
    assert {s.split(":")[0] for s in d.secondary} == {"rank 0", "rank 1", "rank 3"}
    # without exit codes: the one rank that stopped logging while its peers lost it is still named
    d = diagnose(logs, with_remedies=False)
    assert d.rank == 2 and "stopped logging" in d.summary


def test_oom_beats_the_nccl_timeouts_it_caused(tmp_path):
    (tmp_path / "rank-0.log").write_text((LOGS / "nccl_watchdog_timeout_torch24.log").read_text())
    oom = [ln.removeprefix("[rank3]: ") for ln in (LOGS / "torch_current_oom_4090x8_r3.log").read_text().splitlines()
           if ln.startswith("[rank3]: ")]
    (tmp_path / "rank-5.log").write_text("\n".join(oom) + "\n")
    d = diagnose([tmp_path / "rank-0.log", tmp_path / "rank-5.log"], with_remedies=False)
    assert (d.kind, d.rank, d.gpu) == ("cuda_oom", 5, 3)


def test_earliest_timestamp_wins_between_two_real_causes(tmp_path):
    line = ("[2026-11-21 10:00:{s:02d},000] [ERROR] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "1.00 GiB. GPU {g} has a total capacity of 23.65 GiB of which 10.00 MiB is free.")
    (tmp_path / "rank-0.log").write_text(line.format(s=9, g=0) + "\n")
    (tmp_path / "rank-1.log").write_text(line.format(s=5, g=1) + "\n")
    d = diagnose(sorted(tmp_path.glob("*.log")), with_remedies=False)
    assert (d.rank, d.gpu) == (1, 1)


def test_an_earlier_launch_in_the_same_log_is_history(tmp_path):
    old = (LOGS / "torch1x_oom_gpu3.log").read_text()
    p = tmp_path / "rank-0.log"
    p.write_text(old + "==> scaletrain launch 2026-11-22T00:30:11 <==\nstep 3/8 loss 6.43\n")
    d = diagnose([p], exit_codes={0: -9}, with_remedies=False)
    assert d.kind == "host_oom"                            # the OOM before the relaunch marker is not this failure


def test_no_signature_is_unknown_with_the_tail(tmp_path):
    p = tmp_path / "rank-0.log"
    p.write_text("step 1/4 loss 2.0\nstep 2/4 loss 1.9\n")
    d = diagnose([p], exit_codes={0: 1}, with_remedies=False)
    assert d.kind == "unknown" and d.evidence[-1] == "step 2/4 loss 1.9"


# ---- JSON contract and remedies ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_4090x8() -> dict:
    """The issue's plan, from the bundled preset (the same fields as the issue's PlanRequest)."""
    preset = load_preset("4090x8")
    plan = make_plan(PlanRequest(**preset.request_fields()))
    assert (plan.setup.micro_batch, plan.setup.grad_accum, plan.setup.effective_batch) == (2, 8, 128)
    return plan.to_json()


def test_issue_acceptance_diagnose_json_for_the_4090x8_oom(tmp_path, capsys, plan_4090x8):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plan_4090x8))
    rc = main(["diagnose", str(LOGS / "torch_current_oom_4090x8_r3.log"), "--plan", str(pj), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"kind", "rank", "node", "gpu", "summary", "evidence", "peers", "remedies", "notes",
                        "restarts"}
    assert (out["kind"], out["rank"], out["gpu"], out["restarts"]) == ("cuda_oom", 3, 3, [])
    assert all(set(r) == {"title", "changes", "predicted_per_gpu_bytes", "predicted_step_seconds",
                          "effective_batch", "time_scale", "memory_scale", "apply"} for r in out["remedies"])
    assert all(r["apply"] is None for r in out["remedies"])      # a log file, no run directory to apply it to
    assert out["notes"] == [] and all(r["time_scale"] is None for r in out["remedies"])   # no steps measured
    card_usable = plan_4090x8["memory"]["usable_bytes"]          # 24 GB card less the plan's headroom
    first, second = out["remedies"][:2]
    assert first["predicted_per_gpu_bytes"] <= card_usable and second["predicted_per_gpu_bytes"] <= card_usable
    assert first["effective_batch"] == 128
    assert first["predicted_step_seconds"] > 0


def test_oom_remedies_are_the_planners_ranking(plan_4090x8):
    d = diagnose([LOGS / "torch_current_oom_4090x8_r3.log"], PlanDocument.from_json(plan_4090x8))
    _, plan = PlanDocument.from_json(plan_4090x8).replan()
    ranked = rank_remedies(plan, d.failure_dict())
    assert [r.title for r in d.remedies] == [r.title for r in ranked]
    assert [r.predicted_per_gpu_bytes for r in d.remedies] == [r.predicted_per_gpu_bytes for r in ranked]
    # the hardware-changing remedy is listed, but a relaunch on the same machines cannot apply it
    assert all(r.applicable == ("gpus" not in r.changes) for r in d.remedies)


def test_plan_from_json_reproduces_the_plan(plan_4090x8):
    _, plan = PlanDocument.from_json(plan_4090x8).replan()
    assert plan.memory.total_bytes == plan_4090x8["memory"]["per_gpu_bytes"]["total"]
    assert plan.setup.effective_batch == 128


def test_nccl_timeout_remedies_carry_the_plans_numbers(plan_4090x8):
    d = diagnose([LOGS / "nccl_watchdog_timeout_torch24.log"], PlanDocument.from_json(plan_4090x8))
    assert d.remedies
    for r in d.remedies:
        assert r.predicted_per_gpu_bytes == plan_4090x8["memory"]["per_gpu_bytes"]["total"]
        assert r.effective_batch == 128
        assert all(k.startswith("env.") for k in r.changes)
    assert any("NCCL_DEBUG" in "".join(r.changes) for r in d.remedies)


def test_host_oom_with_offload_suggests_less_offload_with_predictions():
    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="8xH100", strategy="zero3", offload="all",
                                 micro_batch=1, grad_accum=4, grad_ckpt=True, seq_len=2048))
    d = diagnose([LOGS / "elastic_torch213_sigkill_r3.log"], PlanDocument.from_json(plan.to_json()))
    assert d.kind == "host_oom"
    by_change = {r.changes.get("offload"): r for r in d.remedies if r.changes}
    assert set(by_change) == {"optimizer", "none"}
    opt = make_plan(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="8xH100", strategy="zero3",
                                offload="optimizer", micro_batch=1, grad_accum=4, grad_ckpt=True, seq_len=2048))
    assert by_change["optimizer"].predicted_per_gpu_bytes == opt.memory.total_bytes
    assert any(not r.applicable and "host RAM" in r.title for r in d.remedies)


def test_fp16_overflow_suggests_bf16_on_a_card_that_has_it():
    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="4xA100-80GB", precision="fp16",
                                 strategy="zero2", micro_batch=2, grad_accum=4, grad_ckpt=False, offload="none"))
    d = diagnose([LOGS / "deepspeed_fp16_loss_scale_minimum.log"], PlanDocument.from_json(plan.to_json()))
    assert d.remedies[0].changes == {"precision": "bf16"}


# ---- CLI --------------------------------------------------------------------------------------------------------
def test_cli_text_output_and_bad_input(capsys, tmp_path):
    assert main(["diagnose", str(LOGS / "elastic_torch213_sigkill_r3.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host_oom rank 3:")
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["diagnose", str(LOGS / "torch1x_oom_gpu3.log"), "--plan", str(tmp_path / "bad.json")]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["diagnose", str(LOGS / "torch1x_oom_gpu3.log"), "--exit-code", "three"]) == 2
    assert "RANK=CODE" in capsys.readouterr().err


def test_cli_reads_a_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    for p in LOGS.glob("set_hostoom__rank-*.log"):
        (run / "logs" / p.name.split("__")[1]).write_text(p.read_text())
    (run / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 137, "first_failing_rank": 2,
                                                 "exit_codes": {"0": -15, "1": -15, "2": -9, "3": -15}}))
    d = diagnose_paths([run])
    assert (d.kind, d.rank) == ("host_oom", 2)
    with pytest.raises(ScaletrainError, match="not a run directory"):
        diagnose_paths([tmp_path])


def test_an_attention_the_model_lacks_is_named_with_replanned_remedies():
    """gpt_oss built with sdpa (a --script run; the plan itself refuses it): a config error naming the class and
    the attention, and the remedies re-planned with eager / flash attention (numbers from the planner)."""
    d = diag("transformers_gpt_oss_no_sdpa__rank-0.log", with_remedies=True)
    assert d.kind == "config_error" and d.details["attn_unsupported"] == "sdpa"
    assert "GptOssForCausalLM has no sdpa attention" in d.summary
    assert [r.changes for r in d.remedies] == [{"attn": "eager"}, {"attn": "flash"}]
    req = PlanRequest(model="openai/gpt-oss-20b", gpus="1xH100", method="lora", attn="flash", grad_ckpt=True,
                      micro_batch=1, grad_accum=4, seq_len=2048)
    plan = make_plan(req)
    d = diagnose([LOGS / "transformers_gpt_oss_no_sdpa__rank-0.log"], PlanDocument.from_json(plan.to_json()))
    eager = make_plan(req.with_(attn="eager"))
    assert d.remedies[0].changes == {"attn": "eager"}
    assert d.remedies[0].predicted_per_gpu_bytes == eager.memory.total_bytes


# ---- issue 33: a run torchelastic restarted (tests/fixtures/logs/elastic_restart_run: the logs and status.json of
# tests/e2e/test_elastic_restart.py's run, rank 1 SIGKILLed after the step-4 checkpoint, max_restarts 2) -------------
RESTARTED = LOGS / "elastic_restart_run"


def test_a_run_that_finished_after_a_restart_is_restarted_not_killed(capsys):
    d = diagnose_paths([RESTARTED])
    assert d.kind == "restarted" and d.rank == 1
    assert d.summary == ("the run finished after 1 elastic restart (restart 1: rank 1 killed by SIGKILL, resumed "
                         "from step 4)")
    assert d.restarts == ("restart 1: rank 1 killed by SIGKILL, resumed from step 4",) and not d.remedies
    assert any("failed (exitcode: -9) local_rank: 1" in e for e in d.evidence)
    assert any("elastic restart 1 of 2" in e for e in d.evidence)
    assert main(["diagnose", str(RESTARTED), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "restarted" and out["restarts"] == list(d.restarts)


def test_a_run_that_finished_is_finished_not_unknown(tmp_path, capsys):
    """A run that ended well, its logs holding a library's warning (accelerate's, as a real run's do): the doctor
    says it finished and how far and long it ran, quotes nothing and offers no remedy. The same logs with a rank's
    non-zero exit code are a failure, diagnosed as ever."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    warning = "accelerator.py:2032: FutureWarning: `broadcast_buffers` is deprecated."
    for r in (0, 1):
        (run / "logs" / f"rank-{r}.log").write_text(f"step 3/4 loss 1.9\n{warning}\nstep 4/4 loss 1.8\n")
    rows = [{"step": s, "total_steps": 4, "epoch": s / 4, "loss": 2.0, "lr": 1e-5, "tokens_per_second": 1e3,
             "step_seconds": 0.5, "world_size": 2, "time": 1763700000.0 + s} for s in (1, 2, 3, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    status = {"state": "finished", "exit_code": 0, "exit_codes": {"0": 0, "1": 0},
              "started": "2026-12-03T15:01:25", "ended": "2026-12-03T15:03:25"}
    (run / "status.json").write_text(json.dumps(status))
    d = diagnose_paths([run])
    assert d.kind == "finished" and d.kind in KINDS and d.rank is None
    assert d.summary == "the run finished at step 4/4 after 2.0 min, every rank exited 0"
    assert d.evidence == () and d.remedies == ()
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("finished: the run finished at step 4/4") and warning not in out
    assert main(["diagnose", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "finished"
    (run / "status.json").write_text(json.dumps({**status, "exit_codes": {"0": 0, "1": 1}}))
    assert diagnose_paths([run]).kind == "unknown"


def test_a_run_that_failed_after_a_restart_names_both(tmp_path):
    """The same logs with a final failure recorded: the failure is diagnosed as usual, and its summary says the run
    had been restarted first."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RESTARTED, run)
    st = json.loads((run / "status.json").read_text())
    st.update(state="failed", exit_code=137, first_failing_rank=1, failing_rank_exit_code=-9,
              exit_codes={"0": -15, "1": -9}, oom_kills=0)
    (run / "status.json").write_text(json.dumps(st))
    d = diagnose_paths([run])
    assert d.kind == "killed" and d.rank == 1
    assert d.summary.endswith("; after 1 elastic restart (restart 1: rank 1 killed by SIGKILL, resumed from step 4)")
    assert d.restarts == ("restart 1: rank 1 killed by SIGKILL, resumed from step 4",)
    assert "restarted" in KINDS


def test_the_peers_of_a_stopped_run_are_every_ranks_not_those_before_a_failure():
    """A run stopped from outside (Ctrl-C, `scaletrain stop`): no rank failed, so the peers line names every rank's
    peak as the run was stopped (it said "before a rank failed, the other ranks' peaks")."""
    from scaletrain.engine.doctor.peers import peer_report
    from scaletrain.engine.run.metrics import RankMemory, StepMetrics

    ranks = tuple(RankMemory(r, 2**30 * (r + 1), None, None) for r in range(2))
    last = StepMetrics(7, 10, 0.5, 1.0, 1e-4, 1000.0, 0.1, 2, 0.0, peak_memory=ranks)
    stopped = peer_report(None, None, last, stopped=True).line
    failed = peer_report(1, None, last).line
    assert stopped.startswith("at step 7, when the run was stopped, the ranks' peaks: rank 1") and "rank 0" in stopped
    assert failed.startswith("at step 7, before rank 1 failed, the other ranks' peaks: rank 0") and "rank 1" not in \
        failed.split(":", 1)[1]


def test_a_killed_ranks_last_line_is_said_as_its_last_line_not_as_the_cause(tmp_path):
    """A rank SIGKILLed from outside printed a DDP FutureWarning last: the evidence showed that line bare, first, as
    if DDP were the cause (walked: kill -9 of rank 1 of a CPU run)."""
    log = tmp_path / "rank-1.log"
    log.write_text("  warnings.warn(\n    model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)\n")
    d = diagnose([log], exit_codes={0: -15, 1: -9}, with_remedies=False)
    assert d.rank == 1 and d.kind in ("killed", "host_oom")
    assert d.evidence[0] == "rank 1's last line: model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)"
    assert "rank 1 exit code -9 (SIGKILL), no traceback" in d.evidence


@pytest.mark.parametrize("kind", ["interrupted", "killed"])
def test_a_stopped_or_killed_run_s_resume_is_a_remedy_the_monitor_applies(kind, plan_4090x8):
    """The monitor's `a` on "resume from the last checkpoint" said "a manual step; scaletrain cannot apply it": it
    is the same plan relaunched from its newest checkpoint (no change), which a relaunch does."""
    from scaletrain.engine.doctor.fixes import remedies_for
    from scaletrain.engine.doctor.summary import Diagnosis

    diag = Diagnosis(kind=kind, rank=1 if kind == "killed" else None, gpu=None, summary="", evidence=())
    (resume,) = remedies_for(diag, PlanDocument(plan_4090x8), None, None)[0]
    assert resume.applicable and resume.changes == {} and "--resume" in resume.title


def test_diagnose_of_a_run_directory_prints_the_command_that_applies_each_remedy(tmp_path, capsys):
    """Over SSH the monitor's `a` is out of reach: each remedy the relaunch can apply comes with its command,
    `scaletrain launch RUN --set …` (--resume where the change keeps the checkpoint); a manual step (more GPUs) has
    none, nor do logs given without their run directory. The printed command applies the remedy as printed (here the
    launch itself then stops: this machine has no RTX 4090)."""
    import shlex

    run = tmp_path / "run"
    assert main(["--preset", "4090x8", "--headless", "--dry-run", "--run-dir", str(run)]) == 0
    (run / "logs" / "rank-3.log").write_text((LOGS / "torch_current_oom_4090x8_r3.log").read_text())
    (run / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1, "first_failing_rank": 3,
                                                 "exit_codes": {"0": -15, "1": -15, "2": -15, "3": 1}}))
    d = diagnose_paths([run])
    assert d.kind == "cuda_oom" and d.remedies
    capsys.readouterr()
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    applies = [ln.strip().removeprefix("apply: ") for ln in out.splitlines() if ln.strip().startswith("apply: ")]
    wanted = [r for r in d.remedies if r.applicable and not any(k.startswith("env.") for k in r.changes)]
    assert len(applies) == len(wanted) < len(d.remedies)                 # the 16-GPU remedy is manual
    split = next(a for a in applies if "--set micro_batch=1" in a)
    assert split == f"scaletrain launch {run} --set micro_batch=1 --set grad_accum=16 --resume"
    assert main(["diagnose", str(run), "--json"]) == 0
    as_json = [r["apply"] for r in json.loads(capsys.readouterr().out)["remedies"]]
    assert [a for a in as_json if a] == applies and None in as_json          # the same commands; null for manual
    assert main(shlex.split(split)[1:]) == 2
    said = capsys.readouterr()
    assert said.out.startswith("applied micro_batch=1, grad_accum=16; starting from step 0") and "GPUs" in said.err
    batch = json.loads((run / "plan.json").read_text())["batch"]
    assert (batch["micro_batch"], batch["grad_accum"]) == (1, 16)
    assert main(["diagnose", str(run / "logs" / "rank-3.log")]) == 0
    assert "apply:" not in capsys.readouterr().out

"""The bundled trainer for real on this CPU host: JSONL data, then 2-rank DDP and DeepSpeed ZeRO-3 runs.

The multi-process tests write their run directories with the config writers (engine/run/writers.py), launch them through
engine.launch.launcher (accelerate launch → torchrun → 2 gloo ranks) and read back what the trainer wrote.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from pathlib import Path

import pytest

from scaletrain.trainer import data as D
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.request.options import TrainOptions

RUN_LIMIT_SECONDS = 240          # one small run; the first DeepSpeed run on a machine JIT-builds a comm op (~1 min)

WORDS = "the quick brown fox jumps over a lazy dog while seven small cats watch from the warm red roof".split()


def write_dataset(path: Path, n: int = 300, seed: int = 0) -> Path:
    """All three record shapes, short repetitive sentences a tiny model learns fast."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
            rec = ({"text": s} if i % 3 == 0 else {"prompt": "repeat: " + s[:24], "response": s} if i % 3 == 1
                   else {"messages": [{"role": "user", "content": "say it"}, {"role": "assistant", "content": s}]})
            f.write(json.dumps(rec) + "\n")
    return path


def make_run(tmp_path: Path, strategy: str, *, micro: int = 2, accum: int = 2, seq_len: int = 64,
             name: str = "run", loss: str = "standard", **train: object) -> RunDir:
    """A 2-process CPU run directory of scaletrain/tiny-qwen2 written by the config writers."""
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.run.writers import write_run_dir

    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", precision="fp32", strategy=strategy,
                      micro_batch=micro, grad_accum=accum, grad_ckpt=False, offload="none", seq_len=seq_len,
                      loss=loss)
    return write_run_dir(make_plan(req), req, TrainOptions(**train), tmp_path / name)


def deadline_tick(limit_s: float = RUN_LIMIT_SECONDS):
    """on_tick for launch(): a hung run fails the test (the launcher then stops every process)."""
    end = time.monotonic() + limit_s

    def tick() -> None:
        if time.monotonic() > end:
            raise TimeoutError(f"run did not finish within {limit_s} s")
    return tick


def assert_trained(run: RunDir, total: int) -> list:
    series = read_metrics(run.metrics)
    assert [r.step for r in series] == list(range(1, total + 1))
    assert all(r.total_steps == total and r.world_size == 2 for r in series)
    first = sum(r.loss for r in series[:3]) / 3
    last = sum(r.loss for r in series[-3:]) / 3
    assert last < first - 0.5, f"loss did not fall: {first:.3f} → {last:.3f}"
    assert all(r.tokens > 0 and r.tokens_per_second > 0 and r.step_seconds > 0 for r in series)
    for r in series:       # CPU: no allocator numbers, each rank's own peak RSS
        assert [m.rank for m in r.peak_memory] == [0, 1]
        assert all(m.allocated_bytes is None and m.reserved_bytes is None and m.host_rss_bytes > 0
                   for m in r.peak_memory)
    return series


def assert_checkpoint_size(run: RunDir, step: int) -> None:
    """The plan's disk model (engine/run/disk.py) against the checkpoint the trainer wrote: never under, and within
    15 % (the tiny models' fixed files dominate; the tensors are counted exactly)."""
    from scaletrain.engine.run.disk import checkpoint_bytes
    from scaletrain.engine.run.plan_document import read_plan_document

    ck = run.checkpoints / f"step-{step}"
    actual = sum(p.stat().st_size for p in ck.rglob("*") if p.is_file())
    predicted = checkpoint_bytes(read_plan_document(run.plan).replan()[1].setup)
    assert actual <= predicted <= 1.15 * actual, (actual, predicted)


FSDP_LINE = re.compile(r"strategy fsdp: MULTI_CPU, FSDP2 fully_shard: (\d+) units \((\d+) decoder blocks \+ root\), "
                       r"(\d+) of (\d+) parameters DTensor shards \(S\(0\)\)")


def assert_fsdp_sharded(run: RunDir, step: int, world: int = 2) -> None:
    """The run trained under FSDP2 for real: rank 0's log names the fully_shard units (a decoder block each, then the
    root) with every parameter a DTensor shard; the checkpoint is DCP shards (one file per rank, every model weight
    and optimizer state in `world` chunks), not a whole model.safetensors."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    log = run.rank_log(0).read_text()
    m = FSDP_LINE.search(log)
    assert m and m[3] == m[4] and int(m[2]) >= 2 and int(m[1]) == int(m[2]) + 1, log[-3000:]
    assert "DistributedDataParallel" not in log
    ck = run.checkpoints / f"step-{step}"
    assert not list(ck.glob("model*.safetensors")) and not list(ck.glob("optimizer*"))
    assert sorted(p.name for p in (ck / "dcp").iterdir()) == [".metadata", *(f"__{r}_0.distcp" for r in range(world))]
    meta = FileSystemReader(str(ck / "dcp")).read_metadata()        # our own test's file: plain pickle is fine here
    tensors = {k: v for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    weights = [k for k in tensors if k.startswith("model.")]
    moments = [k for k in tensors if k.startswith("optim.state.") and k.endswith("exp_avg")]
    assert weights and moments
    assert all(len(tensors[k].chunks) == world for k in weights + moments), \
        {k: len(tensors[k].chunks) for k in weights + moments}


# ---- data (no torch) -------------------------------------------------------------------------------------------
def test_record_shapes_train_only_on_answers():
    tok = D.ByteTokenizer(1024)
    text = D.tokenize_record({"text": "hi"}, tok)
    assert text.input_ids == (3 + ord("h"), 3 + ord("i"), tok.eos_id) and text.labels == text.input_ids

    pr = D.tokenize_record({"prompt": "q", "response": "ab"}, tok)
    n_prompt = len(tok.encode("q\n"))
    assert pr.labels[:n_prompt] == (D.IGNORE_INDEX,) * n_prompt
    assert pr.labels[n_prompt:] == pr.input_ids[n_prompt:] and pr.labels[-1] == tok.eos_id

    chat = D.tokenize_record({"messages": [{"role": "user", "content": "u"},
                                           {"role": "assistant", "content": "a"}]}, tok)
    trained = tok.decode(i for i, lab in zip(chat.input_ids, chat.labels) if lab != D.IGNORE_INDEX)
    assert trained == "<|assistant|>\na\n"
    assert tok.decode(chat.input_ids) == "<|user|>\nu\n<|assistant|>\na\n"


def test_byte_tokenizer_stays_inside_small_vocabularies():
    tok = D.ByteTokenizer(64)
    ids = tok.encode("ÿ héllo ✓")
    assert ids and all(tok.SPECIALS <= i < 64 for i in ids)
    with pytest.raises(ScaletrainError, match="vocabulary"):
        D.ByteTokenizer(3)


def test_packing_and_padding_make_exact_blocks():
    tok = D.ByteTokenizer(512)
    samples = [D.tokenize_record({"text": "x" * n}, tok) for n in (5, 9, 30)]
    packed = D.build_blocks(samples, 8, packing=True, pad_id=tok.pad_id)
    total = sum(len(s.input_ids) for s in samples)
    assert len(packed) == total // 8 and all(len(r) == 8 for r in packed.input_ids)
    assert all(sum(m) == 8 for m in packed.attention_mask)

    padded = D.build_blocks(samples, 8, packing=False, pad_id=tok.pad_id)
    assert len(padded) == 3
    assert padded.attention_mask[0] == (1,) * 6 + (0,) * 2          # 5 bytes + eos, padded to 8
    assert padded.labels[0][6:] == (D.IGNORE_INDEX,) * 2 and padded.input_ids[0][6:] == (tok.pad_id,) * 2
    assert padded.tokens(2) == 8                                        # truncated


def test_shards_are_disjoint_equal_and_reshuffled_per_epoch():
    a, b = D.shard_order(101, 0, 7, 0, 2), D.shard_order(101, 0, 7, 1, 2)
    assert len(a) == len(b) == 50 and not set(a) & set(b)
    assert D.shard_order(101, 1, 7, 0, 2) != a
    assert D.shard_order(101, 0, 7, 0, 2) == a


@pytest.mark.parametrize("line, needle", [
    ("{not json", ":1: not valid JSON"),
    ('{"title": "x"}', "no usable fields (found title)"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0] must be"),
    ('["text"]', "a JSON object is needed"),
])
def test_bad_dataset_is_one_clear_error(tmp_path, line, needle):
    p = tmp_path / "d.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(ScaletrainError, match=None) as e:
        D.read_jsonl(p)
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ScaletrainError, match="does not exist"):
        D.read_jsonl(tmp_path / "missing.jsonl")


def test_too_little_data_for_one_step_says_what_to_change(tmp_path):
    from scaletrain.trainer.train import make_schedule
    from scaletrain.trainer.config import read_run_config

    run = make_run(tmp_path, "ddp", micro=4, accum=4, dataset=str(write_dataset(tmp_path / "d.jsonl", n=3)))
    cfg = read_run_config(run.path)
    with pytest.raises(ScaletrainError, match=r"needs micro batch 4 × accumulation 4 × 2 processes = 32"):
        make_schedule(cfg, 5, 2)
    assert make_schedule(cfg, 64, 2).steps_per_epoch == 2


# ---- real 2-rank runs ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_two_ranks_loss_falls_with_checkpoints_and_live_progress(ddp_run):
    """`scaletrain launch`'s path: progress.stream_run → launcher → accelerate/torchrun → trainer, bundled demo data
    (the shared `ddp_run`, tests/conftest.py)."""
    run, code, text = ddp_run.run, ddp_run.exit_code, ddp_run.console
    assert code == 0, text + run.rank_log(0).read_text()
    series = assert_trained(run, 24)
    lrs = [r.lr for r in series]
    assert lrs[0] < lrs[2] and lrs[3] > lrs[-1]                 # warmup, then cosine decay
    assert {p.name for p in run.checkpoints.iterdir()} == {"step-10", "step-20", "step-24"}
    state = json.loads((run.checkpoints / "step-24" / "trainer_state.json").read_text())
    assert state["step"] == 24 and state["world_size"] == 2
    assert_checkpoint_size(run, 24)
    assert list((run.path / "tensorboard").glob("events.out.tfevents.*"))
    status = json.loads(run.status.read_text())
    assert status["state"] == "finished" and status["exit_code"] == 0 and set(status["rank_pids"]) == {"0", "1"}
    assert "demo.jsonl" in run.rank_log(0).read_text()          # no dataset given: the bundled demo data
    assert "24/24" in text and "finished" in text and f"loss {series[-1].loss:.4f}" in text
    # measured beside the plan's, measured ÷ planned: the engine's summary of this run's metrics
    from scaletrain.engine.run.metrics import summarize
    from scaletrain.engine.run.plan_document import read_plan_document

    doc = read_plan_document(run.plan)
    v = summarize(series, planned_step_seconds=doc.planned_step_seconds,
                  planned_tokens_per_second=doc.planned_tokens_per_second).versus
    assert f"{v.tokens_text()}, {v.step_text()} on 2 processes" in text


@pytest.mark.slow
def test_deepspeed_zero3_two_ranks_loss_falls(zero3_run):
    run = zero3_run.run
    log0 = run.rank_log(0).read_text()
    assert zero3_run.exit_code == 0, log0 + run.rank_log(1).read_text()
    assert_trained(run, 12)
    assert "DeepSpeed data-parallel over 2" in log0            # ZeRO-3 really partitions over both ranks
    for step in (6, 12):
        ck = run.checkpoints / f"step-{step}"
        assert (ck / "trainer_state.json").is_file()
        shards = sorted(p.name for p in (ck / "deepspeed").glob("*optim_states.pt"))
        assert len(shards) == 2, shards                        # one optimizer partition per rank
    assert_checkpoint_size(run, 12)


@pytest.mark.slow
def test_fsdp_two_ranks_train_sharded_with_dcp_checkpoints(fsdp_run):
    """--strategy fsdp on 2 gloo ranks is FSDP2 (torch's fully_shard, applied by the trainer), not DDP."""
    run = fsdp_run.run
    log0 = run.rank_log(0).read_text()
    assert fsdp_run.exit_code == 0, log0 + run.rank_log(1).read_text()
    assert "(full, fsdp, fp32) on 2 process(es)" in log0
    assert_trained(run, 12)
    for step in (6, 12):
        assert_fsdp_sharded(run, step)
    assert_checkpoint_size(run, 12)       # the DCP shards, their records and .metadata (engine/run/disk.py)


def test_a_run_that_is_not_its_plans_strategy_is_refused_in_one_line(tmp_path):
    """The trainer's check against what accelerate and the wrapper gave (distributed.check_distribution), with a real
    Accelerator in this one process (accelerate's NO) and an unwrapped model."""
    import torch
    from accelerate.state import AcceleratorState

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.distributed import check_distribution, make_accelerator

    cfgs = {s: read_run_config(make_run(tmp_path, s, name=s).path) for s in ("ddp", "fsdp", "zero3")}
    AcceleratorState._reset_state(True)
    try:
        acc = make_accelerator(cfgs["ddp"])
        model = torch.nn.Linear(4, 4)
        for strategy, needle in (("fsdp", "NO, the model in Linear (not sharded)"),
                                 ("zero3", "NO with the model in Linear"), ("ddp", "NO with the model in Linear")):
            with pytest.raises(ScaletrainError) as e:
                check_distribution(cfgs[strategy], acc, model, 2)
            msg = str(e.value)
            assert msg.startswith(f"the plan's strategy is {strategy} on 2 process(es), but this run got {needle}")
            assert "nothing was trained" in msg and "\n" not in msg and len(msg) <= 500
        assert check_distribution(cfgs["ddp"], acc, model, 1) == "strategy ddp: NO with the model in Linear"
    finally:
        AcceleratorState._reset_state(True)


@pytest.mark.long
def test_fsdp_without_a_process_group_and_an_edited_launch_config_are_refused_before_training(tmp_path, capsys):
    """`python -m scaletrain.trainer.train` on an FSDP run (no process group to shard over), and `scaletrain launch`
    of a run whose accelerate_config.yaml was edited to another distributed_type: one line, exit 2, no step."""
    import subprocess
    import sys

    run = make_run(tmp_path, "fsdp")
    r = subprocess.run([sys.executable, "-m", "scaletrain.trainer.train", "--run-dir", str(run.path)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("scaletrain: error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-2000:]
    assert "strategy is fsdp, but this process has no torch.distributed process group" in errors[0]
    assert not run.metrics.exists()
    yaml_text = run.accelerate_config.read_text()
    run.accelerate_config.write_text(yaml_text.replace("distributed_type: FSDP", "distributed_type: MULTI_GPU"))
    from scaletrain.tui.cli.main import main

    capsys.readouterr()
    assert main(["launch", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= 500, err
    assert "has distributed_type 'MULTI_GPU' but the plan's strategy fsdp on 2 process(es) needs 'FSDP'" in err
    assert not any(run.logs.iterdir()) and not run.status.exists()
    # TRL's trainers (reward/dpo/grpo) take accelerate's FSDP plugin, which a CPU host drops: refused before launch
    from scaletrain.engine.run.configs import check_strategy

    with pytest.raises(ScaletrainError, match="runs TRL's trainer, whose accelerate drops FSDP on a CPU host"):
        check_strategy(run.accelerate_config, "FSDP", "fsdp", 2, "dpo", True)
    check_strategy(run.accelerate_config, "FSDP", "fsdp", 2, "dpo", False)      # GPUs: accelerate's FSDP plugin


@pytest.mark.slow
def test_chunked_loss_two_ranks_loss_falls(options_run):
    """--loss chunked for real: tiny-qwen2 (tied embeddings, full fine-tuning) on 2 gloo ranks under DDP (the shared
    `options_run`, tests/conftest.py; ZeRO-2 passes too, DeepSpeed's 16-bit-free fp32 run, ~100 s)."""
    run = options_run.run
    log0 = run.rank_log(0).read_text()
    assert options_run.exit_code == 0, log0 + run.rank_log(1).read_text()
    assert "loss chunked" in log0 and "(full, ddp, fp32) on 2 process(es)" in log0
    assert_trained(run, 12)


@pytest.mark.slow
def test_deepspeed_cpu_run_survives_a_stale_extension_lock(zero3_run):
    """A rank killed while torch's FileBaton held DeepSpeed's CPU-op build lock leaves the lock file behind; the
    next run must not wait on it for ever (trainer/distributed.py load_deepspeed_cpu_comm_op). The shared
    `zero3_run` starts over such a lock (tests/conftest.py)."""
    run, baton = zero3_run.run, zero3_run.baton
    log = run.rank_log(0).read_text() + run.rank_log(1).read_text()
    assert zero3_run.exit_code == 0, log
    assert "removed" in log and str(baton) in log and not baton.exists()
    assert [r.step for r in read_metrics(run.metrics)] == list(range(1, 13))


# ---- a local pretrained model with its own tokenizer and chat template -------------------------------------------
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"


def save_local_model(path: Path) -> Path:
    """A tiny Qwen2 and a byte-level BPE tokenizer with a chat template, saved the way a user's folder looks."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 10 + ["user assistant say it repeat"], vocab_size=300,
                            special_tokens=["<pad>", "<s>", "</s>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    conf = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok),
                                tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                                eos_token_id=tok.eos_token_id)
    AutoModelForCausalLM.from_config(conf).save_pretrained(path)
    return path


@pytest.mark.slow
def test_local_model_lora_with_chat_template_on_one_process(tmp_path):
    """model_source = a local folder (offline from_pretrained + its tokenizer), LoRA with gradient checkpointing,
    one process (accelerate's simple launcher)."""
    from scaletrain.engine.launch.launcher import launch
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.trainer.model import make_tokenizer
    from scaletrain.trainer.config import read_run_config
    from scaletrain.engine.run.writers import write_run_dir

    model_dir = save_local_model(tmp_path / "my-model")
    data = write_dataset(tmp_path / "data.jsonl", n=120)
    req = PlanRequest(model=str(model_dir), gpus="1xCPU", precision="fp32", strategy="ddp", method="lora",
                      lora_rank=4, micro_batch=2, grad_accum=1, grad_ckpt=True, offload="none", seq_len=32)
    run = write_run_dir(make_plan(req), req, TrainOptions(model_source=str(model_dir), dataset=str(data), lr=1e-2,
                                                          max_steps=6, checkpoint_every=3), tmp_path / "run")

    tok = make_tokenizer(read_run_config(run.path))
    assert isinstance(tok, D.HFTokenizer) and tok.has_chat_template
    rec = {"messages": [{"role": "user", "content": "say it"}, {"role": "assistant", "content": "red roof"}]}
    sample = D.tokenize_record(rec, tok)
    trained = [i for i, lab in zip(sample.input_ids, sample.labels) if lab != D.IGNORE_INDEX]
    assert tok.tok.decode(trained) == "<|assistant|>\nred roof\n</s>"      # the template's assistant turn + eos

    res = launch(run.path, on_tick=deadline_tick())
    log = run.rank_log(0).read_text()
    assert res.exit_code == 0, log
    series = read_metrics(run.metrics)
    assert [r.step for r in series] == list(range(1, 7)) and all(r.world_size == 1 for r in series)
    assert all(r.loss == r.loss and r.loss > 0 for r in series)                # finite
    assert "(lora, ddp, fp32) on 1 process(es)" in log
    assert (run.checkpoints / "step-6" / "trainer_state.json").is_file()
    assert_checkpoint_size(run, 6)


def test_a_live_builders_baton_is_waited_for_and_a_dead_ones_removed(tmp_path, capsys):
    """torch's FileBaton is not scaletrain's: a process outside it (a plain DeepSpeed run sharing the extensions
    folder) may hold it live. A young baton is waited for and left to its holder; an old one is a dead process's."""
    import threading

    from scaletrain.trainer.distributed import clear_stale_baton

    baton = tmp_path / "lock"
    baton.write_text("")
    threading.Timer(0.3, baton.unlink).start()           # the live holder finishes and removes its own baton
    assert clear_stale_baton(baton, stale_after_s=60, poll_s=0.05) is False
    assert "waiting for" in capsys.readouterr().err
    baton.write_text("")
    old = baton.stat().st_mtime - 3600
    os.utime(baton, (old, old))
    assert clear_stale_baton(baton, stale_after_s=60) is True and not baton.exists()
    assert "removed" in capsys.readouterr().err
    assert clear_stale_baton(baton) is False               # none: nothing to wait for

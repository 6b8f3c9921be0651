"""Issue 22 (export): what a run leaves behind loads with transformers and peft on this CPU.

Real 2-rank runs of scaletrain/tiny-qwen2 (random init, fp32; the DDP, ZeRO-3 and FSDP ones are the shared runs of
tests/conftest.py): DDP full fine-tuning exports its last checkpoint at the
end and checks it against the trained model's logits (0 difference in fp32), and the folder loads with
AutoModelForCausalLM.from_pretrained and generates; a ZeRO-3 run's earlier checkpoint exports through DeepSpeed's
own consolidation; an FSDP run's DCP shards export at the end and on demand; a LoRA run (DDP and FSDP) leaves a PEFT
adapter and a merged model equal to base + adapter.
"""

from __future__ import annotations

import json
import re

import pytest

from scaletrain.tui.cli.main import main
from test_train_cpu import deadline_tick, make_run


def _launch(run):
    from scaletrain.engine.launch.launcher import launch

    res = launch(run.path, on_tick=deadline_tick())
    assert res.exit_code == 0, run.rank_log(0).read_text()[-3000:]


@pytest.mark.slow
def test_ddp_full_run_exports_a_model_that_loads_generates_and_matches_the_trained_logits(ddp_run):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run = ddp_run.ok()              # the shared 24-step DDP run (tests/conftest.py), its last step exported
    out = run.path / "export" / "step-24"
    manifest = json.loads((out / "export.json").read_text())
    assert (manifest["step"], manifest["kind"], manifest["dtype"]) == (24, "model", "fp32")
    assert manifest["checked"]["max_abs_logit_diff"]["model"] <= 1e-5
    probe = load_file(str(out / "probe.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    assert torch.allclose(logits, probe["logits"], atol=1e-5)
    gen = model.generate(probe["input_ids"][:1, :8], max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, 12)
    assert "exported step 24" in run.rank_log(0).read_text()


@pytest.mark.slow
def test_zero3_exports_its_last_and_an_earlier_checkpoint_through_deepspeed(zero3_run, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.export import load_trained

    run = zero3_run.copy(tmp_path / "run")      # the shared 12-step ZeRO-3 run; step 6 is exported into a copy
    # the end of the run: the last checkpoint exported and checked against the trained (ZeRO-3 gathered) model
    checked = json.loads((run.path / "export" / "step-12" / "export.json").read_text())["checked"]
    assert checked["max_abs_logit_diff"]["model"] <= 1e-5
    capsys.readouterr()
    assert main(["export", str(run.path), "--step", "6", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["step"] == 6 and e["kind"] == "model"
    model = AutoModelForCausalLM.from_pretrained(e["path"]).eval()
    ref, _ = load_trained(read_run_config(run.path), run.checkpoints / "step-6")
    later, _ = load_trained(read_run_config(run.path), run.checkpoints / "step-12")
    ids = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (model, ref, later))
    assert torch.equal(a, b) and not torch.allclose(a, c)       # step 6's weights, not the last step's


@pytest.mark.slow
def test_fsdp_exports_its_dcp_shards_at_the_end_and_an_earlier_step_on_demand(fsdp_run, tmp_path, capsys):
    """FSDP2 checkpoints are DCP shards; the end-of-run export reads them into whole tensors (rank 0, inside the run)
    and matches the trained (sharded) model's logits exactly; `scaletrain export --step 6` reads the same way in
    one plain process, and gives step 6's weights."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from scaletrain.trainer.config import read_run_config
    from scaletrain.trainer.export import load_trained
    from test_train_cpu import assert_fsdp_sharded

    run = fsdp_run.copy(tmp_path / "run")       # the shared 12-step FSDP run; step 6 is exported into a copy
    assert_fsdp_sharded(run, 12)
    checked = json.loads((run.path / "export" / "step-12" / "export.json").read_text())["checked"]
    assert checked["max_abs_logit_diff"]["model"] <= 1e-5
    capsys.readouterr()
    assert main(["export", str(run.path), "--step", "6", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["step"] == 6 and e["kind"] == "model"
    model = AutoModelForCausalLM.from_pretrained(e["path"]).eval()
    # every weight the export wrote is the checkpoint's, gathered from both ranks' chunks
    meta = FileSystemReader(str(run.checkpoints / "step-6" / "dcp")).read_metadata()
    sharded = {k.removeprefix("model.") for k, v in meta.state_dict_metadata.items()
               if k.startswith("model.") and len(getattr(v, "chunks", ())) == 2}
    assert set(dict(model.named_parameters())) <= sharded
    ref, _ = load_trained(read_run_config(run.path), run.checkpoints / "step-6")
    later, _ = load_trained(read_run_config(run.path), run.checkpoints / "step-12")
    ids = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        a, b, c = (m(input_ids=ids).logits for m in (model, ref, later))
    assert torch.equal(a, b) and not torch.allclose(a, c)       # step 6's weights, not the last step's


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2"])
def test_lora_run_leaves_an_adapter_and_a_merged_model_equal_to_base_plus_adapter(tmp_path, strategy):
    """DDP from random init: the export reads the whole checkpoint (a random base is not built again). FSDP's DCP
    shards and DeepSpeed's partitions from a local model folder (real weights): it reads the trained weights only,
    the frozen base built again from the folder, and the adapter and merged exports still give the trained model's
    logits."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.options import TrainOptions
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.run.writers import write_run_dir
    from test_train_cpu import save_local_model, write_dataset

    real = strategy != "ddp"
    model = str(save_local_model(tmp_path / "my-model")) if real else "scaletrain/tiny-qwen2"
    req = PlanRequest(model=model, gpus="2xCPU", precision="fp32", strategy=strategy,
                      method="lora", lora_rank=4, micro_batch=2, grad_accum=1, grad_ckpt=False, offload="none",
                      seq_len=64 if not real else 32)
    train = TrainOptions(lr=1e-2, max_steps=4, checkpoint_every=4, model_source=model if real else None,
                         dataset=str(write_dataset(tmp_path / "data.jsonl", n=120)) if real else None)
    run = write_run_dir(make_plan(req), req, train, tmp_path / "run")
    _launch(run)
    if strategy == "fsdp":       # the frozen base and the adapters sharded alike; only the adapters train
        from test_train_cpu import FSDP_LINE, assert_checkpoint_size, assert_fsdp_sharded

        assert_fsdp_sharded(run, 4)
        assert_checkpoint_size(run, 4)    # the LoRA run's DCP shards against the plan's disk model
        header = next(line for line in run.rank_log(0).read_text().splitlines() if "(lora, fsdp, fp32)" in line)
        trainable, frozen = (int(re.search(rf"{k} float32 ([\d,]+)", header)[1].replace(",", ""))
                             for k in ("trainable", "frozen"))
        assert 0 < trainable < frozen / 10, header
        assert FSDP_LINE.search(run.rank_log(0).read_text())
    out = run.path / "export" / "step-4"
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "adapter" / "adapter_model.safetensors").is_file()
    manifest = json.loads((out / "export.json").read_text())
    diffs = manifest["checked"]["max_abs_logit_diff"]
    assert diffs["adapter"] <= 1e-5 and diffs["merged"] <= 1e-4          # base + adapter, and merged, = trained
    lora_tensors = 2 * 7 * 2                 # A and B of the 7 block linears LoRA adapts, in each of the 2 layers
    assert (manifest["checkpoint_tensors_read"] == lora_tensors) == real, manifest   # real weights: adapters only
    assert manifest["checkpoint_tensors_read"] >= lora_tensors
    probe = load_file(str(out / "probe.safetensors"))
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged")).eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=probe["input_ids"]).logits, probe["logits"], atol=1e-4)


@pytest.mark.slow
def test_the_demo_names_its_export_and_its_model_generates_text_with_transformers_alone(demo_run, tmp_path, capsys):
    """Issue 30, item 7: the demo (`make demo`: the cpu-tiny preset, headless; a few steps here: the shared
    `demo_run`, tests/conftest.py) names its export on its finish line and in `monitor --headless`; a second export
    of that step says where it is; the export holds the byte tokenizer as a transformers tokenizer, so
    AutoTokenizer + AutoModelForCausalLM generate text, and so does `scaletrain chat RUN --prompt hello
    --max-new-tokens 8`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scaletrain.trainer.data import ByteTokenizer

    run_dir = demo_run.ok().path
    export = run_dir / "export" / "step-12"
    finish = demo_run.console
    assert f"export (step 12): {export}" in finish and "max |logit − trained| model 0" in finish

    capsys.readouterr()
    assert main(["monitor", str(run_dir), "--headless"]) == 0
    assert f"export (step 12): {export}" in capsys.readouterr().out
    assert main(["export", str(run_dir)]) == 0                           # already exported: where it is, no error
    said = capsys.readouterr()
    assert f"step 12 is already exported: {export}" in said.out and said.err == ""

    tok = AutoTokenizer.from_pretrained(str(export), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(export), local_files_only=True).eval()
    byte = ByteTokenizer(model.config.vocab_size)
    for text in ("hello", "Grüße, 世界!\n\tok <s>"):
        assert tok(text)["input_ids"] == byte.encode(text)                # the ids the run trained on
        assert tok.decode(byte.encode(text)) == text
    ids = tok("hello", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    assert 1 <= len(new) <= 8
    text = tok.decode(new, skip_special_tokens=True)
    assert text == byte.decode(new) and text.strip()

    assert main(["chat", str(run_dir), "--prompt", "hello", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == text + "\n"                       # the same greedy text, through the CLI
    assert main(["chat", str(run_dir), "--prompt", "hello", "--max-new-tokens", "0"]) == 2
    assert main(["chat", str(tmp_path), "--prompt", "hello"]) == 2

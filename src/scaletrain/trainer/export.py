"""What a run leaves behind (issue 22): a checkpoint turned into a folder transformers and peft load.

`scaletrain export RUN [--step N] [--merge] [--out DIR] [--dtype D]`, and the trainer at the end of every run
(rank 0, after the last checkpoint). The weights are consolidated with the libraries' own code: accelerate's
checkpoint holds the whole state dict (`model.safetensors`, written by `Accelerator.save_state`); an FSDP
checkpoint's DCP shards are read into whole tensors by torch.distributed.checkpoint (trainer/fsdp.py); a DeepSpeed
checkpoint (ZeRO-1/2/3, every rank's partition) is gathered by DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint`
on the CPU, in one process. They are loaded into the model the run trained, built as the trainer builds it (the same
starting weights and seed, so frozen weights a checkpoint leaves out are the ones the run had), then written:

  full fine-tuning   EXPORT/        config.json, generation_config.json, model*.safetensors in the training dtype
                                    (or --dtype), the tokenizer and its chat template when the run had one
  LoRA / QLoRA       EXPORT/adapter a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)
                     EXPORT/merged  with --merge: base + adapter merged (QLoRA: into a 16-bit copy of the base, as
                                    peft recommends; the base is rebuilt unquantized)

The folder appears whole or not at all (written beside, then renamed) and export.json records the step, the
checkpoint, the dtype, and what the export checked: every trained weight came from the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write, io_problem, short_path
from scaletrain.engine.run.layout import RunDir, checkpoint_step
from scaletrain.trainer.checkpoints import DS_CHECKPOINT_TAG, read_state
from scaletrain.engine.vocabulary import Precision
from scaletrain.trainer.config import RunConfig, read_run_config

EXPORT_MANIFEST = "export.json"
DTYPES = Precision.values()              # bf16, fp16, fp32: the exported weights' dtype, named as the plan names it


@dataclass(frozen=True)
class Exported:
    path: Path
    step: int
    kind: str                     # "model" (full fine-tuning) or "adapter" (LoRA/QLoRA)
    dtype: str
    merged: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "step": self.step, "kind": self.kind, "dtype": self.dtype,
                "merged": str(self.merged) if self.merged else None}


def pick_checkpoint(run: RunDir, step: int | None) -> Path:
    complete = run.complete_checkpoints()
    if not complete:
        raise ScaletrainError(f"{run.path} has no complete checkpoint to export (checkpoints/step-N/ with "
                              "trainer_state.json); train first, or keep save_checkpoints on")
    if step is None:
        return complete[0]
    for d in complete:
        if checkpoint_step(d) == step:
            return d
    have = ", ".join(str(checkpoint_step(d)) for d in complete)
    raise ScaletrainError(f"no complete checkpoint at step {step} in {run.checkpoints}; steps with one: {have}")


def state_dict(ck: Path, cfg: RunConfig, wanted: frozenset[str] | None = None) -> dict[str, Any]:
    """The checkpoint's weights by parameter name, consolidated by the library that wrote them; with `wanted`, only
    those names are read (a LoRA export's trained weights, engine/run/disk.py reads_trained_only)."""
    if (ck / DS_CHECKPOINT_TAG).is_dir():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        from scaletrain.trainer.checkpoints import weights_only_loads

        with weights_only_loads():
            sd = dict(get_fp32_state_dict_from_zero_checkpoint(str(ck), tag=DS_CHECKPOINT_TAG,
                                                               exclude_frozen_parameters=wanted is not None))
        return sd if wanted is None else {k: v for k, v in sd.items() if k in wanted}
    from scaletrain.trainer.fsdp import DCP_DIR, full_model_state, is_sharded_checkpoint

    if is_sharded_checkpoint(ck):
        return full_model_state(ck, wanted)     # FSDP: every rank's DCP shards read into whole tensors
    files = sorted(ck.glob("model*.safetensors"))
    if not files:
        raise ScaletrainError(f"{ck} holds no model*.safetensors (an accelerate checkpoint), no FSDP {DCP_DIR}/ "
                              f"shards and no DeepSpeed {DS_CHECKPOINT_TAG}/ folder: nothing to export")
    from safetensors import safe_open

    out: dict[str, Any] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                if wanted is None or k in wanted:
                    out[k] = st.get_tensor(k)
    return out


def _base_config(cfg: RunConfig) -> RunConfig:
    """The run's model as export builds it: on this CPU, no checkpointing; a quantized base rebuilt in 16 bits
    (the adapter trained on NF4/int8 weights merges into their 16-bit originals)."""
    from scaletrain.engine.vocabulary import Strategy

    cfg = replace(cfg, grad_ckpt=False, strategy=Strategy.DDP)        # built whole, in this one process
    if cfg.quantized_base:
        from scaletrain.engine.vocabulary import Method
        cfg = replace(cfg, method=Method.LORA, base_bits=16)
    return cfg


def load_trained(cfg: RunConfig, ck: Path) -> tuple[Any, int]:
    """The model the run trained, with the checkpoint's weights (every trained weight must come from it), and how
    many tensors were read from the checkpoint: a LoRA run from real weights reads its trained ones only, its frozen
    base built again from those weights (one copy of the model in host RAM, not two)."""
    import torch

    from scaletrain.trainer.model import build_model

    try:       # the trainer's process after a ZeRO-3 run: transformers must not build under zero.Init (a collective)
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        unset_hf_deepspeed_config()
    except ImportError:
        pass
    from scaletrain.engine.run.disk import reads_trained_only

    model = build_model(_base_config(cfg), torch.device("cpu"))
    params = dict(model.named_parameters())
    trained = {n for n, p in params.items() if p.requires_grad}
    only = reads_trained_only(cfg, cfg.train)
    sd = state_dict(ck, cfg, frozenset(trained) if only else None)
    sd = {k: v.to(params[k].dtype) if k in params else v for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    lost = sorted(trained & set(missing))
    if lost or unexpected:
        raise ScaletrainError(f"{ck.name} does not match the run's model: "
                              + (f"trained weights missing ({', '.join(lost[:3])}…)" if lost else
                                 f"unexpected weights ({', '.join(sorted(unexpected)[:3])}…)"))
    model.tie_weights() if hasattr(model, "tie_weights") else None
    return model.eval(), len(sd)


def export_run(run_dir: str | Path, step: int | None = None, out: str | Path | None = None, merge: bool = False,
               dtype: str | None = None) -> Exported:
    """Export checkpoint `step` (newest when None) of the run to `out` (default RUN/export/step-N)."""
    cfg = read_run_config(run_dir)
    run = cfg.run
    ck = pick_checkpoint(run, step)
    read_state(ck)                                   # a damaged checkpoint is named before anything is loaded
    n = checkpoint_step(ck)
    assert n is not None
    dtype = dtype or str(cfg.precision)
    if dtype not in DTYPES:
        raise ScaletrainError(f"--dtype {dtype!r} is not accepted; use one of: {', '.join(DTYPES)}")
    adapter = cfg.method.is_adapter
    if merge and not adapter:
        raise ScaletrainError("--merge merges a LoRA adapter into its base; this run trained every weight "
                              "(its export is the whole model already)")
    target = _target(out, run.export_dir(n))
    partial = target.with_name(f".{target.name}.partial")
    try:                                             # where it goes is checked before the model is loaded
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    except (OSError, RuntimeError) as e:
        raise ScaletrainError(io_problem(e, target, "cannot write the export at") or str(e)) from None
    try:
        model, read = load_trained(cfg, ck)
        merged = _write(model, cfg, partial, adapter, merge, dtype)
        atomic_write(partial / EXPORT_MANIFEST, json.dumps(
            {"step": n, "checkpoint": str(ck), "kind": "adapter" if adapter else "model", "dtype": dtype,
             "method": str(cfg.method), "strategy": str(cfg.strategy), "model": cfg.model_id,
             "base_weights": cfg.train.model_source, "merged": merged, "checkpoint_tensors_read": read},
            indent=2) + "\n", backup=False)
        if target.exists():
            target.rmdir()
        partial.rename(target)
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        problem = io_problem(e, target, "cannot write the export at") if isinstance(e, Exception) else None
        if problem is not None and not isinstance(e, ScaletrainError):      # a full disk, SafetensorError's too
            raise ScaletrainError(problem) from None
        raise
    return Exported(target, n, "adapter" if adapter else "model", dtype,
                    target / "merged" if merge else None)


def _target(out: str | Path | None, default: Path) -> Path:
    """The export's folder: --out (made absolute) or RUN/export/step-N; it must be new or empty, and its path
    usable (a symlink loop, a name too long, a file in the way: one line)."""
    try:
        target = Path(out).expanduser().resolve() if out is not None else default
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ScaletrainError(f"{short_path(target)} exists and is not an empty folder; give --out a new folder, "
                                  "or remove it")
    except (OSError, RuntimeError) as e:
        raise ScaletrainError(io_problem(e, out if out is not None else default, "cannot write the export at")
                              or str(e)) from None
    return target


def _write(model: Any, cfg: RunConfig, folder: Path, adapter: bool, merge: bool, dtype: str) -> str | None:
    import torch

    torch_dtype = getattr(torch, Precision(dtype).torch_dtype)
    tok = _tokenizer(cfg)
    if not adapter:
        model.to(torch_dtype).save_pretrained(str(folder), safe_serialization=True)
        if tok is not None:
            tok.save_pretrained(str(folder))
        return None
    model.save_pretrained(str(folder / "adapter"), safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(str(folder / "adapter"))
    if not merge:
        return None
    merged = model.merge_and_unload().to(torch_dtype)
    merged.save_pretrained(str(folder / "merged"), safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(str(folder / "merged"))
    return "merged"


def _tokenizer(cfg: RunConfig) -> Any:
    """The run's tokenizer: its transformers one, or a random-init run's byte tokenizer as a transformers
    tokenizer with the same ids (byte_tokenizer.py; None where the vocabulary folds bytes)."""
    from scaletrain.trainer.model import make_tokenizer

    tok = make_tokenizer(cfg)
    if cfg.train.model_source == "random-init":
        from scaletrain.trainer.byte_tokenizer import byte_tokenizer_fast

        return byte_tokenizer_fast(tok.vocab_size)
    return getattr(tok, "tok", None)


# ---- the end of a run: export the last checkpoint, checked against the trained model ----------------------------
PROBE_FILE = "probe.safetensors"        # the probe batch and the trained model's logits on it (in the export)
PROBE_TOKENS = 128                      # one sequence's first tokens: 128 × V fp32 logits (78 MB at V = 152k)


def probe_logits(model: Any, input_ids: Any) -> Any:
    """The live model's logits on the probe batch (every rank calls it: a ZeRO-3 forward gathers the weights)."""
    import torch

    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float().cpu()
    model.train(was)
    return logits


def exported_logits(e: Exported, cfg: RunConfig, ck: Path, input_ids: Any) -> dict[str, Any]:
    """The export read back from disk as a user loads it, on the probe batch: the model folder (full), the base
    with the adapter folder and the merged folder (LoRA)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    with torch.no_grad():
        if e.kind == "model":
            m = AutoModelForCausalLM.from_pretrained(str(e.path), dtype=torch.float32, trust_remote_code=False).eval()
            out["model"] = m(input_ids=input_ids).logits.float()
            return out
        from peft import PeftModel

        base = load_trained(cfg, ck)[0].unload()             # the run's base, adapters removed unmerged
        out["adapter"] = PeftModel.from_pretrained(base, str(e.path / "adapter")).eval()(
            input_ids=input_ids).logits.float()
        if e.merged is not None:
            m = AutoModelForCausalLM.from_pretrained(str(e.merged), dtype=torch.float32, trust_remote_code=False).eval()
            out["merged"] = m(input_ids=input_ids).logits.float()
    return out


def export_and_check(run_dir: Path, step: int, input_ids: Any, trained_logits: Any, merge: bool) -> dict[str, Any]:
    """Export checkpoint `step`, read it back, and record in export.json how far its logits are from the trained
    model's on the probe batch (0 for an fp32 export of an fp32 run; the dtype's rounding otherwise)."""
    from safetensors.torch import save_file

    e = export_run(run_dir, step=step, merge=merge)
    cfg = read_run_config(run_dir)
    ck = pick_checkpoint(cfg.run, step)
    diffs = {k: float((v - trained_logits).abs().max()) for k, v in exported_logits(e, cfg, ck, input_ids).items()}
    save_file({"input_ids": input_ids.contiguous(), "logits": trained_logits.contiguous()}, str(e.path / PROBE_FILE))
    manifest = json.loads((e.path / EXPORT_MANIFEST).read_text())
    manifest["checked"] = {"probe": PROBE_FILE, "max_abs_logit_diff": diffs}
    atomic_write(e.path / EXPORT_MANIFEST, json.dumps(manifest, indent=2) + "\n", backup=False)
    return {"path": str(e.path), "max_abs_logit_diff": diffs}


def export_at_end(s: Any, step: int) -> None:
    """Every rank computes the trained model's logits on one batch (a collective under ZeRO-3); rank 0 exports the
    last checkpoint and checks the export against them. A failed export is a warning: the run trained, and
    `scaletrain export RUN` can write it again."""
    from scaletrain.trainer.distributed import barrier

    # one sequence's first PROBE_TOKENS tokens: its logits (× vocabulary, fp32) stay small for any model
    ids = s.blocks.batch([0], s.acc.device)["input_ids"][:, :PROBE_TOKENS]
    logits = probe_logits(s.model, ids)
    barrier()
    if not s.main:
        return
    try:
        r = export_and_check(s.cfg.run.path, step, ids.cpu(), logits, merge=s.cfg.method.is_adapter)
    except Exception as e:                   # the run's result stands; the export can be redone on demand
        print(f"scaletrain: warning: the export of step {step} failed ({str(e).splitlines()[0][:300]}); run "
              f"`scaletrain export {s.cfg.run.path}` to write it", flush=True)
        return
    diffs = ", ".join(f"{k} {v:.2g}" for k, v in r["max_abs_logit_diff"].items())
    print(f"scaletrain: exported step {step} to {r['path']} (max |logit − trained| on one batch: {diffs})", flush=True)

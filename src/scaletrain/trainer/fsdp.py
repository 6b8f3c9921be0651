"""FSDP for the bundled trainer: torch's FSDP2 (`torch.distributed.fsdp.fully_shard`) applied by the trainer itself,
on every host, and its checkpoints in torch.distributed.checkpoint (DCP) form.

Why the trainer shards and not accelerate: on a CPU host `Accelerator(cpu=True)` drops accelerate's FSDP plugin and
runs plain MULTI_CPU DDP (the plan said FSDP, the run was DDP: issue 29), while `fully_shard` itself runs over gloo.
Sharding here on CPU and letting accelerate shard on a GPU would be two wrappers, two checkpoint formats and two
exports, only one of them ever tested on this project's CPU machines. So there is one path: accelerate provides the
process group, the device, the optimizer wrapper (fp16's loss scaler) and the loop's helpers; the model is never
given to `accelerate.prepare` under FSDP (make_accelerator keeps accelerate's own FSDP plugin off, so it cannot wrap
a second time), and this module wraps it the documented FSDP2 way:

  - `fully_shard` on every decoder block (the model's `_no_split_modules` classes: the gather unit the memory model
    counts), then on the root (embeddings, final norm, lm_head: tied weights stay in one unit); LoRA is added
    before sharding, so the frozen base and the adapters are sharded alike and only the adapters train;
  - the plan's precision as a MixedPrecisionPolicy: parameters all-gathered in bf16/fp16 over fp32 weights and
    gradients reduced in fp32; none over fp32 or bf16-only weights (no autocast: the policy is the cast);
  - gradients reduce-scattered at every micro-step (no `set_requires_gradient_sync(False)` during accumulation:
    that would keep every block's unsharded gradients until the step, which the FSDP memory term does not count);
  - `--offload all` as FSDP2's CPUOffloadPolicy on a GPU (on a CPU host the parameters live there already).

Checkpoints: `step-N/dcp/` holds the model and optimizer states as DCP shards (one file per rank and a .metadata),
read back by every rank on resume (DCP reshards). Nothing in them runs code when loaded: DCP's FileSystemReader
unpickles .metadata with plain pickle and its planner reads non-tensor items with `torch.load(weights_only=False)`;
both are replaced here by a restricted unpickler (DCP's metadata classes only) and `weights_only=True`.
Export reads the same shards into whole tensors in one process (`full_model_state`, DCP's own resharding load with
no process group), so `scaletrain export` and the trainer's end-of-run export share one path.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer.config import RunConfig

DCP_DIR = "dcp"                      # checkpoints/step-N/dcp/: the model and optimizer shards
MODEL_KEY, OPTIM_KEY = "model", "optim"
RNG_FILE = "rng-{rank}.pt"           # each rank's torch RNG state (dropout draws continue bit-exactly)

# What DCP's .metadata may name when unpickled (torch 2.13's FileSystemWriter writes these and nothing else).
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


# ---- wrapping ---------------------------------------------------------------------------------------------------
def mixed_precision_policy(cfg: RunConfig) -> Any:
    """The plan's precision as FSDP2 casts it: compute in bf16/fp16 over fp32 weights (gradients reduced in fp32),
    nothing to cast for fp32 or for bf16-only weights (master_weights bf16)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.precision == "fp32" or cfg.master_weights == "bf16":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.precision.torch_dtype), reduce_dtype=torch.float32)


def decoder_blocks(model: Any) -> list[Any]:
    """The model's decoder blocks: modules of the classes transformers never splits (`_no_split_modules`, found on
    the transformers model inside a peft wrapper too)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    if not names:
        raise ScaletrainError(f"{type(model).__name__} names no decoder block class (_no_split_modules); FSDP "
                              "cannot shard it per block: use --strategy zero3 or ddp")
    # bottom-up (fully_shard wants a unit's sub-units sharded first), should one block class nest in another
    return [m for m in reversed(list(model.modules())) if type(m).__name__ in names]


def shard_model(model: Any, cfg: RunConfig, device: Any) -> Any:
    """fully_shard per decoder block, then the root; returns the model (now an FSDPModule, parameters DTensor)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy

    if not dist.is_initialized():
        raise ScaletrainError("the plan's strategy is fsdp, but this process has no torch.distributed process group "
                              "to shard over; nothing was trained. Launch the run directory with `scaletrain launch` "
                              "(or its launch.sh)")
    # fully_shard moves each unit's parameters to the mesh's device (the rank's GPU) as it shards them: one block
    # whole there at a time, never the whole model; with offload the shards stay in (pinned) host memory
    offload = device.type == "cuda" and cfg.offload != "none"
    policy = CPUOffloadPolicy(pin_memory=True) if offload else None
    return fully_shard_blocks(model, mixed_precision_policy(cfg), policy)


def fully_shard_blocks(model: Any, mp_policy: Any, offload_policy: Any = None) -> Any:
    """The wrapping itself, for the trainer and for a measured step (a process group must be up): fully_shard on
    every decoder block, then the root, with one mixed precision (and offload) policy."""
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mp_policy": mp_policy}
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    # bitsandbytes' packed 4-bit weights (uint8, frozen) cannot become DTensors: each rank keeps them whole
    ignored = {p for p in model.parameters() if not p.is_floating_point() and not p.requires_grad}
    if ignored:
        kwargs["ignored_params"] = ignored
    for block in decoder_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_fsdp(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def describe(model: Any) -> str:
    """What the run's model is, for the check and the log: the FSDP units and how many parameters are shards."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    shards = [p for p in params if isinstance(p, DTensor)]
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    placements = sorted({str(p.placements[0]) for p in shards})
    return (f"FSDP2 fully_shard: {len(units)} units ({len(units) - 1} decoder blocks + root), {len(shards)} of "
            f"{len(params)} parameters DTensor shards ({', '.join(placements) or 'none'})")


def full_norm(norm: Any) -> Any:
    """A grad norm over DTensor gradients comes back as a DTensor: its full value (a plain tensor)."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# ---- checkpoints ------------------------------------------------------------------------------------------------
class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _METADATA_GLOBALS.get(module, ()) or (module == "torch"
                                                         and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        """DCP's reader, its .metadata unpickled with DCP's own classes only."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            rank = kwargs.get("rank")
            with open(Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata"), "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def _planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """DCP's planner, its non-tensor items (optimizer hyperparameters) read with weights_only=True."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            from scaletrain.trainer.safe_load import weights_only_loads

            with weights_only_loads():
                super().load_bytes(read_item, value)

    return SafePlanner()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def save_sharded(model: Any, optimizer: Any, d: Path) -> None:
    """Every rank writes its shards of the model and optimizer state (a collective), and its RNG state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, getattr(optimizer, "optimizer", optimizer))
    dcp.save({MODEL_KEY: msd, OPTIM_KEY: osd}, checkpoint_id=str(d / DCP_DIR))
    torch.save(_rng_state(), d / RNG_FILE.format(rank=_rank()))


def load_sharded(model: Any, optimizer: Any, d: Path) -> None:
    """Every rank reads its shards back into the live FSDP model and optimizer (a collective; DCP reshards)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from scaletrain.trainer.safe_load import safe_load

    if not (d / DCP_DIR / ".metadata").is_file():
        raise ScaletrainError(f"{d} holds no FSDP checkpoint ({DCP_DIR}/); it was written by another strategy")
    inner = getattr(optimizer, "optimizer", optimizer)
    msd, osd = get_state_dict(model, inner)
    sd = {MODEL_KEY: msd, OPTIM_KEY: osd}
    dcp.load(sd, storage_reader=_reader(d / DCP_DIR), planner=_planner())
    set_state_dict(model, inner, model_state_dict=sd[MODEL_KEY], optim_state_dict=sd[OPTIM_KEY])
    rng = d / RNG_FILE.format(rank=_rank())
    if rng.is_file():
        state = safe_load(rng)
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def _rng_state() -> dict[str, Any]:
    import torch

    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def is_sharded_checkpoint(ck: Path) -> bool:
    return (ck / DCP_DIR / ".metadata").is_file()


def full_model_state(ck: Path, wanted: frozenset[str] | None = None) -> dict[str, Any]:
    """The checkpoint's model weights as whole tensors by parameter name (only the `wanted` names, when given), in
    this one process: DCP reads every rank's shards into full-size tensors (no process group; also inside a trainer
    rank)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = _reader(ck / DCP_DIR)
    meta = reader.read_metadata()
    prefix = MODEL_KEY + "."
    tensors = {k[len(prefix):]: torch.empty(v.size, dtype=v.properties.dtype)
               for k, v in meta.state_dict_metadata.items()
               if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
               and (wanted is None or k[len(prefix):] in wanted)}
    sd = {MODEL_KEY: tensors}
    with warnings.catch_warnings():        # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(sd, storage_reader=_reader(ck / DCP_DIR), planner=_planner(), no_dist=True)
    return sd[MODEL_KEY]

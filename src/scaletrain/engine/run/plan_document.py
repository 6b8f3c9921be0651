"""plan.json, the one module that writes and reads it.

    plan.json = Plan.to_json() + {"request": PlanRequest.to_json(), "train": TrainOptions.to_json()}

The same schema as `scaletrain plan --json` (which has no "request" or "train" section; the doctor takes either).
Readers never index the JSON themselves: the trainer, the launcher, the relaunch, the sampler and the doctor ask a
PlanDocument for typed values. What a reader may do without (a hand-trimmed file, `plan --json` output) comes back
as None; what it cannot do without raises one line naming the missing field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from scaletrain.engine.catalog.hardware import Hardware, find_gpu
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import read_text_bounded
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.choices import carries, read_choices, recorded_choices
from scaletrain.engine.vocabulary import LossImpl, Method, Strategy


@dataclass(frozen=True)
@carries(after="base_bits")         # precision … loop: RunChoices (engine/choices.py), read by its codec
class TrainingSection:
    """plan.json "training": the choices the trainer runs with (trainer/config.py RunConfig is one, as it is)."""

    method: Method
    strategy: Strategy
    grad_ckpt: bool
    lora_rank: int | None
    lora_targets: tuple[str, ...]
    base_bits: int
    loss: LossImpl = LossImpl.STANDARD


@dataclass(frozen=True)
class BatchSection:
    """plan.json "batch": the split and the world it was planned for."""

    micro_batch: int
    grad_accum: int
    world_size: int
    seq_len: int


class PlanDocument:
    """One plan.json (or `plan --json` output), read once; typed answers to what its readers ask."""

    def __init__(self, data: Mapping[str, Any], source: str = "the plan JSON"):
        self._data = dict(data)
        self.source = source             # the file, for messages
        self._replanned: tuple[PlanRequest, Plan] | None = None     # replan()'s answer, once (the data is read only)

    # ---- writing ---------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, plan: Plan, request: PlanRequest, train: TrainOptions) -> "PlanDocument":
        """The plan exactly as `plan --json` prints it, plus the request and the trainer's options."""
        from scaletrain.engine.run.disk import disk_need

        doc = plan.to_json()
        doc["request"] = request.to_json()
        doc["train"] = train.to_json()
        if not train.script:
            doc["disk"] = disk_need(plan, train).to_json()
        from scaletrain.engine.run.run_length import eval_cost

        ev = eval_cost(plan, train)
        if ev is not None:
            doc["eval"] = ev.to_json()
        return cls(doc)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "the plan JSON") -> "PlanDocument":
        if not isinstance(data, Mapping):
            raise ScaletrainError(f"{source} is not a scaletrain plan (a JSON object is needed)")
        return cls(data, source)

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._data))

    def dumps(self) -> str:
        return json.dumps(self._data, indent=2) + "\n"

    def with_train(self, train: TrainOptions) -> "PlanDocument":
        return PlanDocument({**self._data, "train": train.to_json()}, self.source)

    # ---- lenient: None when the document does not say --------------------------------------------------------
    def _get(self, section: str, key: str) -> Any:
        sec = self._data.get(section)
        return sec.get(key) if isinstance(sec, Mapping) else None

    @property
    def gpu(self) -> str | None:
        return self._get("hardware", "gpu")

    @property
    def gpus_per_node(self) -> int | None:
        return self._get("hardware", "gpus_per_node")

    @property
    def gpu_memory_bytes(self) -> int | None:
        return self._get("hardware", "gpu_memory_bytes")

    @property
    def world_size(self) -> int | None:
        return self._get("hardware", "world_size")

    @property
    def device(self) -> str | None:
        return self._get("training", "device")

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu" or self.gpu == "CPU"

    @property
    def predicted_total_bytes(self) -> int | None:
        """The plan's per-GPU peak (memory.per_gpu_bytes.total)."""
        per_gpu = self._get("memory", "per_gpu_bytes")
        return per_gpu.get("total") if isinstance(per_gpu, Mapping) else None

    @property
    def allocated_peak_bytes(self) -> int | None:
        return self._get("memory", "allocated_peak_bytes")

    @property
    def capacity_bytes(self) -> int | None:
        return self._get("memory", "capacity_bytes")

    @property
    def usable_bytes(self) -> int | None:
        return self._get("memory", "usable_bytes")

    @property
    def headroom_fraction(self) -> float | None:
        return self._get("memory", "headroom_fraction")

    @property
    def host_bytes_per_gpu(self) -> int | None:
        return self._get("memory", "host_bytes_per_gpu")

    @property
    def planned_step_seconds(self) -> float | None:
        """The plan's predicted seconds per optimizer step (time.step_seconds)."""
        return self._get("time", "step_seconds")

    @property
    def planned_tokens_per_second(self) -> float | None:
        """The plan's predicted tokens per second over all GPUs (time.tokens_per_second)."""
        return self._get("time", "tokens_per_second")

    @property
    def train_lr(self) -> float | None:
        """The learning rate the run trains with, when the document has a "train" section."""
        return self._get("train", "lr")

    def without_gradient(self) -> tuple[str, ...]:
        """The trainable parameters a step on text gives no gradient, by name (plan.json "model"; none when
        absent): a traced model's multimodal towers, reformer's unused lm_head bias."""
        model = self._data.get("model")
        entry = model.get("without_gradient") if isinstance(model, Mapping) else None
        names = entry.get("names") if isinstance(entry, Mapping) else None
        return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()

    def recorded(self, name: str) -> Any:
        """A PlanRequest field's value as the plan recorded it ("training", else "batch"); None if neither has it."""
        tr, ob = self._data.get("training"), self._data.get("batch")
        tr, ob = (tr if isinstance(tr, Mapping) else {}), (ob if isinstance(ob, Mapping) else {})
        return tr.get(name, ob.get(name))

    # ---- strict: the run cannot be understood without these ---------------------------------------------------
    def _missing(self, e: Exception) -> ScaletrainError:
        return ScaletrainError(f"{self.source} is not a scaletrain plan (missing or bad field {e}); "
                               "write it with `scaletrain ... --run-dir DIR --dry-run`")

    def check_plan(self) -> None:
        """What the doctor reads from a plan it is given (`diagnose --plan`): the hardware, the choices, the batch
        and the predicted memory; an empty or partial section fails here, in one line."""
        for section, keys in (("hardware", ("gpu", "gpus_per_node", "nodes")), ("memory", ("per_gpu_bytes",))):
            part = self._data.get(section)
            missing = [k for k in keys if not isinstance(part, Mapping) or part.get(k) is None]
            if missing:
                raise self._missing(f"{section}.{missing[0]}")
        if not isinstance(self.predicted_total_bytes, int):
            raise self._missing("memory.per_gpu_bytes.total")
        _ = (self.training, self.batch)

    def check_trainable(self) -> None:
        """Everything the bundled trainer reads: a bad plan.json or train option fails here, in one line."""
        _ = (self.request, self.training, self.batch)
        self.check_batch()
        self.train.check()
        self.check_weights()

    def check_batch(self) -> None:
        """The batch the trainer runs adds up to the one the plan's memory and time were predicted for: a number
        changed by hand in plan.json (micro_batch alone) would otherwise train a batch nobody planned."""
        b = self.batch
        problem = None
        samples = b.micro_batch * b.grad_accum * b.world_size
        effective, seq_len = self._get("batch", "effective_batch"), self._get("training", "seq_len")
        nodes, per_node = self._get("hardware", "nodes"), self.gpus_per_node
        if isinstance(effective, int) and samples != effective:
            problem = (f"its batch is micro {b.micro_batch} × accum {b.grad_accum} × {b.world_size} processes = "
                       f"{samples} samples per step, but it records an effective batch of {effective}")
        elif isinstance(nodes, int) and isinstance(per_node, int) and nodes * per_node != b.world_size:
            problem = (f"its hardware is {nodes} node{'s' if nodes != 1 else ''} × {per_node}, but its batch is "
                       f"split over {b.world_size} processes")
        elif isinstance(seq_len, int) and seq_len != b.seq_len:
            problem = f"its batch is {b.seq_len} tokens per sample, its training section {seq_len}"
        else:
            req = self.request
            pinned = [(name, asked, got) for name, asked, got in (("micro_batch", req.micro_batch, b.micro_batch),
                                                                  ("grad_accum", req.grad_accum, b.grad_accum))
                      if asked is not None and asked != got]
            if pinned:
                name, asked, got = pinned[0]
                problem = f"its batch has {name} {got}, but it was planned with {name} {asked}"
        if problem:
            raise ScaletrainError(f"{self.source} does not add up: {problem} (edited by hand?); the memory and time "
                                  "it records are for the plan it was written with: restore it, or re-plan it "
                                  "with scaletrain launch DIR --set KEY=VALUE (re-planned, the old files kept; "
                                  "--resume continues where the change allows)")

    def check_weights(self) -> None:
        """The weights plan.json names now, checked as when it was written (it may have been edited since): custom
        code (auto_map) or a missing folder is one line before any process loads them."""
        from scaletrain.engine.request.weights import launch_weights_problem, resolve_weights

        req, tr = self.request, self.training
        problem = launch_weights_problem(tr.method, tr.base_bits, resolve_weights(self.train.model_source, req.model))
        if problem:
            raise ScaletrainError(f"{self.source}: {problem}" if self.source else problem)

    @property
    def train(self) -> TrainOptions:
        """The trainer's options ("train"; the defaults when the document has none)."""
        return TrainOptions.from_json(self._data.get("train"))

    @property
    def request(self) -> PlanRequest:
        """The PlanRequest the run was planned from ("request")."""
        try:
            req = dict(self._data["request"])
            if "model" not in req:
                raise KeyError("model")
            known = PlanRequest.field_names()
            fields_ = {k: v for k, v in req.items() if k in known}
            for k in ("lora_targets", "residents"):
                if isinstance(fields_.get(k), list):
                    fields_[k] = tuple(tuple(x) if isinstance(x, list) else x for x in fields_[k])
            return PlanRequest(**fields_)
        except (KeyError, TypeError, ValueError) as e:
            raise self._missing(e) from None

    @property
    def training(self) -> TrainingSection:
        try:
            tr, req = self._data["training"], self._data.get("request") or {}
            return TrainingSection(
                method=Method(tr["method"]), strategy=Strategy(tr["strategy"]), **read_choices(tr),
                grad_ckpt=bool(tr["grad_ckpt"]),
                lora_rank=int(tr.get("lora_rank") or req.get("lora_rank") or 16),
                lora_targets=tuple(tr.get("lora_targets") or ()), base_bits=int(tr.get("base_bits", 16)),
                loss=LossImpl(tr.get("loss") or LossImpl.STANDARD))
        except (KeyError, TypeError, ValueError) as e:
            raise self._missing(e) from None

    @property
    def batch(self) -> BatchSection:
        try:
            b = self._data["batch"]
            return BatchSection(micro_batch=int(b["micro_batch"]), grad_accum=int(b["grad_accum"]),
                                world_size=int(b["world_size"]), seq_len=int(b["seq_len"]))
        except (KeyError, TypeError, ValueError) as e:
            raise self._missing(e) from None

    # ---- the plan the run was made from ------------------------------------------------------------------------
    def replan(self) -> tuple[PlanRequest, Plan]:
        """Rebuild (PlanRequest, Plan), pinned to the choices the document made and the hardware it had.

        Pinning matters: a request with free fields would be re-solved by the planner and could come back
        different, and `--gpus auto` would re-detect this machine instead of the one the run died on.
        """
        try:
            if self._replanned is None:
                self._replanned = self._replan()
            return self._replanned
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ScaletrainError(f"{self.source} cannot be re-planned (missing or bad field {e}); pass a plan.json "
                                  "written by scaletrain (run directory) or `scaletrain plan --json`") from None

    def _replan(self) -> tuple[PlanRequest, Plan]:
        d = self._data
        try:
            hw_j = d["hardware"]
            tr = d["training"]
            batch = d["batch"]
            req_j = dict(d.get("request") or {})
            model = req_j.get("model") or d["model"]["name"]
        except (KeyError, TypeError):
            raise ScaletrainError("the plan JSON lacks hardware/training/batch/model; pass a plan.json written by "
                                  "scaletrain (run directory) or `scaletrain plan --json`") from None
        known = PlanRequest.field_names()
        fields_: dict[str, Any] = {k: v for k, v in req_j.items() if k in known}
        fields_["residents"] = tuple((r["model"], int(r["bits"])) if isinstance(r, dict) else (r[0], int(r[1]))
                                     for r in (fields_.get("residents") or tr.get("residents") or ()))
        fields_.update(
            model=model, gpus=f"{hw_j['nodes']}x{hw_j['gpus_per_node']}x{hw_j['gpu']}", nodes=hw_j["nodes"],
            method=tr["method"], strategy=tr["strategy"], offload=tr["offload"], **recorded_choices(tr),
            grad_ckpt=bool(tr["grad_ckpt"]), seq_len=int(tr["seq_len"]),
            micro_batch=int(batch["micro_batch"]), grad_accum=int(batch["grad_accum"]), effective_batch=None,
            device=tr.get("device"))
        if tr.get("objective"):           # the objective and its knobs as the plan resolved them (issue 16)
            fields_.update(objective=tr["objective"], ref_model=tr.get("ref_model"), prompt_len=tr.get("prompt_len"),
                           generation=tr.get("generation") or "train")
            if tr["objective"] == "grpo":
                fields_.update(num_generations=tr.get("num_generations"),
                               completion_len=int(tr["seq_len"]) - int(tr["prompt_len"]))
        if tr.get("lora_rank"):
            fields_["lora_rank"] = int(tr["lora_rank"])
        targets = tr.get("lora_targets") or fields_.get("lora_targets")
        fields_["lora_targets"] = tuple(targets) if targets else None
        if tr.get("base_bits") is not None and tr["method"] != "full":
            fields_["base_bits"] = int(tr["base_bits"])
        if tr.get("loss") is not None:
            fields_["loss"] = tr["loss"]
        mem = d.get("memory") or {}
        if mem.get("headroom_fraction") is not None:
            fields_["headroom"] = float(mem["headroom_fraction"])
        req = PlanRequest(**fields_)
        spec = find_gpu(hw_j["gpu"])
        if hw_j.get("gpu_memory_bytes"):
            spec = replace(spec, memory_bytes=int(hw_j["gpu_memory_bytes"]))
        hw = Hardware(gpu=spec, gpus_per_node=int(hw_j["gpus_per_node"]), nodes=int(hw_j["nodes"]),
                      source=hw_j.get("source") or "catalog",
                      host_cores=_cores(hw_j.get("host_cores")))
        if hw_j.get("inter_node_gbps"):
            hw = replace(hw, inter_node_gbit_s=float(hw_j["inter_node_gbps"]))
        return req, make_plan(req, hardware=hw)


def _cores(value: Any) -> int | None:
    """plan.json's hardware.host_cores: a whole number of cores, else unknown (decided at launch)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_HOST_CORES
    return value if ok else None


MAX_HOST_CORES = 1 << 16          # a node's cores; a larger number in a plan.json is not a machine
MAX_PLAN_BYTES = 64 << 20


def read_plan_document(path: str | Path, *, flag: str | None = None) -> PlanDocument:
    """A plan.json from disk. `flag`: how the user named the file (e.g. "--plan"); None: a run directory's own."""
    path = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(path)
        text = read_text_bounded(path, MAX_PLAN_BYTES, path.name if flag is None else flag)
    except FileNotFoundError:
        raise ScaletrainError(f"{flag} {path} does not exist" if flag
                              else f"{path.parent} is not a run directory (no plan.json)") from None
    except NotADirectoryError:
        raise ScaletrainError(f"{flag} {path} does not exist" if flag
                              else f"{path.parent} is not a directory; give a run directory (it holds plan.json)"
                              ) from None
    except IsADirectoryError:
        raise ScaletrainError(f"{name} is a directory; give a plan.json file" if flag
                              else f"{path} is a directory, not a plan.json file") from None
    except UnicodeDecodeError:
        raise ScaletrainError(f"{name} is not text (binary data); give a plan.json written by scaletrain") from None
    except OSError as e:
        raise ScaletrainError(f"cannot read {name} ({e.strerror or e.__class__.__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScaletrainError(f"{flag} {path} is not JSON ({e.msg} at line {e.lineno}); give a plan.json" if flag
                              else f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except (ValueError, RecursionError) as e:
        raise ScaletrainError(f"{name} is not valid JSON ({e.__class__.__name__})") from None
    return PlanDocument.from_json(data, str(path))


def holds_plan(path: str | Path, doc: PlanDocument) -> bool | None:
    """Does the plan.json at `path` hold exactly `doc`? None when there is no readable plan.json there."""
    try:
        old = json.loads(read_text_bounded(path, MAX_PLAN_BYTES, Path(path).name))
    except (OSError, ValueError, RecursionError, ScaletrainError):      # UnicodeDecodeError is a ValueError
        return None
    return old == doc.to_json()

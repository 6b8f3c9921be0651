"""Try what a run made: load its newest export with transformers and generate (`scaletrain chat RUN`).

The export is loaded as a user would load it, from the local folder only (local_files_only=True) and with
trust_remote_code=False: the model folder (full fine-tuning), the merged folder (LoRA with --merge, what the run
writes at its end), or the base weights with the PEFT adapter on top. The tokenizer is the export's own (a
random-init run's byte tokenizer is exported as a transformers tokenizer: byte_tokenizer.py). Decoding is greedy,
so the same prompt gives the same text; a tokenizer with a chat template gets the conversation through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.exports import ExportInfo, newest_export
from scaletrain.engine.run.layout import RunDir

RANDOM_INIT = "random-init"


@dataclass
class ChatSession:
    model: Any
    tokenizer: Any
    export: ExportInfo
    history: list[dict[str, str]] = field(default_factory=list)    # chat-template turns so far

    @property
    def templated(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def reply(self, prompt: str, max_new_tokens: int) -> str:
        """The model's continuation of `prompt` (or its answer, through the chat template), new tokens only."""
        import torch

        if not prompt.strip():
            raise ScaletrainError("the prompt is empty; give some text")
        if self.templated:
            turns = [*self.history, {"role": "user", "content": prompt}]
            ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt",
                                                     return_dict=True)["input_ids"]
        else:
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=max_new_tokens, pad_token_id=pad,
                                      eos_token_id=tok.eos_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        if self.templated:
            self.history += [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
        return text


def _from_pretrained(cls: Any, where: str | Path, what: str) -> Any:
    try:
        return cls.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ScaletrainError(f"cannot load {what} from {where} ({str(e).splitlines()[0][:200]})") from None


def open_chat(run_dir: str | Path) -> ChatSession:
    """The run's newest export, loaded with transformers (and peft for an unmerged adapter)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = RunDir(run_dir)
    if not run.plan.is_file():
        raise ScaletrainError(f"{run.path} is not a run directory (no {run.plan.name}); `scaletrain runs` lists the "
                              "runs launched here")
    e = newest_export(run)
    if e is None:
        raise ScaletrainError(f"{run.path} has no export yet (a run exports its last checkpoint when it finishes); "
                              f"write one with `scaletrain export {run.path}`")
    if e.kind == "model" or e.merged is not None:
        folder = e.loadable
        model = _from_pretrained(AutoModelForCausalLM, folder, "the exported model")
    else:
        folder = e.path / "adapter"
        if e.base_weights in (None, RANDOM_INIT):
            raise ScaletrainError(f"the adapter in {folder} sits on random-init weights that only the run can "
                                  f"rebuild; export it merged: scaletrain export {run.path} --merge --out DIR")
        from peft import PeftModel

        base = _from_pretrained(AutoModelForCausalLM, e.base_weights, "the adapter's base weights")
        model = PeftModel.from_pretrained(base, str(folder), is_trainable=False)
    tokenizer = _from_pretrained(AutoTokenizer, folder, "the export's tokenizer")
    return ChatSession(model.eval(), tokenizer, e)

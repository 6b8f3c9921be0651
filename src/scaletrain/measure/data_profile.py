"""Your data, understood before you train (issue 22): `python -m scaletrain.measure.data_profile` answers in JSON.

It reads --data exactly as the trainer will (trainer/data.py: the same records, column renames, tokenizer, chat
template and blocks) and reports the detected format, token statistics per record (p50/p95/max with the real
tokenizer), the share of records longer than the sequence, the blocks the trainer will make (packed, or one per
record), and the first records rendered as the trainer sees them with the trained tokens marked «like this».
The engine runs it as a subprocess (engine/request/data_profile.py) so planning never imports transformers or
torch; a random-init model's byte tokenizer needs neither.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.probes import PROFILE_FORMAT

EXAMPLES = 2                 # records rendered
EXAMPLE_CHARS = 600          # each cut to this many characters


def detect_format(rec: dict[str, Any]) -> str:
    """TRL's dataset shapes: messages, prompt-completion, text, preference (chosen/rejected), prompts."""
    if isinstance(rec.get("messages"), list):
        return "messages"
    if "chosen" in rec and "rejected" in rec:
        return "preference"
    if "prompt" in rec and ("completion" in rec or "response" in rec):
        return "prompt-completion"
    if "text" in rec:
        return "text"
    if "prompt" in rec:
        return "prompts"
    return "unknown"


def _percentile(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))] if s else 0


def render(sample: Any, tok: Any) -> str:
    """The tokens as text, the trained spans between « and »."""
    from scaletrain.trainer.data import IGNORE_INDEX

    decode = tok.decode if hasattr(tok, "decode") else tok.tok.decode
    out, run, trained = [], [], None
    for i, lab in zip(sample.input_ids, sample.labels):
        t = lab != IGNORE_INDEX
        if trained is not None and t != trained:
            out.append(("«" + decode(run) + "»") if trained else decode(run))
            run = []
        run.append(i)
        trained = t
    if run:
        out.append(("«" + decode(run) + "»") if trained else decode(run))
    text = "".join(out)
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS - 1] + "…"


def profile(spec: str, model_id: str, weights: str | None, seq_len: int, packing: bool,
            columns: dict[str, str] | None) -> dict[str, Any]:
    from scaletrain.trainer import data as D
    from scaletrain.trainer.model import tokenizer_for

    raw = [D.with_columns(r, columns, where) for where, r in D.located_records(spec)]
    formats = sorted({detect_format(r) for r in raw})
    out: dict[str, Any] = {"format": PROFILE_FORMAT, "records": len(raw), "data_format": "/".join(formats),
                           "seq_len": seq_len, "packing": packing}
    if "unknown" in formats:
        cols = sorted({k for r in raw for k in r})[:8]
        out["note"] = (f"columns {', '.join(cols)} are none of TRL's (text, prompt + completion, messages); map them "
                       "with --data-columns, e.g. prompt=question,completion=answer")
        return out
    if not set(formats) <= {"messages", "prompt-completion", "text"}:
        out["note"] = ("token statistics are for supervised records (text, prompt-completion, messages); "
                       f"these are {out['data_format']}: TRL's objective trainers read them")
        return out
    try:
        tok = tokenizer_for(model_id, weights)
    except ScaletrainError as e:          # the only note: no tokenizer on this machine (the records are checked)
        out.update(no_tokenizer=True, note=f"no token statistics ({str(e)[:200]}); the plan counts one sample per "
                                           "record")
        return out
    records = D.read_records(spec, columns)
    samples = [D.tokenize_record(r, tok) for r in records]
    lengths = [len(s.input_ids) for s in samples]
    blocks = D.build_blocks(samples, seq_len, packing=packing, pad_id=tok.pad_id)
    out.update(tokens={"p50": _percentile(lengths, 0.5), "p95": _percentile(lengths, 0.95), "max": max(lengths),
                       "mean": sum(lengths) / len(lengths), "total": sum(lengths)},
               trained_tokens=sum(1 for s in samples for lab in s.labels if lab != D.IGNORE_INDEX),
               truncated_share=sum(1 for n in lengths if n > seq_len) / len(lengths),
               blocks=len(blocks), block_tokens=sum(sum(m) for m in blocks.attention_mask),
               examples=[render(s, tok) for s in samples[:EXAMPLES]])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaletrain.measure.probe data-profile")
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--weights")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--no-packing", action="store_true")
    p.add_argument("--columns", default="{}", help="JSON object: TRL name → the data's column name")
    a = p.parse_args(argv)
    try:
        result = profile(a.data, a.model, a.weights, a.seq_len, not a.no_packing, json.loads(a.columns) or None)
    except ScaletrainError as e:
        result = {"format": PROFILE_FORMAT, "error": str(e)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

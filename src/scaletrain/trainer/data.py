"""Training data for the bundled trainer: JSONL records → token blocks of exactly seq_len.

Accepted record shapes (JSONL, JSON, Parquet, CSV, a folder, a cached HF dataset; engine/request/data_source.py
resolves it, engine/request/records.py reads and checks it for the planner and the trainer alike):
  {"text": "..."}                                  every token is trained on
  {"prompt": "...", "completion": "..."}           only the completion (and its end token) is trained on (TRL's
                                                   naming; "response" is accepted for "completion")
  {"messages": [{"role": "...", "content": "..."}]} only assistant turns are trained on (the tokenizer's chat
                                                   template renders them when it has one)

Packing concatenates the samples (each closed by an end token) and cuts the stream into seq_len blocks, dropping
the short tail; padding truncates or pads each sample to seq_len. Labels of untrained and padded positions are
IGNORE_INDEX, the value transformers' causal-LM loss skips.

Models built with random-init have no tokenizer offline, so ByteTokenizer stands in: UTF-8 bytes shifted past
three special ids (pad 0, bos 1, eos 2, as in the bundled tiny configs). Vocabularies smaller than 259 ids fold
the bytes modulo the room left. It is deterministic and needs no files; it is not a tokenizer to ship a model with.
No torch here: the trainer turns the blocks into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request import records as R
from scaletrain.engine.request.records import CHAT_ROLES, RECORD_SHAPES  # noqa: F401  (the trainer's names)

IGNORE_INDEX = -100          # transformers' CrossEntropyLoss ignore_index for causal-LM labels


class Tokenizer(Protocol):
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes → ids in [SPECIALS, vocab_size): the offline stand-in for random-init models."""

    vocab_size: int
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    SPECIALS = 3             # pad, bos, eos
    BYTE_VALUES = 256

    def __post_init__(self) -> None:
        if self.vocab_size <= self.SPECIALS:
            raise ScaletrainError(f"the byte tokenizer needs a vocabulary of more than {self.SPECIALS} ids "
                                  f"(the model has {self.vocab_size})")

    def encode(self, text: str) -> list[int]:
        room = min(self.BYTE_VALUES, self.vocab_size - self.SPECIALS)
        return [self.SPECIALS + b % room for b in text.encode("utf-8")]

    def decode(self, ids: Iterable[int]) -> str:
        """Exact inverse when the vocabulary holds all 256 byte values; specials are dropped."""
        data = bytes(i - self.SPECIALS for i in ids if self.SPECIALS <= i < self.SPECIALS + self.BYTE_VALUES)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """A transformers tokenizer behind the same small interface (chat template used when it has one)."""

    def __init__(self, tok: Any):
        self.tok = tok
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        if eos is None:
            raise ScaletrainError(f"tokenizer {tok.name_or_path!r} has no end-of-sequence token")
        self.eos_id, self.pad_id = int(eos), int(pad)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))


@dataclass(frozen=True)
class Sample:
    """One tokenized record: ids and the matching labels (IGNORE_INDEX where not trained)."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]


@dataclass(frozen=True)
class Blocks:
    """Fixed-length training rows; attention_mask is 1 on real tokens, 0 on padding."""

    input_ids: tuple[tuple[int, ...], ...]
    labels: tuple[tuple[int, ...], ...]
    attention_mask: tuple[tuple[int, ...], ...]
    seq_len: int
    source_samples: int
    repeats: int = 1                      # passes over the records (> 1: repeated to the size a plan needs)
    source_tokens: int = 0                # tokens of the tokenized records (end tokens included), one pass

    def __len__(self) -> int:
        return len(self.input_ids)

    def tokens(self, index: int) -> int:
        return sum(self.attention_mask[index])


# ---- reading: engine/request/records.py, the planner's reader too (issue 29: they cannot disagree) ----------------
def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file; a bad line is one error naming the file and line."""
    return R.sft_records(path)


def jsonl_objects(path: str | Path, shapes: str = RECORD_SHAPES) -> list[tuple[str, dict[str, Any]]]:
    """(file:line, object) for every non-blank line of a JSONL file (one error per bad line, naming it)."""
    return R.located_records(path, shapes)


located_records = R.located_records
with_columns = R.with_columns


def read_records(spec: str | Path, columns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every record --data names (columns renamed by `columns`), each checked for one of the accepted shapes
    (errors name the line or row)."""
    return R.sft_records(spec, columns)


# ---- tokenizing ------------------------------------------------------------------------------------------------
def _chat_text(role: str, content: str) -> str:
    """Plain rendering of one chat turn when the tokenizer has no chat template."""
    return f"<|{role}|>\n{content}\n"


def tokenize_record(rec: dict[str, Any], tok: Tokenizer) -> Sample:
    """Ids and labels for one record, closed by the end token (which is trained on where the answer is)."""
    ids: list[int] = []
    labels: list[int] = []

    def add(text: str, train: bool) -> None:
        t = tok.encode(text)
        ids.extend(t)
        labels.extend(t if train else [IGNORE_INDEX] * len(t))

    shape = R.record_shape(rec, "a record")
    if shape == "text":
        add(rec["text"], True)
        trained_end = True
    elif shape == "messages":
        msgs = rec["messages"]
        if isinstance(tok, HFTokenizer) and tok.has_chat_template:
            _chat_template_sample(msgs, tok, ids, labels)
        else:
            for m in msgs:
                add(_chat_text(m["role"], m["content"]), m["role"] == "assistant")
        trained_end = msgs[-1]["role"] == "assistant"
    else:
        add(rec["prompt"] + "\n", False)
        add(rec["completion"] if rec.get("completion") is not None else rec["response"], True)
        trained_end = True
    ids.append(tok.eos_id)
    labels.append(tok.eos_id if trained_end else IGNORE_INDEX)
    return Sample(tuple(ids), tuple(labels))


def _chat_template_sample(msgs: list[dict[str, str]], tok: HFTokenizer, ids: list[int], labels: list[int]) -> None:
    """Render with the model's own template; assistant turns are the tokens each turn adds to the prefix."""
    prev: list[int] = []
    for i, m in enumerate(msgs):
        out = tok.tok.apply_chat_template(msgs[: i + 1], tokenize=True)
        cur = list(out["input_ids"] if hasattr(out, "keys") else out)   # transformers 5 returns an encoding
        if cur[: len(prev)] != prev:          # template is not prefix-stable: train on the whole conversation
            ids[:] = cur
            labels[:] = cur
            prev = cur
            continue
        new = cur[len(prev):]
        ids.extend(new)
        labels.extend(new if m["role"] == "assistant" else [IGNORE_INDEX] * len(new))
        prev = cur


def build_blocks(samples: Sequence[Sample], seq_len: int, *, packing: bool, pad_id: int) -> Blocks:
    """Pack (concatenate, cut into seq_len blocks, drop the tail) or pad/truncate each sample to seq_len."""
    if seq_len < 2:
        raise ScaletrainError(f"sequence length must be at least 2 tokens (got {seq_len})")
    rows_i: list[tuple[int, ...]] = []
    rows_l: list[tuple[int, ...]] = []
    rows_m: list[tuple[int, ...]] = []
    if packing:
        flat_i = [t for s in samples for t in s.input_ids]
        flat_l = [t for s in samples for t in s.labels]
        for start in range(0, len(flat_i) - seq_len + 1, seq_len):
            rows_i.append(tuple(flat_i[start:start + seq_len]))
            rows_l.append(tuple(flat_l[start:start + seq_len]))
            rows_m.append((1,) * seq_len)
    else:
        for s in samples:
            n = min(len(s.input_ids), seq_len)
            if all(lab == IGNORE_INDEX for lab in s.labels[:n]):
                continue                      # truncation left nothing to learn from
            pad = seq_len - n
            rows_i.append(s.input_ids[:n] + (pad_id,) * pad)
            rows_l.append(s.labels[:n] + (IGNORE_INDEX,) * pad)
            rows_m.append((1,) * n + (0,) * pad)
    return Blocks(tuple(rows_i), tuple(rows_l), tuple(rows_m), seq_len, len(samples))


def load_blocks(path: str | Path, tok: Tokenizer, seq_len: int, *, packing: bool, min_blocks: int = 0,
                columns: dict[str, str] | None = None) -> Blocks:
    """Read, tokenize and block a JSONL dataset; an empty result is an error that says how to fix it.

    min_blocks > 0 repeats the records, whole and in order, until they give at least that many blocks (cut to
    exactly that many): synthetic data sized to a plan, for the bundled demo set only (the trainer decides)."""
    records = read_records(path, columns)
    samples = [tokenize_record(r, tok) for r in records]
    blocks = build_blocks(samples, seq_len, packing=packing, pad_id=tok.pad_id)
    if len(blocks) < min_blocks and any(lab != IGNORE_INDEX for s in samples for lab in s.labels):
        blocks = _repeated(samples, seq_len, packing, tok.pad_id, min_blocks)
    if len(blocks) == 0:
        raise ScaletrainError(R.no_blocks(path, seq_len, packing))
    from dataclasses import replace

    return replace(blocks, source_tokens=sum(len(s.input_ids) for s in samples))


def _repeated(samples: Sequence[Sample], seq_len: int, packing: bool, pad_id: int, min_blocks: int) -> Blocks:
    """The samples repeated until they give min_blocks blocks (the first min_blocks of them)."""
    if packing:
        per_pass = max(1, sum(len(s.input_ids) for s in samples))
        repeats = -(-(min_blocks * seq_len) // per_pass)             # ceil: enough tokens, the tail dropped
    else:
        usable = len(build_blocks(samples, seq_len, packing=False, pad_id=pad_id))
        repeats = -(-min_blocks // max(1, usable))
    blocks = build_blocks(list(samples) * repeats, seq_len, packing=packing, pad_id=pad_id)
    return Blocks(blocks.input_ids[:min_blocks], blocks.labels[:min_blocks], blocks.attention_mask[:min_blocks],
                  seq_len, len(samples), repeats)


def shard_order(n_rows: int, epoch: int, seed: int, rank: int, world_size: int) -> list[int]:
    """This rank's row order for one epoch: a seeded shuffle, split round-robin, equal length on every rank."""
    import random

    order = list(range(n_rows))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_rank = n_rows // world_size
    return order[rank::world_size][:per_rank]


"""A tokenizer that really tokenizes, or one line: `python -m scaletrain.measure.probe tokenizer-check SOURCE`.

Why: transformers 5 (5.24 measured) returns, for a source whose tokenizer files are missing (a weights folder
without them, an id whose tokenizer is not in the cache), a tokenizer of one token that encodes every text to
nothing instead of raising; a run from it trains on end-of-sequence tokens alone ("1000 tokens for 1000 records").
So every tokenizer the trainer loads is checked (trainer/model.py tokenizer_for, the objectives' loader), and the
launcher runs this module before any rank starts (engine/launch/prefetch.py).

A real tokenizer encodes the probe sentence below (15 words, 77 characters) into 15-20 tokens (GPT-2, Llama,
Qwen), a byte-level one into 77; the empty one into none. Fewer than MIN_PROBE_TOKENS distinct known ids (unknown
tokens not counted), or a vocabulary under MIN_VOCAB, is refused.
"""

from __future__ import annotations

import sys
from typing import Any

from scaletrain.engine.errors import ScaletrainError

PROBE = "The quick brown fox jumps over the lazy dog, then sleeps in the warm afternoon sun."
MIN_PROBE_TOKENS = 4        # distinct known ids; a word-level vocabulary makes ≥ 10 of the probe's 15 words
MIN_VOCAB = 16              # fewer ids than that cannot hold the probe's letters


def tokenizer_problem(tok: Any, source: str) -> str | None:
    """One line when `tok` (a transformers tokenizer) is empty or tokenizes the probe to almost nothing."""
    try:
        size = len(tok)
        ids = list(tok.encode(PROBE, add_special_tokens=False))
    except Exception as e:                  # a broken tokenizer file: its own first line
        return f"the tokenizer of {source} cannot encode text ({(str(e).splitlines() or [type(e).__name__])[0][:160]})"
    unk = getattr(tok, "unk_token_id", None)
    known = {i for i in ids if i != unk}
    if size < MIN_VOCAB or len(known) < MIN_PROBE_TOKENS:
        return (f"the tokenizer of {source} is empty ({size} token{'s' if size != 1 else ''} in its vocabulary; a "
                f"{len(PROBE.split())}-word probe sentence encodes to {len(ids)} token{'s' if len(ids) != 1 else ''})"
                ": its tokenizer files (tokenizer.json, tokenizer_config.json, vocab/merges) are missing or broken; "
                "give weights that hold their tokenizer")
    return None


def check_tokenizer(tok: Any, source: str) -> Any:
    """tok itself, or ScaletrainError when tokenizer_problem finds one."""
    problem = tokenizer_problem(tok, source)
    if problem:
        raise ScaletrainError(problem)
    return tok


def load_checked(source: str) -> Any:
    """AutoTokenizer of `source` (the hub when reachable, else the cache: the environment decides; never a folder's
    code), checked."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise ScaletrainError(f"cannot load the tokenizer of {source!r} "
                              f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})") from None
    return check_tokenizer(tok, source)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m scaletrain.measure.probe tokenizer-check SOURCE", file=sys.stderr)
        return 2
    try:
        load_checked(args[0])
    except ScaletrainError as e:
        print(f"scaletrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


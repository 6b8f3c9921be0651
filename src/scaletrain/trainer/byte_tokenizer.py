"""The bundled trainer's byte tokenizer (data.ByteTokenizer) as a real transformers tokenizer, for exports.

Why: a random-init run trains on UTF-8 bytes shifted past three specials (pad 0, bos 1, eos 2). Its export is a
model transformers loads, but without a tokenizer nothing turns text into those ids, so the model could not
generate text. This builds the same mapping with the `tokenizers` library: a byte-level BPE with no merges (each byte
is one token, mapped to id 3 + byte), GPT-2's byte ↔ character alphabet, the three specials at ids 0-2, a
byte-level decoder, no tokens added around a text (ByteTokenizer adds none). `AutoTokenizer.from_pretrained(folder)`
loads it as a PreTrainedTokenizerFast and encodes every text to exactly the ids the run trained on.

A vocabulary below 259 ids folds bytes together (several bytes share an id): no tokenizer can invert that, so
none is built (`None`).
"""

from __future__ import annotations

from typing import Any

from scaletrain.trainer.data import ByteTokenizer

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")          # ids 0, 1, 2: ByteTokenizer's pad, bos, eos


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (what the `tokenizers` ByteLevel pre-tokenizer emits)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def byte_tokenizer_fast(vocab_size: int) -> Any:
    """A PreTrainedTokenizerFast with ByteTokenizer(vocab_size)'s ids, or None when the vocabulary folds bytes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ref = ByteTokenizer(vocab_size)
    if vocab_size < ref.SPECIALS + ref.BYTE_VALUES:
        return None
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: ref.SPECIALS + b for b, ch in byte_alphabet().items()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS[ref.pad_id],
                                   bos_token=SPECIAL_TOKENS[ref.bos_id], eos_token=SPECIAL_TOKENS[ref.eos_id],
                                   split_special_tokens=True)     # "<s>" in a text is bytes, as in training

"""A transformers tokenizer for random-init runs: the bundled ByteTokenizer's ids (pad 0, bos 1, eos 2, byte b → 3 + b)
as a PreTrainedTokenizerFast, built in memory from `tokenizers` (no files, no hub).

TRL's trainers need a real `processing_class` (they tokenize, pad and decode with it); the SFT loop needs only
`data.ByteTokenizer`. The two agree id for id, so a random-init model sees the same tokens under either loop.
"""

from __future__ import annotations

from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer.data import ByteTokenizer

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")   # ids 0, 1, 2 as in ByteTokenizer and the tiny catalog configs


def byte_level_tokenizer(vocab_size: int) -> Any:
    """One token per UTF-8 byte (ids 3…258) plus pad/bos/eos; the model's vocabulary must hold all 259 ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    need = ByteTokenizer.SPECIALS + ByteTokenizer.BYTE_VALUES
    if vocab_size < need:
        raise ScaletrainError(f"the byte-level tokenizer needs a vocabulary of {need} ids (the model has "
                              f"{vocab_size}); give model_source a model with its own tokenizer")
    alphabet = ByteLevel.alphabet()                 # the 256 printable stand-ins ByteLevel maps bytes to
    byte_chars = sorted(alphabet, key=_byte_of)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: ByteTokenizer.SPECIALS + i for i, ch in enumerate(byte_chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=1 << 20)


def _byte_of(ch: str) -> int:
    """The byte GPT-2's ByteLevel alphabet maps to `ch` (its bytes_to_unicode table, inverted)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))[ch]

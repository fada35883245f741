"""A synthetic byte-level BPE vocabulary for benchmarks of random-weight models.

The ``random:`` models' own tokenizer names its tokens ``<i>``, which have no bytes, so no
grammar can be matched against them. For structured-output benchmarks the model gets this
vocabulary instead (``model.tokenizer``): every byte, then pseudo-words shaped like a real BPE
vocabulary's (words with and without a leading space, capitalized words, numbers, runs of
punctuation and whitespace, non-Latin characters), which is what the cost of a grammar's masks
depends on.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

EOS = "<|endoftext|>"
_PUNCTUATION = "{}[]\":,.;!?()-_/\\<>=+*&%$#@'`|~^"
_NON_LATIN = "的一是不了人我在有他这为之大来以个中上们éèàüößñçøåæ日本語中文한국어абвгдежзийклмнопрстуфхцчшщыэюя"


def _byte_level_char() -> dict[int, str]:
    """Byte-level BPE's character for each byte (GPT-2's printable mapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + shifted)
            shifted += 1
    return chars


def _pseudo_word(rng: random.Random) -> str:
    kind = rng.random()
    letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 10)))
    if kind < 0.35:
        return " " + letters
    if kind < 0.55:
        return letters
    if kind < 0.65:
        return " " + letters.capitalize()
    if kind < 0.70:
        return "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 3)))
    if kind < 0.82:
        return "".join(rng.choice(_PUNCTUATION + " ") for _ in range(rng.randint(1, 4)))
    if kind < 0.85:
        return "".join(rng.choice(" \n\t") for _ in range(rng.randint(1, 8)))
    return (" " if rng.random() < 0.3 else "") + "".join(
        rng.choice(_NON_LATIN) for _ in range(rng.randint(1, 3))
    )


def write_tokenizer(directory: str | Path, vocab_size: int, seed: int = 0) -> Path:
    """Write a ``vocab_size``-token byte-level BPE tokenizer (``tokenizer.json`` and a
    ``tokenizer_config.json`` naming its EOS, id 0) into ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = _byte_level_char()
    vocab: dict[str, int] = {EOS: 0}
    for b in range(256):
        vocab[chars[b]] = len(vocab)
    rng = random.Random(seed)
    while len(vocab) < vocab_size:
        word = "".join(chars[b] for b in _pseudo_word(rng).encode("utf-8"))
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS])
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": EOS, "add_bos_token": False})
    )
    return root

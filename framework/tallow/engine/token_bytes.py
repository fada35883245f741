"""The served vocabulary as raw bytes: what a grammar backend matches tokens against.

A tokenizer stores its tokens in an encoding of its own. Byte-level BPE (GPT-2, Llama 3,
Qwen) writes every byte as one printable character; SentencePiece-style vocabularies write a
space as ``▁`` and, with byte fallback, bytes as ``<0xNN>`` tokens; added tokens are plain
text. :func:`tokenizer_info` undoes that encoding, so that ``token_bytes[t]`` is exactly what
token ``t`` adds to an output, and marks special tokens (which add no text) as None.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterator

from tallow.plugin import TokenizerInfo

from .tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE_MARK = "\u2581"  # SentencePiece's "▁"


@functools.lru_cache(maxsize=1)
def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's character for each byte, inverted: bytes that print as themselves keep
    their character, the others (controls, space, a few Latin-1 ones) are written as
    U+0100 onwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(0x100 + shifted)] = b
            shifted += 1
    return table


def _decoder_types(
    node: Any,
) -> Iterator[str]:  # Any: a node of tokenizer.json's decoder, parsed JSON
    """The types of a tokenizer.json decoder and of the decoders it chains."""
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            yield node["type"]
        for child in node.get("decoders") or ():
            yield from _decoder_types(child)


def _encoding(tokenizer: Tokenizer) -> str:
    """How the vocabulary writes bytes: "byte_level", "sentencepiece" or "plain"."""
    backend = tokenizer.backend
    spec = json.loads(backend.to_str())
    types = set(_decoder_types(spec.get("decoder")))
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"ByteFallback", "Metaspace"} or getattr(backend.model, "byte_fallback", False):
        return "sentencepiece"
    if types & {"WordPiece", "BPEDecoder", "CTC"}:
        raise ValueError(
            f"the tokenizer's decoder ({', '.join(sorted(types))}) changes text "
            "between tokens, so its tokens have no fixed bytes; structured outputs "
            "need a byte-level BPE or SentencePiece-style vocabulary"
        )
    return "plain"


def vocabulary_problem(tokenizer: Tokenizer) -> str | None:
    """Why the tokens of ``tokenizer`` have no fixed bytes (so no grammar can be matched
    against them), or None when :func:`tokenizer_info` can describe them."""
    try:
        _encoding(tokenizer)
    except ValueError as exc:
        return str(exc)
    return None


def _token_bytes(text: str, encoding: str) -> bytes:
    if encoding == "byte_level":
        chars = _byte_level_chars()
        try:
            return bytes(chars[c] for c in text)
        except KeyError:  # not byte-level encoded after all (a hand-added token)
            return text.encode("utf-8")
    if encoding == "sentencepiece":
        found = _BYTE_TOKEN.fullmatch(text)
        if found:
            return bytes([int(found.group(1), 16)])
        return text.replace(_SPACE_MARK, " ").encode("utf-8")
    return text.encode("utf-8")


def tokenizer_info(
    tokenizer: Tokenizer, vocab_size: int, eos_token_ids: set[int] | None = None
) -> TokenizerInfo:
    """The :class:`tallow.plugin.TokenizerInfo` of ``tokenizer`` for logits ``vocab_size``
    wide: each token's bytes (None for special tokens and for ids the tokenizer lacks), and the
    ids that end an output (``eos_token_ids``, by default the tokenizer's). Raises ValueError
    for a vocabulary whose tokens have no fixed bytes (WordPiece)."""
    encoding = _encoding(tokenizer)
    backend = tokenizer.backend
    added = backend.get_added_tokens_decoder()
    special = set(tokenizer.all_special_ids)
    table: list[bytes | None] = [None] * vocab_size
    for text, token in backend.get_vocab(with_added_tokens=True).items():
        if token >= vocab_size or token in special:
            continue
        if token in added:
            # added tokens are stored as the text they stand for, never byte-encoded
            value = None if added[token].special else added[token].content.encode()
        else:
            value = _token_bytes(text, encoding)
        table[token] = value or None  # a token that adds no text cannot advance a grammar
    ends = eos_token_ids if eos_token_ids is not None else tokenizer.eos_token_ids
    return TokenizerInfo(
        vocab_size=vocab_size,
        token_bytes=tuple(table),
        eos_token_ids=tuple(sorted(t for t in ends if t < vocab_size)),
    )

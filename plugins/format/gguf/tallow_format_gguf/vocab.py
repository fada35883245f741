"""The vocabulary arrays of a GGUF file (``tokenizer.ggml.*``), read and checked.

Shared by the tokenizer builders of each vocabulary kind (:mod:`.vocab_bpe`, :mod:`.vocab_spm`,
:mod:`.vocab_wpm`).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("tallow.gguf")

# llama.cpp token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class TokenizerBuildError(ValueError):
    """The GGUF vocabulary metadata cannot be turned into a tokenizer."""


def token_list(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise TokenizerBuildError(
            "GGUF metadata key 'tokenizer.ggml.tokens' is missing or empty; "
            "expected the vocabulary as a list of strings"
        )
    return tokens


def token_types(metadata: dict[str, Any], n: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return [NORMAL] * n
    if len(types) != n:
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.token_type' has {len(types)} entries, expected "
            f"{n} (one per token)"
        )
    return [int(t) for t in types]


def merge_pairs(metadata: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` as pairs. Each entry is ``"left right"``, cut at the first space
    after the first character (a left part may itself be a space, as in Gemma 4's merges)."""
    merges_raw = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges_raw, list):
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.merges' is missing; a "
            f"{kind!r} vocabulary needs its merges"
        )
    # Fast path (hundreds of thousands of merges): no entry starts with a space, each has one.
    try:
        merges = [(left, right) for left, right in (line.split(" ", 1) for line in merges_raw)]
    except (AttributeError, ValueError):
        merges = []
    if len(merges) == len(merges_raw) and all(
        left and right and left[0] != " " for left, right in merges
    ):
        return merges
    merges = []
    for i, line in enumerate(merges_raw):
        cut = line.find(" ", 1) if isinstance(line, str) else -1
        if cut < 0 or cut == len(line) - 1:
            raise TokenizerBuildError(
                f"tokenizer.ggml.merges[{i}] = {line!r}: expected two tokens separated by one space"
            )
        merges.append((line[:cut], line[cut + 1 :]))
    return merges


def unique_vocab(tokens: list[str]) -> dict[str, int]:
    """token → id; a repeated spelling (unused padding slots) gets a placeholder name so that every
    id keeps a vocabulary entry and the vocabulary keeps its size."""
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            log.debug("GGUF vocab: token %d repeats %r (token %d); renamed", i, tok, vocab[tok])
            tok = f"<tallow-duplicate-{i}>"
        vocab[tok] = i
    return vocab

"""Tokenizers for BPE vocabularies with merge lists: ``tokenizer.ggml.model`` ``gpt2`` and
``gemma4``.

- ``gpt2``: byte-level BPE. Tokens are spelled in GPT-2's byte alphabet; the text is cut by the
  patterns of its ``tokenizer.ggml.pre`` family (:mod:`.pretokenizers`), each piece's UTF-8
  bytes are spelled in that alphabet and merged.
- ``gemma4``: BPE over characters, SentencePiece style. Spaces are written ``▁``, the text is cut
  only into runs of newlines and runs of anything else, and characters that no token covers fall
  back to ``<0xNN>`` byte tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from .pretokenizers import (
    GPT2,
    KNOWN_PRE_NAMES,
    NEWLINE_RUNS,
    PreTokenizerSpec,
    spec_for,
    split_sequence,
)
from .vocab import merge_pairs, unique_vocab

log = logging.getLogger("tallow.gguf")


def pre_tokenizer_spec(metadata: dict[str, Any]) -> PreTokenizerSpec:
    """The split of the file's ``tokenizer.ggml.pre``; an unknown name falls back to GPT-2's
    split, with a warning (llama.cpp refuses such a file)."""
    pre = metadata.get("tokenizer.ggml.pre")
    spec = spec_for(pre)
    if spec is None:
        log.warning(
            "GGUF tokenizer.ggml.pre %r is not known to tallow; splitting text as GPT-2 "
            "does (known: %s)",
            pre,
            ", ".join(sorted(KNOWN_PRE_NAMES)),
        )
        spec = PreTokenizerSpec((GPT2,))
    return spec


def byte_level_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # Tokens are kept as the file spells them: one outside the byte alphabet (Command-R lists
    # some emoji as raw text) is never produced by merging, as in llama.cpp.
    spec = pre_tokenizer_spec(metadata)
    tok = Tokenizer(
        models.BPE(
            vocab=unique_vocab(tokens),
            merges=merge_pairs(metadata, "gpt2"),
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=spec.ignore_merges,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *split_sequence(spec.splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def gemma4_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(
        models.BPE(
            vocab=unique_vocab(tokens),
            merges=merge_pairs(metadata, "gemma4"),
            fuse_unk=False,
            byte_fallback=True,
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Sequence(split_sequence((NEWLINE_RUNS,)))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok

"""Tokenizers for SentencePiece BPE vocabularies (``tokenizer.ggml.model = "llama"``).

Tokens use ``▁`` for spaces, bytes no token covers fall back to ``<0xNN>`` tokens, and the merge
order follows ``tokenizer.ggml.scores`` (a higher score merges first). As in llama.cpp, the whole
text is merged at once (no cutting at spaces), and with ``tokenizer.ggml.add_space_prefix`` (the
default) a space is put before the text and before the text after every token matched whole
(a user-defined one; with special tokens parsed, a control one too).
"""

from __future__ import annotations

from typing import Any

from .vocab import (
    BYTE,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    TokenizerBuildError,
    merge_pairs,
    unique_vocab,
)


def sentencepiece_merges(
    tokens: list[str], types: list[int], scores: list[float]
) -> list[tuple[str, str]]:
    """BPE merges implied by a scored SentencePiece vocabulary: ``a b`` for every normal or
    user-defined token ``ab`` whose halves are tokens.

    SentencePiece matches user-defined pieces before anything else, so merges building them
    come first, in vocabulary order; then merges building normal pieces, by score (higher
    first). Ties fall to the vocabulary order of the result, then to the longer left part.
    """
    index = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, BYTE)}
    ranked: list[tuple[int, float, int, int, int, int, int, str, str]] = []
    for tok_id, tok in enumerate(tokens):
        kind = types[tok_id]
        if kind not in (NORMAL, USER_DEFINED) or len(tok) < 2:
            continue
        group = 0 if kind == USER_DEFINED else 1
        score = 0.0 if kind == USER_DEFINED else -scores[tok_id]
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in index and right in index:
                ranked.append(
                    (
                        group,
                        score,
                        tok_id,
                        -len(left),
                        -len(right),
                        index[left],
                        index[right],
                        left,
                        right,
                    )
                )
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def respell_space_runs(tokens: list[str]) -> tuple[list[str], set[int]]:
    """Write the spaces of whitespace-only SentencePiece tokens as ``▁``.

    Some converters store runs of spaces (Gemma's ``"  "`` … 31 spaces) as literal spaces. The
    normalizer turns every space of the text into ``▁``, so those tokens could never be produced;
    spelled with ``▁`` they are reached by merges, as in the model's own fast tokenizer. Returns the
    new token list and the ids that changed.
    """
    out = list(tokens)
    changed: set[int] = set()
    for i, tok in enumerate(tokens):
        if tok and " " in tok and not tok.strip():
            out[i] = tok.replace(" ", "▁")
            changed.add(i)
    return out, changed


def sentencepiece_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = metadata.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise TokenizerBuildError(
            "GGUF metadata key 'tokenizer.ggml.scores' is missing or not "
            "one score per token; a 'llama' (SentencePiece) vocabulary "
            "needs it to order merges"
        )
    if isinstance(metadata.get("tokenizer.ggml.merges"), list):
        merges = merge_pairs(metadata, "llama")
    else:
        merges = sentencepiece_merges(tokens, types, [float(s) for s in scores])
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None and UNKNOWN in types:
        unk_id = types.index(UNKNOWN)
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(
        models.BPE(
            vocab=unique_vocab(tokens),
            merges=merges,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    # A normalizer rather than the Metaspace pre-tokenizer: Metaspace adds no prefix to text that
    # already starts with a space, llama.cpp (and SentencePiece) always do.
    escape = normalizers.Replace(" ", "▁")
    tok.normalizer = (
        normalizers.Sequence([normalizers.Prepend("▁"), escape]) if add_prefix else escape
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok

"""Tokenizers for WordPiece vocabularies (``tokenizer.ggml.model = "bert"``).

llama.cpp's converter writes a BERT vocabulary with ``▁`` before every piece that starts a word
(``the`` → ``▁the``) and drops the ``##`` of the pieces that continue one (``##s`` → ``s``). The
``tokenizers`` WordPiece model works the other way round, so the pieces are spelled back:
``▁the`` → ``the``, ``s`` → ``##s``; ids are unchanged. Text is normalized as BERT's tokenizer
does (control characters dropped, lower case and accents stripped unless
``tokenizer.ggml.normalizer.lowercase`` / ``strip_accents`` say otherwise, CJK characters cut
apart), split at whitespace and punctuation, and each word becomes the longest pieces from the
left, or ``[UNK]`` when some part of it matches no piece.
"""

from __future__ import annotations

from typing import Any

from .vocab import NORMAL, TokenizerBuildError, unique_vocab

#: Word start marker of llama.cpp's BERT vocabularies, and the continuation prefix of WordPiece.
WORD_START, CONTINUATION = "▁", "##"


def wordpiece_spelling(tokens: list[str], types: list[int]) -> list[str]:
    """The vocabulary spelled as WordPiece expects: word starts bare, continuations ``##``.
    Tokens other than normal ones (``[CLS]``, ``[UNK]``, ...) keep their text."""
    spelled = []
    for tok, kind in zip(tokens, types):
        if kind != NORMAL:
            spelled.append(tok)
        elif tok.startswith(WORD_START) and len(tok) > len(WORD_START):
            spelled.append(tok[len(WORD_START) :])
        else:
            spelled.append(CONTINUATION + tok)
    return spelled


def wordpiece_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 100)
    if not isinstance(unk_id, int) or not 0 <= unk_id < len(tokens):
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.unknown_token_id' is {unk_id!r}; a 'bert' "
            f"(WordPiece) vocabulary needs an unknown token id below {len(tokens)}"
        )
    lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip_accents = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    # No length limit on words: llama.cpp splits words of any length into pieces.
    tok = Tokenizer(
        models.WordPiece(
            vocab=unique_vocab(wordpiece_spelling(tokens, types)),
            unk_token=tokens[unk_id],
            continuing_subword_prefix="##",
            max_input_chars_per_word=1 << 30,
        )
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION, cleanup=True)
    return tok

"""The incremental detokenizer on small byte-level and SentencePiece-style tokenizers built with
the tokenizers library: multi-byte characters split over tokens, leading spaces, special tokens,
and (property) that the streamed text always adds up to ``decode(ids)``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tallow.engine.detokenizer import IncrementalDetokenizer
from tallow.engine.tokenizer import Tokenizer


def _byte_alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def byte_level_tokenizer() -> Tokenizer:
    """Byte-level BPE whose vocabulary has the 256 bytes and a few ASCII merges only, so every
    non-ASCII character takes several tokens."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {c: i for i, c in enumerate(_byte_alphabet())}
    merges = [
        ("H", "e"),
        ("He", "l"),
        ("Hel", "l"),
        ("Hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("l", "d"),
        ("Ġwor", "ld"),
    ]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    return Tokenizer(tok, {"eos_token": "<|end|>", "add_bos_token": False})


def sentencepiece_tokenizer() -> Tokenizer:
    """SentencePiece-style BPE: ``▁`` marks spaces, byte fallback for unknown characters, and a
    decoder that drops the space the pre-tokenizer put in front of the text."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [
        "▁",
        *"abcdehlorw",
        "▁H",
        "H",
        "el",
        "lo",
        "▁w",
        "or",
        "ld",
        "▁wor",
        "▁world",
        "▁Hel",
        "▁Hello",
    ]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [
        ("▁", "H"),
        ("e", "l"),
        ("l", "o"),
        ("▁", "w"),
        ("o", "r"),
        ("l", "d"),
        ("▁w", "or"),
        ("▁wor", "ld"),
        ("▁H", "el"),
        ("▁Hel", "lo"),
    ]
    tok = HFTokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    )
    return Tokenizer(
        tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    )


BYTE_LEVEL = byte_level_tokenizer()
SENTENCEPIECE = sentencepiece_tokenizer()


def stream(tok: Tokenizer, ids: list[int], skip: bool = True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, [1, 2, 3], skip_special_tokens=skip)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return pieces, detok.text


def test_emoji_split_over_four_tokens_is_held_until_complete():
    ids = BYTE_LEVEL.encode("Hello 🎉!")
    assert len(ids) == 7  # Hello, Ġ, four bytes of the emoji, !
    pieces, text = stream(BYTE_LEVEL, ids)
    assert pieces == ["Hello", " ", "", "", "", "🎉", "!", ""]
    assert text == "Hello 🎉!" == BYTE_LEVEL.decode(ids)


def test_cjk_split_over_tokens():
    ids = BYTE_LEVEL.encode("日本語")
    assert len(ids) == 9
    pieces, text = stream(BYTE_LEVEL, ids)
    assert [p for p in pieces if p] == ["日", "本", "語"]
    assert text == "日本語"


def test_sentencepiece_leading_spaces():
    ids = SENTENCEPIECE.encode("Hello world", add_special_tokens=False)
    assert [SENTENCEPIECE.convert_ids_to_tokens(i) for i in ids] == ["▁Hello", "▁world"]
    pieces, text = stream(SENTENCEPIECE, ids)
    # the first token's space is the one the decoder drops at the start of a text
    assert pieces[:2] == ["Hello", " world"]
    assert text == SENTENCEPIECE.decode(ids) == "Hello world"


def test_sentencepiece_byte_fallback_emoji():
    ids = SENTENCEPIECE.encode("Hello 🎉 world", add_special_tokens=False)
    tokens = SENTENCEPIECE.convert_ids_to_tokens(ids)
    assert tokens == ["▁Hello", "▁", "<0xF0>", "<0x9F>", "<0x8E>", "<0x89>", "▁world"]
    pieces, text = stream(SENTENCEPIECE, ids)
    # a run of byte tokens is held until a non-byte token ends it (see the next test)
    assert pieces == ["Hello", " ", "", "", "", "", "🎉 world", ""]
    assert text == "Hello 🎉 world"


def test_byte_run_made_invalid_by_a_later_byte():
    # The byte-fallback decoder replaces every byte of an invalid run, including an "A" that
    # decoded fine on its own; nothing of the run may be emitted before the run ends.
    a, bad = SENTENCEPIECE.convert_tokens_to_ids(["<0x41>", "<0x80>"])
    assert SENTENCEPIECE.decode([a]) == "A"
    assert SENTENCEPIECE.decode([a, bad]) == "\ufffd\ufffd"
    pieces, text = stream(SENTENCEPIECE, [a, bad])
    assert pieces == ["", "", "\ufffd\ufffd"] and text == "\ufffd\ufffd"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(skip):
    ids = (
        SENTENCEPIECE.encode("Hello", add_special_tokens=True)
        + [2]
        + SENTENCEPIECE.encode("world", add_special_tokens=False)
    )
    pieces, text = stream(SENTENCEPIECE, ids, skip=skip)
    assert text == SENTENCEPIECE.decode(ids, skip_special_tokens=skip)
    assert ("<s>" in text) is (not skip) and ("</s>" in text) is (not skip)
    end = BYTE_LEVEL.convert_tokens_to_ids("<|end|>")
    ids = BYTE_LEVEL.encode("Hello") + [end]
    assert stream(BYTE_LEVEL, ids, skip=skip)[1] == ("Hello" if skip else "Hello<|end|>")


def test_incomplete_character_at_the_end_is_flushed():
    ids = BYTE_LEVEL.encode("a🎉")[:-1]  # the emoji's last byte never comes
    detok = IncrementalDetokenizer(BYTE_LEVEL, [])
    assert "".join(detok.push(i) for i in ids) == "a"
    assert detok.flush() == "\ufffd"
    assert detok.text == BYTE_LEVEL.decode(ids)
    assert detok.flush() == ""  # idempotent


def test_push_many_and_options():
    ids = BYTE_LEVEL.encode("Hello world 🎉")
    detok = IncrementalDetokenizer(BYTE_LEVEL, [], spaces_between_special_tokens=False)
    out = detok.push_many(ids[:3]) + detok.push_many(ids[3:]) + detok.flush()
    assert out == detok.text == "Hello world 🎉"
    assert detok.output_token_ids == ids


def _ids(tok: Tokenizer) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, tok.vocab_size - 1), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ids=_ids(BYTE_LEVEL), skip=st.booleans())
def test_stream_adds_up_to_decode_byte_level(ids, skip):
    _check_stream(BYTE_LEVEL, ids, skip)


@settings(max_examples=300, deadline=None)
@given(ids=_ids(SENTENCEPIECE), skip=st.booleans())
def test_stream_adds_up_to_decode_sentencepiece(ids, skip):
    _check_stream(SENTENCEPIECE, ids, skip)


def _check_stream(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    final = tok.decode(ids, skip_special_tokens=skip)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
    for i in ids:
        piece = detok.push(i)
        assert not piece.endswith("\ufffd") or False
        assert final.startswith(detok.text), (detok.text, final)
    detok.flush()
    assert detok.text == final

"""The vocabulary as raw bytes (what grammar backends match against): the bytes of a text's
tokens, put together, are the text, for byte-level BPE (the real Qwen2.5 vocabulary) and for
SentencePiece-style vocabularies with byte fallback; special tokens have none."""

from __future__ import annotations

import random

import pytest

from tallow.engine.token_bytes import tokenizer_info
from tallow.engine.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    '{"name": "Zürich", "temp": -3.5}',
    "日本語のテキスト 🎉👩‍👩‍👧",
    "tabs\tand\nnewlines\r\n",
    "  spaces  ",
    "<tool_call>\n{}\n</tool_call>",
    "x" * 50,
]


@pytest.fixture(scope="module")
def qwen(qwen_gguf) -> Tokenizer:
    from tallow.plugin.testing import isolated_plugin_manager

    pm = isolated_plugin_manager(("tallow-format-gguf", "tallow_format_gguf.plugin"))
    return Tokenizer.from_checkpoint(
        pm.registries.weight_formats.get("gguf")().load(str(qwen_gguf))
    )


def joined(info, ids: list[int]) -> bytes:
    return b"".join(info.token_bytes[i] for i in ids)


def test_byte_level_bpe_tokens_spell_the_text(qwen):
    info = tokenizer_info(qwen, 151936)
    assert info.vocab_size == 151936 and len(info.token_bytes) == 151936
    for text in TEXTS:
        assert joined(info, qwen.encode(text, add_special_tokens=False)) == text.encode(), text
    rng = random.Random(0)  # any token sequence: its bytes decode to what the tokenizer says
    for _ in range(200):
        ids = [rng.randrange(151643) for _ in range(rng.randint(1, 6))]
        assert joined(info, ids).decode("utf-8", "replace") == qwen.decode(ids)
    for special in qwen.all_special_ids:
        assert info.token_bytes[special] is None
    assert set(info.eos_token_ids) == qwen.eos_token_ids
    tool_call = qwen.encode("<tool_call>", add_special_tokens=False)
    assert len(tool_call) == 1 and info.token_bytes[tool_call[0]] == b"<tool_call>"


def sentencepiece_tokenizer() -> Tokenizer:
    """A BPE vocabulary in SentencePiece's spelling ("▁" for spaces) with <0xNN> byte tokens
    for what it lacks, and Llama's decoder."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    base = HF(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    base.train_from_iterator(["hello world the quick brown fox", "a b c d e"] * 20, trainer)
    vocab = base.get_vocab()
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
        for m in __import__("json").loads(base.to_str())["model"]["merges"]
    ]
    tok = HF(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})


def test_sentencepiece_tokens_spell_the_text_with_its_leading_space():
    tok = sentencepiece_tokenizer()
    info = tokenizer_info(tok, tok.vocab_size + 3)
    for text in ("hello world", "the fox ü€", "日本 {x}"):
        ids = tok.encode(text, add_special_tokens=False)
        assert (
            any(
                info.token_bytes[i] is not None
                and len(info.token_bytes[i]) == 1
                and info.token_bytes[i][0] >= 0x80
                for i in ids
            )
            or text.isascii()
        )
        # SentencePiece writes the leading space that decoding strips
        assert joined(info, ids) == (" " + text).encode(), text
    assert info.token_bytes[tok.eos_token_id] is None
    assert info.token_bytes[-1] is None  # ids past the tokenizer's vocabulary


def test_wordpiece_vocabularies_are_refused(qwen):
    from tallow.engine.token_bytes import vocabulary_problem
    from tallow.plugin.testing import tiny_tokenizer

    wordpiece = Tokenizer(tiny_tokenizer(), {"eos_token": "</s>"})
    with pytest.raises(ValueError, match="WordPiece"):
        tokenizer_info(wordpiece, 64)
    assert "WordPiece" in vocabulary_problem(wordpiece)
    assert vocabulary_problem(qwen) is None

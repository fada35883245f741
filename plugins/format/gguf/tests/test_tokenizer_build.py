"""Tokenizers built from GGUF vocabularies, against transformers loading the same GGUF file.

The vocabularies are trained here (byte-level BPE and SentencePiece-style BPE) and written into
small GGUF files, so every pre-tokenizer family and the SentencePiece path are exercised without
downloading anything.
"""

from __future__ import annotations

import pathlib

import pytest

import gguf_synthetic as gs
from gguf_synthetic import TEXTS
from tallow_format_gguf.format import GGUFFormat
from tallow_format_gguf.tokenizer import TokenizerBuildError, build_tokenizer


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=True).ids


def _compare_with_transformers(path: pathlib.Path, texts: list[str] = TEXTS) -> None:
    from transformers import AutoTokenizer

    checkpoint = GGUFFormat().load(str(path))
    ours = checkpoint.tokenizer
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert ours.get_vocab_size(with_added_tokens=True) == len(ref)
    for text in texts:
        ids = _encode(ours, text)
        assert ids == ref(text).input_ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)


# transformers splits by these five families' own patterns (and by GPT-2's for any other name,
# where tallow follows llama.cpp instead: see test_default_pre_splits_as_llama_cpp).
@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt-2", "gpt-4o", "tekken"])
def test_byte_level_matches_transformers(tmp_path, pre):
    _compare_with_transformers(gs.write_byte_level_gguf(tmp_path / f"bl-{pre}.gguf", pre))


def test_sentencepiece_matches_transformers(tmp_path):
    path = gs.write_sentencepiece_gguf(tmp_path / "sp.gguf")[0]
    # transformers' Llama tokenizer puts a space only before the whole text, and none before
    # text that starts with one; llama.cpp (like Llama's own tokenizer.json) puts one before
    # every stretch of text, also after a token matched whole, as its llama-spm vectors show
    # (test_llama_cpp_vocabs), and so does tallow. The texts where the two differ are left out.
    specials = ("<s>", "</s>", "<unk>")
    _compare_with_transformers(
        path, [t for t in TEXTS if not t.startswith(" ") and not any(s in t for s in specials)]
    )


def test_sentencepiece_always_prefixes_a_space(tmp_path):
    tok = GGUFFormat().load(str(gs.write_sentencepiece_gguf(tmp_path / "sp.gguf")[0])).tokenizer
    for text in ("x", " x", "  x"):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert "".join(tok.id_to_token(i) for i in ids) == "▁" + text.replace(" ", "▁")
        assert tok.decode(ids) == text
    # ... and before the text after a token matched whole, as llama.cpp does
    bos = tok.token_to_id("<s>")
    assert tok.encode("<s>x", add_special_tokens=False).ids == [
        bos,
        *tok.encode("x", add_special_tokens=False).ids,
    ]


def test_sentencepiece_byte_fallback_and_bos(tmp_path):
    path = gs.write_sentencepiece_gguf(tmp_path / "sp.gguf")[0]
    ck = GGUFFormat().load(str(path))
    tok = ck.tokenizer
    ids = _encode(tok, "🎉")
    assert ids[0] == 1  # add_bos_token
    pieces = [tok.id_to_token(i) for i in ids[1:]]
    # "▁" then the four UTF-8 bytes of the emoji, none of which the trained vocabulary has
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0x8E>", "<0x89>"]
    assert tok.decode(ids) == "🎉"
    assert ck.tokenizer_config["add_bos_token"] is True
    assert ck.tokenizer_config["bos_token"] == "<s>" and ck.tokenizer_config["unk_token"] == "<unk>"


def test_pre_tokenizer_follows_tokenizer_ggml_pre(tmp_path):
    splits = {}
    for pre in ("qwen2", "llama-bpe"):
        ck = GGUFFormat().load(str(gs.write_byte_level_gguf(tmp_path / f"{pre}.gguf", pre)))
        splits[pre] = [s for s, _ in ck.tokenizer.pre_tokenizer.pre_tokenize_str("x 1234567")]
    # Qwen2 splits digits one by one, Llama 3 in groups of up to three
    assert splits["qwen2"][-7:] == list("1234567")
    assert splits["llama-bpe"][-3:] == ["123", "456", "7"]


def test_default_pre_splits_as_llama_cpp(tmp_path):
    # llama.cpp's "default" (also used when tokenizer.ggml.pre is absent): punctuation runs, then
    # GPT-2's pattern, then digit runs, then groups of three digits.
    for pre in ("default", None):
        ck = GGUFFormat().load(str(gs.write_byte_level_gguf(tmp_path / f"{pre}.gguf", pre)))
        split = [s for s, _ in ck.tokenizer.pre_tokenizer.pre_tokenize_str("x += 12345;")]
        assert split == ["x", "Ġ", "+=", "Ġ", "123", "45", ";"], pre


def test_unknown_pre_falls_back_to_gpt2_split(tmp_path, caplog):
    ck = GGUFFormat().load(str(gs.write_byte_level_gguf(tmp_path / "x.gguf", "no-such-family")))
    assert "no-such-family" in caplog.text
    split = [s for s, _ in ck.tokenizer.pre_tokenizer.pre_tokenize_str("ab 12345")]
    assert split == ["ab", "Ġ12345"]


def test_control_and_user_tokens(tmp_path):
    ck = GGUFFormat().load(str(gs.write_byte_level_gguf(tmp_path / "q.gguf", "qwen2")))
    tok = ck.tokenizer
    decoder = tok.get_added_tokens_decoder()
    by_text = {t.content: (i, t.special) for i, t in decoder.items()}
    for text in gs.BYTE_LEVEL_SPECIALS:
        assert by_text[text][1] is True
    for text in gs.BYTE_LEVEL_USER:
        assert by_text[text][1] is False
    ids = tok.encode("<|im_end|><tool_call>").ids
    assert ids == [by_text["<|im_end|>"][0], by_text["<tool_call>"][0]]
    # a control token is dropped by skip_special_tokens, a user-defined one is not
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>"
    # both <|endoftext|> and <|im_end|> end generation
    assert ck.generation_config["eos_token_id"] == sorted(
        by_text[t][0] for t in ("<|endoftext|>", "<|im_end|>")
    )


def test_chat_templates_from_metadata(tmp_path):
    meta = _metadata(tmp_path)
    meta["tokenizer.chat_template"] = "{{ messages[0].content }}"
    meta["tokenizer.chat_template.tool_use"] = "{{ tools | length }}"
    _, config, _ = build_tokenizer(meta)
    assert config["chat_template"] == "{{ messages[0].content }}"
    assert config["named_chat_templates"] == {"tool_use": "{{ tools | length }}"}


def _metadata(tmp_path):
    from tallow_format_gguf.reader import open_gguf

    return dict(open_gguf(gs.write_byte_level_gguf(tmp_path / "m.gguf", "qwen2")).metadata)


def test_unsupported_tokenizer_model_is_reported(tmp_path):
    meta = _metadata(tmp_path)
    meta["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(TokenizerBuildError, match=r"tokenizer\.ggml\.model.*'rwkv'"):
        build_tokenizer(meta)


def test_missing_merges_is_reported(tmp_path):
    meta = _metadata(tmp_path)
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerBuildError, match=r"tokenizer\.ggml\.merges"):
        build_tokenizer(meta)


def test_token_type_length_mismatch_is_reported(tmp_path):
    meta = _metadata(tmp_path)
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:-1]
    with pytest.raises(TokenizerBuildError, match=r"token_type.*expected"):
        build_tokenizer(meta)


def test_checkpoint_without_tokenizer_says_why(tmp_path):
    import gguf

    path = tmp_path / "notok.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    gs._base_metadata(writer, "llama", 0)
    writer.add_tokenizer_model("rwkv")
    writer.add_token_list(["[PAD]", "a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ck = GGUFFormat().load(str(path))
    assert ck.tokenizer is None
    assert "tokenizer.ggml.model" in ck.extra["tokenizer_error"]

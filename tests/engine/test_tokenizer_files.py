"""Tokenizer from tokenizer.json + tokenizer_config.json directories, against transformers
loading the same directory: BOS/EOS rules, special tokens, eos ids, chat template lookup."""

from __future__ import annotations

import json

import pytest

from tallow.engine.chat_template import ChatTemplateError
from tallow.engine.tokenizer import Tokenizer

TEXTS = ["Hello world", "  spaced  out ", "<s> inside </s>", "", "naïve 日本 🎉"]


def _backend(post_bos: bool):
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [
        "▁",
        *"Habcdehlnorstuw",
        "▁H",
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
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=merges,
            unk_token="<unk>",
            fuse_unk=True,
            byte_fallback=True,
        )
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
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return tok


def _write(root, post_bos: bool, config: dict, generation: dict | None = None):
    root.mkdir(parents=True, exist_ok=True)
    _backend(post_bos).save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config})
    )
    if generation is not None:
        (root / "generation_config.json").write_text(json.dumps(generation))
    return root


CASES = {
    # the tokenizer.json post-processor decides, whatever the flags say
    "template": (True, {"bos_token": "<s>", "eos_token": "</s>"}),
    "template-over-flag": (True, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}),
    "no-template": (False, {"bos_token": "<s>", "eos_token": "</s>"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers(tmp_path, case):
    from transformers import AutoTokenizer

    post_bos, config = CASES[case]
    root = _write(tmp_path / case, post_bos, config)
    ours = Tokenizer.from_directory(root)
    ref = AutoTokenizer.from_pretrained(str(root))
    for text in TEXTS:
        for add in (True, False):
            ids = ours.encode(text, add_special_tokens=add)
            assert ids == ref(text, add_special_tokens=add).input_ids, (text, add)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                    ids, skip_special_tokens=skip
                )
    assert ours.bos_token_id == ref.bos_token_id == 1
    assert ours.eos_token_id == ref.eos_token_id == 2


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"add_bos_token": True}, [1, 284, 282]),
        ({"add_bos_token": True, "add_eos_token": True}, [1, 284, 282, 2]),
        ({"add_eos_token": True}, [284, 282, 2]),
        ({}, [284, 282]),
    ],
)
def test_flags_build_a_missing_post_processor(tmp_path, flags, expected):
    config = {"bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>", **flags}
    tok = Tokenizer.from_directory(_write(tmp_path / "t", False, config))
    assert tok.encode("Hello world") == expected
    assert tok.encode("Hello world", add_special_tokens=False) == [284, 282]


def test_eos_ids_join_generation_config(tmp_path):
    root = _write(tmp_path / "t", False, {"eos_token": "</s>"}, {"eos_token_id": [2, 7]})
    tok = Tokenizer.from_directory(root)
    assert tok.eos_token_ids == {2, 7}
    assert tok.all_special_ids == [0, 1, 2]
    assert tok.byte_fallback_ids == frozenset(range(3, 259))


def test_chat_template_lookup(tmp_path):
    root = _write(
        tmp_path / "t",
        False,
        {
            "eos_token": "</s>",
            "chat_template": [
                {"name": "default", "template": "D{{ messages[0].content }}"},
                {"name": "tool_use", "template": "T{{ tools | length }}"},
            ],
        },
    )
    tok = Tokenizer.from_directory(root)
    msgs = [{"role": "user", "content": "x"}]
    assert tok.chat_template == "D{{ messages[0].content }}"
    assert tok.apply_chat_template(msgs) == "Dx"
    assert tok.apply_chat_template(msgs, tools=[{"type": "function"}]) == "T1"
    assert tok.apply_chat_template(msgs, chat_template="{{ eos_token }}") == "</s>"
    bare = Tokenizer.from_directory(_write(tmp_path / "bare", False, {"eos_token": "</s>"}))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template(msgs)


def test_named_templates_in_gguf_style_config_and_pickling(tmp_path):
    import pickle

    tok = Tokenizer(
        _backend(False),
        {"eos_token": "</s>", "chat_template": "D", "named_chat_templates": {"tool_use": "T"}},
    )
    msgs = [{"role": "user", "content": "x"}]
    assert tok.chat_template == "D"
    assert tok.apply_chat_template(msgs) == "D"
    assert tok.apply_chat_template(msgs, tools=[{"type": "function"}]) == "T"
    again = pickle.loads(pickle.dumps(tok))  # tokenizers may live in another process
    assert again.encode("Hello world") == tok.encode("Hello world")
    assert again.apply_chat_template(msgs) == "D"


def test_chat_template_jinja_file(tmp_path):
    root = _write(tmp_path / "t", False, {"bos_token": "<s>"})
    (root / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0].content }}")
    assert (
        Tokenizer.from_directory(root).apply_chat_template([{"role": "user", "content": "hi"}])
        == "<s>hi"
    )


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_directory(tmp_path)
    root = _write(tmp_path / "t", False, {})
    (root / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer.from_directory(root)
    with pytest.raises(ValueError, match="special token"):
        Tokenizer(_backend(False), {"bos_token": 5})
    with pytest.raises(TypeError, match="expects a str"):
        Tokenizer(_backend(False)).encode(b"bytes")  # type: ignore[arg-type]


def test_from_checkpoint_without_tokenizer_says_why():
    from tallow.plugin import Checkpoint

    ck = Checkpoint(
        source="m.gguf",
        config={},
        architecture="x",
        tensors=lambda: iter(()),
        extra={"tokenizer_error": "tokenizer.ggml.model 'rwkv' unsupported"},
    )
    with pytest.raises(ValueError, match=r"m\.gguf.*rwkv.*model\.tokenizer"):
        Tokenizer.from_checkpoint(ck)


def test_wordpiece_cleanup_only_when_asked():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", ",", "world", "!", "don", "'", "t"])}
    backend = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(cleanup=False)
    ids = backend.encode("hello, world!").ids
    assert Tokenizer(backend, {}).decode(ids) == "hello , world !"
    assert Tokenizer(backend, {"clean_up_tokenization_spaces": True}).decode(ids) == "hello, world!"


def _bert_like(tmp_path, truncation_side: str | None = None):
    """A WordPiece tokenizer with [CLS] ... [SEP] whose tokenizer.json pads and truncates every
    input to 8 tokens (as sentence-transformers' files do, to 128), saved with its config."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, processors

    vocab = {
        w: i
        for i, w in enumerate(
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "one", "two", "three", "four", "five", "six"]
        )
    }
    tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.enable_padding(length=8, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=8)
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    if truncation_side:
        config["truncation_side"] = truncation_side
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_padding_and_truncation_of_the_file_are_off_as_in_transformers(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    path = _bert_like(tmp_path)
    ours = Tokenizer.from_directory(path)
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    text = "one two three four five six one two three"
    assert ours.encode("one two") == ref("one two")["input_ids"] == [2, 4, 5, 3]
    assert ours.encode(text) == ref(text)["input_ids"]
    assert len(ours.encode(text)) == 11


@pytest.mark.parametrize("side", [None, "left"])
def test_encode_truncated_matches_transformers_truncation(tmp_path, side) -> None:
    transformers = pytest.importorskip("transformers")
    path = _bert_like(tmp_path, side)
    ours = Tokenizer.from_directory(path)
    ref = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"), truncation_side=side or "right"
    )
    text = "one two three four five six"
    for limit in (2, 3, 5, 8, 20):
        assert (
            ours.encode_truncated(text, limit)
            == ref(text, truncation=True, max_length=limit)["input_ids"]
        ), limit
    with pytest.raises(ValueError, match="adds 2 special tokens"):
        ours.encode_truncated(text, 1)

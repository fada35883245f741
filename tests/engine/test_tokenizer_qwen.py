"""tallow's Tokenizer on the real Qwen2.5-Coder-0.5B-Instruct GGUF against transformers loading
the same file: token ids, decoded text, special ids, chat template rendering, and the
incremental detokenizer on the real vocabulary."""

from __future__ import annotations

import random

import pytest

from tallow.engine.detokenizer import IncrementalDetokenizer
from tallow.engine.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces and trailing spaces   ",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 🎉🚀👩‍👩‍👧‍👦 flags 🇫🇷 skin 👍🏽",
    "café naïve résumé Ångström e\u0301 (combining) ß ø",
    "def f(x):\n\treturn x ** 2  # tab-indented\n\n\n",
    "class A:\r\n    pass\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|im_start|>partial <|im_",
    "",
    " ",
    "\n",
    "1234567890 3.14159 -42 1e-9",
    "I'm sure they'll say we've done it; don't you'RE",
    "     \t\t   many   spaces\u00a0nbsp\u3000ideographic",
    "Ωμέγα кириллица עברית العربية हिन्दी",
    "x" * 300,
]


@pytest.fixture(scope="module")
def checkpoint(qwen_gguf):
    from tallow.plugin.testing import isolated_plugin_manager

    pm = isolated_plugin_manager(("tallow-format-gguf", "tallow_format_gguf.plugin"))
    fmt = pm.registries.weight_formats.get("gguf")
    assert fmt.claims(str(qwen_gguf))
    return fmt().load(str(qwen_gguf))


@pytest.fixture(scope="module")
def tok(checkpoint) -> Tokenizer:
    return Tokenizer.from_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def hf_tok(qwen_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_gguf.parent), gguf_file=qwen_gguf.name)


@pytest.mark.parametrize("add_special", [True, False])
def test_encode_matches_transformers(tok, hf_tok, add_special):
    for text in TEXTS:
        assert (
            tok.encode(text, add_special_tokens=add_special)
            == hf_tok(text, add_special_tokens=add_special).input_ids
        ), text


def test_decode_matches_transformers(tok, hf_tok):
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)
        assert tok.decode(ids, skip_special_tokens=False) == text  # byte-level BPE round-trips


def test_decode_of_arbitrary_ids_matches_transformers(tok, hf_tok):
    rng = random.Random(1234)
    specials = tok.all_special_ids
    for _ in range(60):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 24))]
        if rng.random() < 0.5:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(
                ids, skip_special_tokens=skip
            ), ids


def test_ids_and_tokens(tok, hf_tok):
    assert tok.vocab_size == len(hf_tok) == 151936
    assert tok.bos_token_id == hf_tok.bos_token_id == 151643
    assert tok.eos_token_id == hf_tok.eos_token_id == 151645
    assert tok.pad_token_id == hf_tok.pad_token_id
    # <|im_end|> ends a turn; <|endoftext|> ends a document: both stop generation
    assert tok.eos_token_ids == {151645, 151643}
    assert set(hf_tok.all_special_ids) <= set(tok.all_special_ids)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start == 151644 and tok.is_special(im_start)
    tool_call = tok.convert_tokens_to_ids("<tool_call>")
    assert tool_call == 151657 and not tok.is_special(tool_call)
    sample = tok.encode(TEXTS[3] + TEXTS[7])
    assert tok.convert_ids_to_tokens(sample) == hf_tok.convert_ids_to_tokens(sample)
    assert tok.convert_ids_to_tokens(sample[0]) == hf_tok.convert_ids_to_tokens(sample[0])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather — «quoted» 天气 <b>html</b>",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "now",
            "description": "The time",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye 👋"},
    ],
    [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "東京", "unit": "c"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 12}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "Paris 12°C, Tokyo 20°C."},
        {"role": "user", "content": "Thanks"},
    ],
    [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "now", "arguments": {}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "12:00"},
    ],
]


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("gen", [True, False], ids=["gen", "no-gen"])
def test_chat_template_matches_transformers(tok, hf_tok, conv, tools, gen):
    messages = CONVERSATIONS[conv]
    ours = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen)
    ref = hf_tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=gen, tokenize=False
    )
    assert ours == ref
    assert ours.endswith("<|im_start|>assistant\n") == gen


def test_chat_prompt_tokens_match_transformers(tok, hf_tok):
    messages = CONVERSATIONS[2]
    text = tok.apply_chat_template(messages, tools=TOOLS)
    ref_ids = hf_tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tok.encode(text, add_special_tokens=False) == list(ref_ids)


def test_detokenizer_on_the_real_vocabulary(tok):
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            detok = IncrementalDetokenizer(tok, tok.encode("prompt"), skip_special_tokens=skip)
            pieces = [detok.push(i) for i in ids] + [detok.flush()]
            assert "".join(pieces) == detok.text == tok.decode(ids, skip_special_tokens=skip)
            assert not any(p.endswith("\ufffd") for p in pieces), pieces

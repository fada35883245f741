"""Gemma 4's chat formats through the app: a scripted model over a tokenizer whose Gemma 4
markers are special tokens, with Gemma 4's own chat template (a fixture of tallow-tool-gemma4's
tests), and then over Gemma 4's real vocabulary (llama.cpp's ``ggml-vocab-gemma-4.gguf``, from
the llama-cpp-python sdist the GGUF plugin's tokenizer tests use). Nothing names a parser: the ``gemma4`` reasoning and tool parsers are chosen from the
template, the server keeps the special tokens in the text they read, and the thought channel,
the answer and the calls come back apart, whole, streamed and through the ``openai`` client.
The fake engine sends one token per step, so text arrives byte by byte and markers whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from server_fakes import FakeEngine, byte_tokenizer
from server_helpers import TOOLS, openai_client
from test_reasoning import MSG, streamed, whole

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (ROOT / "plugins/tool/gemma4/tests/data/chat_template.jinja").read_text()
SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
]
Q = '<|"|>'
THOUGHT = "The user asks where; 1 < 2, café 😀.\n"
ANSWER = "In Paris, {x}: [y]."
THINKING = f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}<turn|>"
CALL = (
    "<|channel>thought\nNeed the weather.<channel|><|tool_call>call:get_weather{city:"
    f"{Q}Paris, France{Q},unit:{Q}C{Q}}}<tool_call|><|tool_call>call:add{{a:2,b:-3}}"
    "<tool_call|><|tool_response>"
)
ON = {"chat_template_kwargs": {"enable_thinking": True}}


def gemma4(plugin_manager: Any, reply: str) -> FakeEngine:
    fake = FakeEngine(
        lambda prompt, params, i: reply,
        model_name="google/gemma-4-31b-it",
        plugin_manager=plugin_manager,
    )
    fake.tokenizer = byte_tokenizer(SPECIALS, TEMPLATE, eos_token="<turn|>")
    (fake.eos_token_id,) = fake.tokenizer.eos_token_ids
    return fake


def test_parsers_chosen_from_the_template(serve, plugin_manager) -> None:
    client = serve(gemma4(plugin_manager, THINKING))
    selected = client.get("/v1/plugins").json()["selected"]
    assert (selected["reasoning_parser"], selected["tool_parser"]) == ("gemma4", "gemma4")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_thinking_on(serve, plugin_manager, stream: bool) -> None:
    fake = gemma4(plugin_manager, THINKING)
    client = serve(fake)
    # even a request that asks to skip special tokens: the parsers' markup is made of them
    body = {**ON, "skip_special_tokens": True}
    if stream:
        reasoning, content, _ = streamed(client, **body)
    else:
        message = whole(client, **body)["message"]
        reasoning, content = message["reasoning_content"], message["content"]
    assert (reasoning, content) == (THOUGHT, ANSWER)
    prompt = fake.requests[-1]["prompt"]
    assert prompt.startswith("<|turn>system\n<|think|>") and prompt.endswith("<|turn>model\n")
    assert fake.requests[-1]["params"].skip_special_tokens is False


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_thinking_off_is_all_content(serve, plugin_manager, stream: bool) -> None:
    fake = gemma4(plugin_manager, ANSWER + "<turn|>")
    client = serve(fake)
    if stream:
        reasoning, content, _ = streamed(client)
    else:
        message = whole(client)["message"]
        reasoning, content = message["reasoning_content"], message["content"]
    assert (reasoning, content) == (None, ANSWER)
    assert fake.requests[-1]["prompt"].endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_tool_calls_after_thinking(serve, plugin_manager) -> None:
    fake = gemma4(plugin_manager, CALL)
    client = serve(fake)
    choice = whole(client, tools=TOOLS, **ON)
    assert "<|tool>declaration:get_weather{description:" in fake.requests[-1]["prompt"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert (message["reasoning_content"], message["content"]) == ("Need the weather.", None)
    expected = [("get_weather", {"city": "Paris, France", "unit": "C"}), ("add", {"a": 2, "b": -3})]
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    assert got == expected
    reasoning, content, calls = streamed(client, tools=TOOLS, **ON)
    assert (reasoning, content) == ("Need the weather.", "")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == (
        expected
    )


def test_a_call_in_the_thought_is_not_made(serve, plugin_manager) -> None:
    decoy = f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}}}<tool_call|>"
    reply = f"<|channel>thought\nMaybe {decoy}? No.<channel|>Paris it is.<turn|>"
    client = serve(gemma4(plugin_manager, reply))
    choice = whole(client, tools=TOOLS, **ON)
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    assert choice["message"]["reasoning_content"] == f"Maybe {decoy}? No."
    assert choice["message"]["content"] == "Paris it is."


def test_official_client(serve, plugin_manager) -> None:
    oai = openai_client(serve(gemma4(plugin_manager, CALL)))
    reply = oai.chat.completions.create(
        model="google/gemma-4-31b-it", messages=MSG, tools=TOOLS, extra_body=ON
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.reasoning_content == "Need the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris, France", "unit": "C"}),
        ("add", {"a": 2, "b": -3}),
    ]
    thinking = openai_client(serve(gemma4(plugin_manager, THINKING)))
    chunks = list(
        thinking.chat.completions.create(
            model="google/gemma-4-31b-it", messages=MSG, stream=True, extra_body=ON
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER


# -- Gemma 4's real vocabulary ------------------------------------------------------------
GGUF_TESTS = ROOT / "plugins/format/gguf/tests"


@pytest.fixture(scope="module")
def vocab() -> Any:
    """Gemma 4's tokenizer and chat template from llama.cpp's vocabulary-only GGUF (cached from
    the pinned llama-cpp-python sdist, as the GGUF plugin's tokenizer tests get it)."""
    sys.path.insert(0, str(GGUF_TESTS))
    try:
        from llama_cpp_vectors import VectorsUnavailable, vectors_dir
    finally:
        sys.path.remove(str(GGUF_TESTS))
    from tallow_format_gguf.format import GGUFFormat

    from tallow.engine.tokenizer import Tokenizer

    try:
        path = vectors_dir() / "ggml-vocab-gemma-4.gguf"
    except VectorsUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    checkpoint = GGUFFormat().load(str(path))
    assert checkpoint.tokenizer is not None, checkpoint.extra.get("tokenizer_error")
    return Tokenizer(checkpoint.tokenizer, checkpoint.tokenizer_config)


def test_the_fixture_is_the_template_of_gemma4s_vocabulary(vocab) -> None:
    assert vocab.chat_template == TEMPLATE
    # each marker the parsers read is one token of the vocabulary
    for marker in ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", Q, "<turn|>"):
        assert len(vocab.encode(marker, add_special_tokens=False)) == 1, marker


def test_real_vocabulary_through_the_app(serve, plugin_manager, vocab) -> None:
    fake = FakeEngine(
        lambda prompt, params, i: CALL,
        model_name="google/gemma-4-26B-A4B-it",
        plugin_manager=plugin_manager,
    )
    fake.tokenizer = vocab
    fake.eos_token_id = sorted(vocab.eos_token_ids)[0]
    client = serve(fake)
    selected = client.get("/v1/plugins").json()["selected"]
    assert (selected["reasoning_parser"], selected["tool_parser"]) == ("gemma4", "gemma4")
    expected = [("get_weather", {"city": "Paris, France", "unit": "C"}), ("add", {"a": 2, "b": -3})]
    message = whole(client, tools=TOOLS, **ON)["message"]
    assert (message["reasoning_content"], message["content"]) == ("Need the weather.", None)
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    assert got == expected
    reasoning, content, calls = streamed(client, tools=TOOLS, **ON)
    assert (reasoning, content) == ("Need the weather.", "")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == (
        expected
    )
    fake.script = lambda prompt, params, i: THINKING
    assert streamed(client, **ON)[:2] == (THOUGHT, ANSWER)


# -- a tool round with google/gemma-4-31B-it's later template --------------------------------
TEMPLATE_31B = (ROOT / "plugins/tool/gemma4/tests/data/chat_template_31b_it.jinja").read_text()
ROUND = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
]


@pytest.mark.parametrize("thinking", [False, True], ids=["off", "on"])
def test_a_reply_after_a_tool_result(serve, plugin_manager, thinking: bool) -> None:
    reply = (f"<|channel>thought\n{THOUGHT}<channel|>" if thinking else "") + ANSWER + "<turn|>"
    fake = gemma4(plugin_manager, reply)
    fake.tokenizer.tokenizer_config["chat_template"] = TEMPLATE_31B
    client = serve(fake)
    body = {"messages": ROUND, "tools": TOOLS, **(ON if thinking else {})}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    # the model turn goes on after the result: no new turn, no closed thought channel
    prompt = fake.requests[-1]["prompt"]
    assert prompt.endswith(
        "<|tool_call>call:get_weather{city:" + Q + "Paris" + Q + "}<tool_call|>"
        "<|tool_response>response:get_weather{value:" + Q + "21 C, sunny" + Q + "}<tool_response|>"
    )
    want = (THOUGHT if thinking else None, ANSWER)
    assert (message["reasoning_content"], message["content"]) == want
    assert not message.get("tool_calls")

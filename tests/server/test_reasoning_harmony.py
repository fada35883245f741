"""gpt-oss's harmony format through the server: a scripted model over a tokenizer whose harmony
markers are special tokens and a harmony chat template. Nothing names a parser: the ``harmony``
reasoning and tool parsers (tallow-reasoning-harmony) are chosen from the template, and the
server keeps the special tokens in the text they read. The fake engine sends one token per step,
so text arrives byte by byte and each marker whole."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterator

import pytest
from server_fakes import FakeEngine, byte_tokenizer
from server_helpers import TOOLS, chunks_of, make_config, openai_client
from test_reasoning import streamed, whole
from test_tool_loop import Clock

from tallow.server.tool_loop import EXTENSION_FIELD
from tallow.server.tool_providers import ToolProviders

HARMONY_SPECIALS = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
# A small harmony renderer: reasoning of a tool-call turn as analysis, calls with the recipient
# in the role part, tool results from functions.NAME (the shapes gpt-oss's template writes).
HARMONY_TEMPLATE = (
    "{%- if tools %}<|start|>developer<|message|># Tools{% for t in tools %} "
    "{{ t.function.name }}{% endfor %}<|end|>{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}"
    "<|end|>{% endif -%}"
    "{%- for c in m.tool_calls %}<|start|>assistant to=functions.{{ c.function.name }}"
    "<|channel|>commentary json<|message|>{{ c.function.arguments | tojson }}<|call|>"
    "{% endfor -%}"
    "{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>"
    "commentary<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>"
    "{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif -%}"
    "{%- endfor -%}"
    "{%- if reasoning_effort is defined %}[effort={{ reasoning_effort }}]{% endif -%}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif -%}"
)

MSG = [{"role": "user", "content": "What is 2 + 2?"}]
THOUGHT = 'User asks: "What is 2 + 2?" 1 < 2; café 😀.'
ANSWER = "2 + 2 = 4."
TEXT = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
    "<|call|>"
)


def harmony_engine(plugin_manager: Any, script: Callable[[str], str] | str) -> FakeEngine:
    run = script if callable(script) else (lambda prompt: script)
    fake = FakeEngine(
        lambda prompt, params, i: run(prompt),
        model_name="gpt-oss-fake",
        plugin_manager=plugin_manager,
    )
    fake.tokenizer = byte_tokenizer(HARMONY_SPECIALS, HARMONY_TEMPLATE, eos_token="<|return|>")
    (fake.eos_token_id,) = fake.tokenizer.eos_token_ids
    return fake


def test_parsers_chosen_from_the_template(serve, plugin_manager) -> None:
    client = serve(harmony_engine(plugin_manager, TEXT))
    selected = client.get("/v1/plugins").json()["selected"]
    assert selected["reasoning_parser"] == "harmony"
    assert selected["tool_parser"] == "harmony"
    message = whole(client)["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    assert streamed(client)[:2] == (THOUGHT, ANSWER)


def test_special_tokens_reach_the_parser(serve, plugin_manager) -> None:
    fake = harmony_engine(plugin_manager, TEXT)
    client = serve(fake)
    # even a request that asks to skip them: the parser's markup is made of them
    message = whole(client, skip_special_tokens=True)["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    assert fake.requests[-1]["params"].skip_special_tokens is False


def test_none_turns_reasoning_parsing_off(serve, plugin_manager) -> None:
    fake = harmony_engine(plugin_manager, TEXT)
    client = serve(fake, reasoning_parser="none")
    message = whole(client)["message"]
    assert "reasoning_content" not in message
    assert message["content"] == f"analysis{THOUGHT}assistantfinal{ANSWER}"  # tokens skipped
    assert fake.requests[-1]["params"].skip_special_tokens is True


def test_an_explicit_parser_wins(serve, plugin_manager) -> None:
    fake = harmony_engine(plugin_manager, TEXT)
    client = serve(fake, reasoning_parser="think")
    assert client.get("/v1/plugins").json()["selected"]["reasoning_parser"] == "think"
    message = whole(client)["message"]
    assert message["reasoning_content"] is None
    assert fake.requests[-1]["params"].skip_special_tokens is True  # think reads no tokens


def test_tool_call_in_harmony(serve, plugin_manager) -> None:
    client = serve(harmony_engine(plugin_manager, CALL))
    choice = whole(client, tools=TOOLS)
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "Need the weather." and message["content"] is None
    (got,) = message["tool_calls"]
    assert (got["function"]["name"], json.loads(got["function"]["arguments"])) == (
        "get_weather",
        {"city": "Paris"},
    )
    reasoning, content, calls = streamed(client, tools=TOOLS)
    assert reasoning == "Need the weather." and content == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_official_client_and_reasoning_effort(serve, plugin_manager) -> None:
    fake = harmony_engine(plugin_manager, TEXT)
    oai = openai_client(serve(fake))
    reply = oai.chat.completions.create(model="gpt-oss-fake", messages=MSG, reasoning_effort="low")
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    assert fake.requests[-1]["prompt"].endswith("[effort=low]<|start|>assistant")
    thought = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or ""
        for c in oai.chat.completions.create(model="gpt-oss-fake", messages=MSG, stream=True)
        if c.choices
    )
    assert thought == THOUGHT


def test_reasoning_content_sent_back_reaches_the_template(serve, plugin_manager) -> None:
    fake = harmony_engine(plugin_manager, TEXT)
    client = serve(fake)
    history = MSG + [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the weather.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
    ]
    resp = client.post("/v1/chat/completions", json={"messages": history, "tools": TOOLS})
    assert resp.status_code == 200, resp.text
    prompt = fake.requests[-1]["prompt"]
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
    ) in prompt
    bad = client.post(
        "/v1/chat/completions",
        json={"messages": [*MSG, {"role": "assistant", "content": "x", "reasoning_content": 3}]},
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "messages[1].reasoning_content"


# -- the server-side tool loop -----------------------------------------------------------------
def thinking_clock(prompt: str) -> str:
    """Round 1 reasons and calls get_time; round 2 reads the result and answers."""
    result = re.search(r"to=assistant<\|channel\|>commentary<\|message\|>(.*?)<\|end\|>", prompt)
    if result is None:
        return (
            "<|channel|>analysis<|message|>Ask the clock.<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
            '{"zone":"Europe/Paris"}<|call|>'
        )
    return (
        f"<|channel|>analysis<|message|>It said {result.group(1)}.<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>It is {result.group(1)}.<|return|>"
    )


@pytest.fixture
def loop_client(plugin_manager: Any) -> Iterator[tuple[Any, FakeEngine]]:
    from starlette.testclient import TestClient

    from tallow.server.app import build_app

    fake = harmony_engine(plugin_manager, thinking_clock)
    app = build_app(
        fake,
        make_config(server_tools="always"),
        tool_providers=ToolProviders.of({"clock": Clock()}),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, fake


def test_tool_loop_reports_and_carries_reasoning(loop_client) -> None:
    client, fake = loop_client
    resp = client.post("/v1/chat/completions", json={"messages": MSG})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    message = choice["message"]
    answer = "12:12 in Europe/Paris"
    assert message["content"] == f"It is {answer}."
    assert message["reasoning_content"] == f"Ask the clock.It said {answer}."
    (ran,) = message[EXTENSION_FIELD]
    assert ran["function"]["name"] == "get_time" and ran["result"]["content"] == answer
    # the second round's prompt carries the first round's reasoning and call
    second = fake.requests[-1]["prompt"]
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Ask the clock.<|end|>"
        "<|start|>assistant to=functions.get_time"
    ) in second
    assert all(r["params"].skip_special_tokens is False for r in fake.requests)

    chunks = chunks_of(client.post("/v1/chat/completions", json={"messages": MSG, "stream": True}))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    assert not [d for d in deltas if "reasoning_content" in d and "content" in d]

    hidden = client.post(
        "/v1/chat/completions", json={"messages": MSG, "include_reasoning": False}
    ).json()
    assert "reasoning_content" not in hidden["choices"][0]["message"]

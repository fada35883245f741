"""Chat completions over the fake engine: response and chunk shapes, sampling fields, logprobs,
messages through the real Qwen2.5 chat template."""

from __future__ import annotations

from server_fakes import FakeEngine
from server_helpers import chunks_of, openai_client

MSG = [{"role": "user", "content": "hi"}]


def test_whole_response_shape_and_usage(serve) -> None:
    client = serve()
    body = client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": MSG, "max_tokens": 5}
    ).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["model"] == "fake-model"
    assert body["system_fingerprint"].startswith("fp_")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert choice["logprobs"] is None
    request = client.engine.requests[-1]
    prompt_len = len(request["prompt_token_ids"])
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 5,
        "total_tokens": prompt_len + 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # the same prompt again is served from the (fake) prefix cache
    again = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 5}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_len // 16 * 16 > 0
    assert again["id"] != body["id"]


def test_prompt_is_the_chat_template_of_the_messages(serve) -> None:
    client = serve()
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    ]
    assert (
        client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
        ).status_code
        == 200
    )
    request = client.engine.requests[-1]
    assert request["prompt"] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": '
        '{"a": 2, "b": 2}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tok = client.engine.tokenizer
    assert request["prompt_token_ids"] == tok.encode(request["prompt"], add_special_tokens=False)


def test_chat_template_kwargs_are_template_variables(serve) -> None:
    engine = FakeEngine()
    engine.tokenizer.tokenizer_config["chat_template"] = (
        "{{ greeting | default('none') }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    client = serve(engine)
    client.post(
        "/v1/chat/completions",
        json={"messages": MSG, "max_tokens": 1, "chat_template_kwargs": {"greeting": "hey"}},
    )
    assert engine.requests[-1]["prompt"] == "hey|hi"


def test_sampling_fields_reach_the_engine(serve) -> None:
    client = serve()
    resp = client.post(
        "/v1/chat/completions",
        json={
            "messages": MSG,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 1234,
            "n": 2,
            "stop": "zzz",
            "logit_bias": {"65": -100, "66": 5},
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "max_tokens": 50,
            "max_completion_tokens": 7,
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 2,
            "logprobs": True,
            "top_logprobs": 3,
            "user": "someone",
            "priority": 3,
        },
    )
    assert resp.status_code == 200, resp.text
    request = client.engine.requests[-1]
    p = request["params"]
    assert (p.temperature, p.top_p, p.seed, p.n) == (0.7, 0.9, 1234, 2)
    assert p.stop == ["zzz"] and p.logit_bias == {65: -100.0, 66: 5.0}
    assert (p.presence_penalty, p.frequency_penalty) == (0.5, -0.5)
    assert p.max_tokens == 7  # max_completion_tokens wins over the deprecated max_tokens
    assert (p.top_k, p.min_p, p.repetition_penalty, p.min_tokens) == (20, 0.05, 1.1, 2)
    assert p.logprobs == 3 and p.prompt_logprobs is None
    assert request["priority"] == 3
    # without a limit, a chat completion may use the rest of the context
    client.post("/v1/chat/completions", json={"messages": MSG})
    request = client.engine.requests[-1]
    assert request["params"].max_tokens == 4096 - len(request["prompt_token_ids"])
    assert request["params"].temperature == 1.0 and request["params"].logprobs is None


def test_stop_and_n(serve) -> None:
    client = serve()
    body = client.post(
        "/v1/chat/completions", json={"messages": MSG, "n": 3, "stop": [", fr", "zz"]}
    ).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for c in body["choices"]:
        assert c["message"]["content"] == "Hello there"
        assert c["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == sum(len(o) for o in ["Hello there, fr"] * 3)


def test_logprobs(serve) -> None:
    client = serve()
    body = client.post(
        "/v1/chat/completions",
        json={"messages": MSG, "max_tokens": 6, "logprobs": True, "top_logprobs": 2},
    ).json()
    (choice,) = body["choices"]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert len(content) == 6
    assert "".join(e["token"] for e in content) == choice["message"]["content"] == "Hello "
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] == -0.25
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][1]["logprob"] == -2.0
    # logprobs without alternatives
    body = client.post(
        "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "logprobs": True}
    ).json()
    assert [e["top_logprobs"] for e in body["choices"][0]["logprobs"]["content"]] == [[], []]


def test_stream_chunks_as_openai_sends_them(serve) -> None:
    client = serve()
    whole = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 12}).json()
    chunks = chunks_of(
        client.post(
            "/v1/chat/completions", json={"messages": MSG, "max_tokens": 12, "stream": True}
        )
    )
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["model"] == "fake-model"
        assert c["system_fingerprint"] == whole["system_fingerprint"]
        assert "usage" not in c
        assert len(c["choices"]) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    for c in chunks[:-1]:
        assert c["choices"][0]["finish_reason"] is None
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]


def test_stream_include_usage_and_n(serve) -> None:
    client = serve()
    chunks = chunks_of(
        client.post(
            "/v1/chat/completions",
            json={
                "messages": MSG,
                "max_tokens": 4,
                "n": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    )
    *body, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 8
    assert all(c["usage"] is None for c in body)
    for index in (0, 1):
        mine = [c["choices"][0] for c in body if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert mine[-1]["finish_reason"] == "length"
        assert "".join(m["delta"].get("content", "") for m in mine) == "Hell"


def test_stream_logprobs(serve) -> None:
    client = serve()
    chunks = chunks_of(
        client.post(
            "/v1/chat/completions",
            json={
                "messages": MSG,
                "max_tokens": 5,
                "stream": True,
                "logprobs": True,
                "top_logprobs": 1,
            },
        )
    )
    tokens = [
        e["token"]
        for c in chunks
        if c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert "".join(tokens) == "Hello"


def test_the_official_client_reads_every_shape(serve) -> None:
    oc = openai_client(serve())
    resp = oc.chat.completions.create(
        model="fake-model", messages=MSG, max_tokens=3, n=2, logprobs=True, top_logprobs=1
    )
    assert [c.message.content for c in resp.choices] == ["Hel", "Hel"]
    assert resp.choices[0].logprobs.content[0].top_logprobs[0].token == "H"
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    stream = oc.chat.completions.create(
        model="fake-model",
        messages=MSG,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = list(stream)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "Hel"
    assert parts[-1].usage.completion_tokens == 3


def test_no_chat_template_is_400(serve) -> None:
    engine = FakeEngine()
    engine.tokenizer.tokenizer_config.pop("chat_template")
    client = serve(engine)
    resp = client.post("/v1/chat/completions", json={"messages": MSG})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "chat_template_error"
    assert "no chat template" in resp.json()["error"]["message"]


def test_the_ending_eos_token_is_counted_but_has_no_logprob(serve) -> None:
    client = serve(FakeEngine(lambda prompt, params, i: "Hi!"))
    body = client.post(
        "/v1/chat/completions", json={"messages": MSG, "logprobs": True, "top_logprobs": 1}
    ).json()
    (choice,) = body["choices"]
    assert choice["message"]["content"] == "Hi!" and choice["finish_reason"] == "stop"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["H", "i", "!"]
    assert body["usage"]["completion_tokens"] == 4  # the EOS token was generated
    chunks = chunks_of(
        client.post(
            "/v1/chat/completions", json={"messages": MSG, "logprobs": True, "stream": True}
        )
    )
    tokens = [
        e["token"]
        for c in chunks
        if c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert tokens == ["H", "i", "!"]
    text = client.post("/v1/completions", json={"prompt": "x", "logprobs": 0}).json()
    assert text["choices"][0]["logprobs"]["tokens"] == ["H", "i", "!"]

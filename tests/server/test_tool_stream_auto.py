"""``tool_choice: auto`` streams a call's arguments as the model writes them (as the forced
path does): the official ``openai`` client receives the call's id and name first, then the
arguments in pieces, which add up to the arguments of the whole response. The model's output
is scripted (the fake engine over the Qwen2.5 template and the hermes parser)."""

from __future__ import annotations

import json

from server_fakes import FakeEngine
from server_helpers import TOOLS, openai_client

MSG = [{"role": "user", "content": "What is the weather in San Francisco?"}]
ARGS = {"city": "San Francisco, California, United States", "unit": "F"}
TEXT = (
    "Let me check.\n<tool_call>\n"
    + json.dumps({"name": "get_weather", "arguments": ARGS})
    + "\n</tool_call>"
)


def test_auto_streams_the_arguments_of_a_call_as_they_are_written(serve) -> None:
    oc = openai_client(serve(FakeEngine(lambda prompt, params, i: TEXT)))
    whole = oc.chat.completions.create(
        model="fake-model", messages=MSG, tools=TOOLS, tool_choice="auto"
    )
    (expected,) = whole.choices[0].message.tool_calls
    pieces, names, ids, content, finish = [], [], [], "", None
    for chunk in oc.chat.completions.create(
        model="fake-model", messages=MSG, tools=TOOLS, tool_choice="auto", stream=True
    ):
        (choice,) = chunk.choices
        content += choice.delta.content or ""
        for part in choice.delta.tool_calls or []:
            assert part.index == 0
            if part.id:
                ids.append(part.id)
                names.append(part.function.name)
            if part.function.arguments:
                pieces.append(part.function.arguments)
        finish = choice.finish_reason or finish
    assert names == ["get_weather"] and len(ids) == 1 and ids[0].startswith("call_")
    # sent piece by piece while written, not as one delta at the end
    assert len(pieces) > 5, pieces
    assert "".join(pieces) == expected.function.arguments
    assert json.loads("".join(pieces)) == ARGS
    assert content.strip() == "Let me check." and finish == "tool_calls"
    assert whole.choices[0].finish_reason == "tool_calls"


def test_a_stream_cut_inside_the_call_ends_with_length(serve) -> None:
    cut = TEXT[: TEXT.index("California")]
    oc = openai_client(serve(FakeEngine(lambda prompt, params, i: cut)))
    pieces, finish = [], None
    for chunk in oc.chat.completions.create(
        model="fake-model", messages=MSG, tools=TOOLS, stream=True
    ):
        (choice,) = chunk.choices
        for part in choice.delta.tool_calls or []:
            pieces.append(part.function.arguments or "")
        finish = choice.finish_reason or finish
    assert "".join(pieces) == '{"city":"San Francisco, ' and finish == "length"

"""The harmony parsers against tallow's reasoning-parser and tool-parser conformance suites."""

from __future__ import annotations

import json

from tallow.plugin.testing import ReasoningParserConformance, ToolParserConformance

ANALYSIS = '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" 1 < 2.<|end|>'
FINAL = "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"


def call(name: str, args: dict, *, role_part: bool = False, stop: str = "<|call|>") -> str:
    body = json.dumps(args, ensure_ascii=False)
    if role_part:
        return (
            f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>"
            f"{body}{stop}"
        )
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
        f"<|message|>{body}{stop}"
    )


class TestHarmonyReasoningConformance(ReasoningParserConformance):
    distribution = "tallow-reasoning-harmony"
    component = "harmony"
    examples = [
        (ANALYSIS + FINAL, 'User asks: "What is 2 + 2?" 1 < 2.', "2 + 2 = 4."),
        # the engine dropped the stop token; a message without a channel is content
        ("<|channel|>final<|message|>Paris, café 😀", "", "Paris, café 😀"),
        ("<|message|>no channel", "", "no channel"),
        # two analysis messages, then a preamble for the user, then a call
        (
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>"
            "b<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
            + call("get_weather", {"city": "東京"}),
            "ab",
            "Checking." + call("get_weather", {"city": "東京"}),
        ),
        # a call whose recipient the response opens with (the prompt wrote <|start|>assistant)
        (
            ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}',
            "",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Paris"}',
        ),
        # a built-in tool in the chain of thought is reasoning
        ("<|channel|>analysis to=python code<|message|>print(1)<|call|>", "print(1)", ""),
        # a header cut off by the end of the response carries no text
        (ANALYSIS + "<|start|>assistant<|channel|>fin", 'User asks: "What is 2 + 2?" 1 < 2.', ""),
        ("<|channel|>analysis<|message|>thinking, not done", "thinking, not done", ""),
        ("to be or not <|channel|>final<|message|>x", "", "to be or not x"),
        ("", "", ""),
    ]


class TestHarmonyToolConformance(ToolParserConformance):
    distribution = "tallow-reasoning-harmony"
    component = "harmony"
    examples = [
        (call("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
        (
            "Let me look."
            + call("get_weather", {"city": "Zürich 東京"}, role_part=True)
            + call("search", {"q": {"all": ["<|ca", 1.5, None]}}),
            [
                ("get_weather", {"city": "Zürich 東京"}),
                ("search", {"q": {"all": ["<|ca", 1.5, None]}}),
            ],
        ),
        # the whole raw response (no reasoning parser), stop token dropped by the engine
        (ANALYSIS + call("search", {}, stop=""), [("search", {})]),
        # the response opens inside the call's header
        (
            ' to=functions.search<|channel|>commentary json<|message|>{"q": "x"}<|call|>',
            [("search", {"q": "x"})],
        ),
    ]

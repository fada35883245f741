"""The hermes parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

import json

from tallow.plugin.testing import ToolParserConformance


def call(name: str, args: dict, indent: int | None = None) -> str:
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False, indent=indent)
    return f"<tool_call>\n{body}\n</tool_call>"


class TestHermesConformance(ToolParserConformance):
    distribution = "tallow-tool-hermes"
    component = "hermes"
    examples = [
        (call("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
        (
            "Let me look.\n\n"
            + call("get_weather", {"city": "Zürich 東京"})
            + "\n"
            + call("search", {"q": {"all": ["</tool_call>", 1.5, None]}}, indent=2),
            [
                ("get_weather", {"city": "Zürich 東京"}),
                ("search", {"q": {"all": ["</tool_call>", 1.5, None]}}),
            ],
        ),
        ("<think>need the weather</think>\n" + call("search", {}), [("search", {})]),
    ]

"""The json fallback parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

import json

from tallow.plugin.testing import ToolParserConformance


class TestJsonConformance(ToolParserConformance):
    distribution = "tallow-tool-json"
    component = "json"
    examples = [
        (
            json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
            [("get_weather", {"city": "Paris"})],
        ),
        (
            json.dumps(
                [
                    {"name": "search", "parameters": {"q": "東京 😀"}},
                    {"name": "get_weather", "arguments": {}},
                ],
                ensure_ascii=False,
                indent=2,
            ),
            [("search", {"q": "東京 😀"}), ("get_weather", {})],
        ),
        (
            "<think>ok</think>" + json.dumps({"name": "search", "arguments": {"n": [1, None]}}),
            [("search", {"n": [1, None]})],
        ),
    ]

"""The llama3_json parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

import json

from tallow.plugin.testing import ToolParserConformance


def call(name: str, args: dict) -> str:
    return json.dumps({"name": name, "parameters": args}, ensure_ascii=False)


class TestLlama3Conformance(ToolParserConformance):
    distribution = "tallow-tool-llama3"
    component = "llama3_json"
    examples = [
        (call("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
        (
            call("get_weather", {"city": "Zürich"}) + "; " + call("search", {"q": "x"}),
            [("get_weather", {"city": "Zürich"}), ("search", {"q": "x"})],
        ),
        (
            "Checking.\n<|python_tag|>" + call("search", {"q": [1, {"a": None}]}),
            [("search", {"q": [1, {"a": None}]})],
        ),
    ]

"""The Gemma 4 parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ToolParserConformance

Q = '<|"|>'


class TestGemma4Conformance(ToolParserConformance):
    distribution = "tallow-tool-gemma4"
    component = "gemma4"
    examples = [
        (
            f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},unit:{Q}celsius{Q}}}<tool_call|>",
            [("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            f"I will list both.\n<|tool_call>call:ls{{dir:{Q}東京 😀{Q}}}<tool_call|>"
            "<|tool_call>call:ls{}<tool_call|>",
            [("ls", {"dir": "東京 😀"}), ("ls", {})],
        ),
        (
            f"<think>need the files</think>\n<|tool_call>call:ls{{dir:{Q}<tool_call|>{Q},"
            "depth:2,all:false,sizes:[1,2.5]}<tool_call|><|tool_response>",
            [("ls", {"dir": "<tool_call|>", "depth": 2, "all": False, "sizes": [1, 2.5]})],
        ),
    ]

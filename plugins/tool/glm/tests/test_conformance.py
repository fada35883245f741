"""The GLM parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ToolParserConformance


def call(name: str, args: dict[str, str], newlines: bool = True) -> str:
    nl = "\n" if newlines else ""
    pairs = "".join(
        f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in args.items()
    )
    return f"<tool_call>{name}{nl}{pairs}</tool_call>"


class TestGlmConformance(ToolParserConformance):
    distribution = "tallow-tool-glm"
    component = "glm45"
    examples = [
        (
            call("get_weather", {"city": "Paris", "unit": "celsius"}),
            [("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            "I will list both.\n" + call("ls", {"dir": "東京 😀"}) + call("ls", {}, newlines=False),
            [("ls", {"dir": "東京 😀"}), ("ls", {})],
        ),
        (
            "<think>need the files</think>\n" + call("ls", {"dir": "<tool_call>x"}, newlines=False),
            [("ls", {"dir": "<tool_call>x"})],
        ),
    ]

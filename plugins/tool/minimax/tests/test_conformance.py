"""The MiniMax M2 parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ToolParserConformance


def block(*calls: tuple[str, dict[str, str]]) -> str:
    invokes = "".join(
        f'<invoke name="{name}">\n'
        + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in args.items())
        + "</invoke>\n"
        for name, args in calls
    )
    return f"<minimax:tool_call>\n{invokes}</minimax:tool_call>"


class TestMiniMaxConformance(ToolParserConformance):
    distribution = "tallow-tool-minimax"
    component = "minimax_m2"
    examples = [
        (
            block(("get_weather", {"city": "Paris", "unit": "celsius"})),
            [("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            "I will list both.\n" + block(("ls", {"dir": "東京 😀"}), ("ls", {})),
            [("ls", {"dir": "東京 😀"}), ("ls", {})],
        ),
        (
            "<think>need the files</think>\n\n"
            + block(("ls", {"dir": "<invoke>"}))
            + "\n"
            + block(("get_weather", {"city": "Oslo"})),
            [("ls", {"dir": "<invoke>"}), ("get_weather", {"city": "Oslo"})],
        ),
    ]

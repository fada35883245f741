"""The mistral parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

import json

from tallow.plugin.testing import ToolParserConformance


class TestMistralConformance(ToolParserConformance):
    distribution = "tallow-tool-mistral"
    component = "mistral"
    examples = [
        (
            "[TOOL_CALLS]"
            + json.dumps(
                [
                    {"name": "get_weather", "arguments": {"city": "Paris"}},
                    {"name": "get_time", "arguments": {}},
                ]
            ),
            [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ),
        (
            'Let me check. [TOOL_CALLS]get_weather[ARGS]{"city": "東京"}'
            '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "UTC"}',
            [("get_weather", {"city": "東京"}), ("get_time", {"tz": "UTC"})],
        ),
    ]

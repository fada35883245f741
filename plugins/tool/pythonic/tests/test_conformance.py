"""The pythonic parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ToolParserConformance


class TestPythonicConformance(ToolParserConformance):
    distribution = "tallow-tool-pythonic"
    component = "pythonic"
    examples = [
        (
            '[get_weather(city="Paris", unit="celsius")]',
            [("get_weather", {"city": "Paris", "unit": "celsius"})],
        ),
        (
            "<|python_start|>[ls(dir='東京 😀', depth=2), ls()]<|python_end|>",
            [("ls", {"dir": "東京 😀", "depth": 2}), ("ls", {})],
        ),
        (
            "<think>need the files</think>\n[search(q=\"a], b)\", filters={'lang': ['en'], 'n': None})]\n",
            [("search", {"q": "a], b)", "filters": {"lang": ["en"], "n": None}})],
        ),
    ]

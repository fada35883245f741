"""The ``<think>`` parsers against tallow's reasoning-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ReasoningParserConformance


class TestThinkConformance(ReasoningParserConformance):
    distribution = "tallow-reasoning-think"
    component = "think"
    examples = [
        (
            "<think>\nParis is in France.\n</think>\n\nParis.",
            "\nParis is in France.\n",
            "\n\nParis.",
        ),
        ("  <think>a < b and c </ d</think>x", "a < b and c </ d", "x"),
        ("<think></think>Only content.", "", "Only content."),
        ("No tags at all: 1 < 2, </b>.", "", "No tags at all: 1 < 2, </b>."),
        ("<think>unterminated, still thinking", "unterminated, still thinking", ""),
        ("\n</think>\n\nThe template opened it.", "\n", "\n\nThe template opened it."),
        (
            "Answer first <think>not reasoning</think>",
            "",
            "Answer first <think>not reasoning</think>",
        ),
        ("<think>東京 😀</think>café", "東京 😀", "café"),
        ("<thin", "", "<thin"),
        ("", "", ""),
    ]


class TestDeepSeekR1Conformance(ReasoningParserConformance):
    distribution = "tallow-reasoning-think"
    component = "deepseek_r1"
    untagged_is_reasoning = True
    examples = [
        (
            "Okay, the user asks about Paris.\n</think>\n\nParis.",
            "Okay, the user asks about Paris.\n",
            "\n\nParis.",
        ),
        ("<think>\nwritten anyway\n</think>answer", "\nwritten anyway\n", "answer"),
        ("still thinking, no end", "still thinking, no end", ""),
        ("</think>at once", "", "at once"),
        ("a </thin b</think>c", "a </thin b", "c"),
        ("", "", ""),
    ]

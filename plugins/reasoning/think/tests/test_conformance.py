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


class TestDeepSeekR1AfterPromptsConformance(ReasoningParserConformance):
    """deepseek_r1 told the prompt: GLM-4.7's generation prompt opens ``<think>`` with thinking
    on and writes ``</think>`` with it off; the response begins where the prompt left it."""

    distribution = "tallow-reasoning-think"
    component = "deepseek_r1"
    untagged_is_reasoning = True
    examples = [("plan</think>answer", "plan", "answer")]
    prompt_examples = [
        ("<|user|>hi<|assistant|><think>", "plan</think>answer", "plan", "answer"),
        ("<|user|>hi<|assistant|></think>", "Paris, 1 < 2.", "", "Paris, 1 < 2."),
        ("<|user|>hi<|assistant|></think>", "<think>anyway</think>x", "anyway", "x"),
        ("<｜Assistant｜><think>\n", "still thinking", "still thinking", ""),
        ("no tag at the end", "still thinking", "still thinking", ""),
    ]


class TestThinkAfterPromptsConformance(ReasoningParserConformance):
    """think told the prompt: a prompt that opened the block starts the response inside it."""

    distribution = "tallow-reasoning-think"
    component = "think"
    examples = [("<think>r</think>c", "r", "c")]
    prompt_examples = [
        ("<|im_start|>assistant\n<think>\n", "r\n</think>\n\nc", "r\n", "\n\nc"),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "plain", "", "plain"),
        ("<|im_start|>assistant\n", "plain", "", "plain"),
    ]

"""The gemma4 reasoning parser against tallow's reasoning-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ReasoningParserConformance

# The ends of the prompts Gemma 4's chat template renders: thinking on (the model opens the
# channel) and off (the template closes an empty one); and a template that opens the channel.
ON = "<|turn>user\nhi<turn|>\n<|turn>model\n"
OFF = ON + "<|channel>thought\n<channel|>"


class TestGemma4Conformance(ReasoningParserConformance):
    distribution = "tallow-reasoning-gemma4"
    component = "gemma4"
    examples = [
        (
            "<|channel>thought\nThe user asks about Paris.\n<channel|>Paris.<turn|>",
            "The user asks about Paris.\n",
            "Paris.",
        ),
        ("<|channel>thought\n<channel|>Only content.", "", "Only content."),
        ("<|channel>thought<channel|>x", "", "x"),
        ("<|channel>thoughtful<channel|>x", "thoughtful", "x"),
        ("<|channel>thought\nthought\n1 < 2<channel|>", "thought\n1 < 2", ""),
        ("<|channel>thought\nunterminated<eos>", "unterminated", ""),
        (
            "No channel: 1 < 2, <channel, thought.<turn|>",
            "",
            "No channel: 1 < 2, <channel, thought.",
        ),
        (
            "Answer <|channel>thought\nnot reasoning<channel|>",
            "",
            "Answer <|channel>thought\nnot reasoning<channel|>",
        ),
        ("<|channel>thought\n東京 😀<channel|>café<|tool_response>", "東京 😀", "café"),
        ("<|chan", "", "<|chan"),
        ("<tur", "", "<tur"),
        ("", "", ""),
    ]
    prompt_examples = [
        (ON, "<|channel>thought\nhmm<channel|>Paris.<turn|>", "hmm", "Paris."),
        (OFF, "Paris, thought\nabout it.<turn|>", "", "Paris, thought\nabout it."),
        (ON + "<|channel>", "thought\nhmm<channel|>Paris.", "hmm", "Paris."),
        (
            ON + "<|channel>thought\n",
            "thought\nis kept<channel|>Paris.",
            "thought\nis kept",
            "Paris.",
        ),
    ]

"""Which models the ``<think>`` parsers claim when the server chooses a parser itself."""

from __future__ import annotations

from tallow_reasoning_think.parser import OpenThinkReasoningParser, ThinkReasoningParser

QWEN3 = (
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)
R1 = "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
PLAIN = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"


def test_think_claims_templates_with_think_blocks() -> None:
    assert ThinkReasoningParser.matches("any", QWEN3)
    assert ThinkReasoningParser.matches("any", R1)
    assert not ThinkReasoningParser.matches("Qwen/Qwen3-8B", PLAIN)
    assert ThinkReasoningParser.matches("Qwen/Qwen3-8B", None)
    assert not ThinkReasoningParser.matches("meta-llama/Llama-3.1-8B", None)


def test_deepseek_r1_claims_templates_that_open_the_block() -> None:
    assert OpenThinkReasoningParser.matches("any", R1)
    assert not OpenThinkReasoningParser.matches("any", QWEN3)
    assert OpenThinkReasoningParser.matches("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None)
    assert not OpenThinkReasoningParser.matches("Qwen/Qwen3-8B", None)

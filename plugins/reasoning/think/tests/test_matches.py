"""Which models the ``<think>`` parsers claim when the server chooses a parser itself."""

from __future__ import annotations

import pytest
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


# The generation prompts of GLM-4.5/4.6 (the model opens the block itself; "/nothink" turns
# write an empty one), GLM-4.7 (the prompt opens the block unless thinking is off) and
# MiniMax M2 (the prompt always opens it), with the assistant turns that carry a block.
GLM45 = (
    "{%- if loop.index0 > ns.last_user_index and reasoning_content -%}"
    "{{ '\\n<think>' + reasoning_content.strip() +  '</think>'}}"
    "{%- else -%}{{ '\\n<think></think>' }}{%- endif -%}"
    "{%- if add_generation_prompt -%}\n    <|assistant|>{{- '\\n<think></think>' if "
    "(enable_thinking is defined and not enable_thinking) else '' -}}\n{%- endif -%}"
)
GLM47 = (
    "{{ '<think>' + reasoning_content.strip() + '</think>' }}"
    "{%- if add_generation_prompt -%}\n    <|assistant|>{{- '</think>' if "
    "(enable_thinking is defined and not enable_thinking) else '<think>' -}}\n{%- endif -%}"
)
MINIMAX_M2 = (
    "{{- '<think>' ~ '\\n' ~ reasoning_content ~ '\\n' ~ '</think>' ~ '\\n\\n' }}"
    "{%- if add_generation_prompt -%}\n{{- ']~b]ai' ~ '\\n' ~ '<think>' ~ '\\n' }}\n{%- endif -%}"
)
QWEN3_FULL = (
    "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_glm45_is_read_by_think() -> None:
    assert ThinkReasoningParser.matches("zai-org/GLM-4.5-Air", GLM45)
    assert not OpenThinkReasoningParser.matches("zai-org/GLM-4.5-Air", GLM45)
    assert ThinkReasoningParser.matches("zai-org/GLM-4.6", None)
    assert not OpenThinkReasoningParser.matches("zai-org/GLM-4.6", None)


@pytest.mark.parametrize("template", [GLM47, MINIMAX_M2], ids=["glm47", "minimax_m2"])
def test_templates_opening_the_block_are_read_by_deepseek_r1(template: str) -> None:
    # both claim the template; deepseek_r1 has the higher priority, so it is chosen
    assert OpenThinkReasoningParser.matches("any", template)
    assert ThinkReasoningParser.matches("any", template)
    assert OpenThinkReasoningParser.priority > ThinkReasoningParser.priority
    split = OpenThinkReasoningParser().parse("Plan it.</think>\n<tool_call>ls</tool_call>")
    assert split == ("Plan it.", "\n<tool_call>ls</tool_call>")


def test_names_without_a_template() -> None:
    for name in ("zai-org/GLM-4.7-Flash", "MiniMaxAI/MiniMax-M2"):
        assert OpenThinkReasoningParser.matches(name, None), name


def test_qwen3_template_with_its_history_is_not_an_opening_one() -> None:
    assert ThinkReasoningParser.matches("any", QWEN3_FULL)
    assert not OpenThinkReasoningParser.matches("any", QWEN3_FULL)

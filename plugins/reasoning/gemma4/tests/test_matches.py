"""Which templates and names the gemma4 parser claims, and where a prompt leaves the reply.

The template text is the part of Gemma 4's chat template (google/gemma-4-*-it, Apache-2.0;
the whole template is a fixture of tallow-tool-gemma4's tests) that the parser keys on: the
thinking switch of the system turn and the generation prompt.
"""

from __future__ import annotations

from tallow_reasoning_gemma4.parser import Gemma4ReasoningParser

GEMMA4_PARTS = """
    {%- if enable_thinking is defined and enable_thinking -%}
        {{- '<|think|>' -}}
        {%- set ns.prev_message_type = 'think' -%}
    {%- endif -%}
{%- if add_generation_prompt -%}
    {%- if ns.prev_message_type != 'tool_response' -%}
        {{- '<|turn>model\\n' -}}
    {%- endif -%}
    {%- if not enable_thinking | default(false) -%}
        {{- '<|channel>thought\\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"""
GEMMA3 = "{{ '<start_of_turn>model\\n' }}"
HARMONY = "<|start|>assistant<|channel|>analysis<|message|>"


def test_claims_gemma4_templates_and_names() -> None:
    assert Gemma4ReasoningParser.matches("any", GEMMA4_PARTS)
    assert Gemma4ReasoningParser.reads_special_tokens
    assert not Gemma4ReasoningParser.matches("google/gemma-4-31b-it", GEMMA3)
    assert not Gemma4ReasoningParser.matches("openai/gpt-oss-20b", HARMONY)
    for name in ("google/gemma-4-31b-it", "google/gemma-4-26B-A4B-it", "gemma4"):
        assert Gemma4ReasoningParser.matches(name, None), name
    assert not Gemma4ReasoningParser.matches("google/gemma-3-27b-it", None)


def test_for_prompt_copies_and_leaves_the_parser() -> None:
    parser = Gemma4ReasoningParser()
    assert parser.for_prompt("<|turn>model\n") is parser
    assert parser.for_prompt("<|turn>model\n<|channel>thought\n<channel|>") is parser
    opened = parser.for_prompt("<|turn>model\n<|channel>")
    assert opened is not parser
    assert opened.parse("thought\nhmm<channel|>ok") == ("hmm", "ok")
    assert parser.parse("thought\nhmm<channel|>ok") == ("", "thought\nhmm<channel|>ok")

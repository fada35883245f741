"""``<think>…</think>`` reasoning parsers, on :class:`tallow.plugin.TagReasoningParser`."""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin import TagReasoningParser

_THINK_NAMES = re.compile(r"qwen3|qwq|glm[-_ ]?4[._-]?[56]", re.IGNORECASE)
_R1_NAMES = re.compile(r"deepseek-?r1|glm[-_ ]?4[._-]?7|minimax[-_ ]?m2", re.IGNORECASE)
#: DeepSeek-R1 templates open the block at the end of the generation prompt
_R1_OPENING = re.compile(r"Assistant｜>\s*<think>|<｜Assistant｜><think>")
#: a string literal of the template ending in an opening tag (and newlines): ``'<think>'``,
#: ``'\n' ~ '<think>' ~ '\n'`` (GLM-4.7, MiniMax M2) — unlike Qwen3's or GLM-4.5's
#: ``'<think>\n\n</think>'``, which close the block they open
_OPENING_LITERAL = re.compile(r"<think>(?:\\n|\n)*['\"]")
_GENERATION_PROMPT = "add_generation_prompt"


def opens_block_in_prompt(chat_template: str) -> bool:
    """Whether the template's generation prompt (what follows its last mention of
    ``add_generation_prompt``) writes an opening ``<think>`` that it does not close."""
    if _R1_OPENING.search(chat_template):
        return True
    at = chat_template.rfind(_GENERATION_PROMPT)
    return at >= 0 and bool(_OPENING_LITERAL.search(chat_template, at))


class ThinkReasoningParser(TagReasoningParser):
    """Qwen3 / QwQ: the response may open with ``<think>``; the block's text is reasoning."""

    start_tag = "<think>"
    end_tag = "</think>"
    priority: ClassVar[int] = 50

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes ``<think>`` blocks; without a template, a Qwen3/QwQ name."""
        if chat_template is not None:
            return cls.start_tag in chat_template or cls.end_tag in chat_template
        return bool(_THINK_NAMES.search(model_name or ""))


class OpenThinkReasoningParser(ThinkReasoningParser):
    """Templates that open ``<think>`` in the prompt (DeepSeek-R1 distills, GLM-4.7, MiniMax
    M2): the response begins inside the block and only ``</think>`` appears."""

    starts_inside = True
    priority: ClassVar[int] = 60

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template's generation prompt opens ``<think>`` (:func:`opens_block_in_prompt`);
        without a template, a DeepSeek-R1, GLM-4.7 or MiniMax M2 name."""
        if chat_template is not None:
            return opens_block_in_prompt(chat_template)
        return bool(_R1_NAMES.search(model_name or ""))

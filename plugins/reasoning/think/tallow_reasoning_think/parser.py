"""``<think>…</think>`` reasoning parsers, on :class:`tallow.plugin.TagReasoningParser`."""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin import TagReasoningParser

_THINK_NAMES = re.compile(r"qwen3|qwq", re.IGNORECASE)
_R1_NAMES = re.compile(r"deepseek-?r1", re.IGNORECASE)
#: DeepSeek-R1 templates open the block at the end of the generation prompt
_R1_OPENING = re.compile(r"Assistant｜>\s*<think>|<｜Assistant｜><think>")


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
    """DeepSeek-R1 distills: the template opens ``<think>`` in the prompt, so the response
    begins inside the block and only ``</think>`` appears."""

    starts_inside = True
    priority: ClassVar[int] = 60

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template opens ``<think>`` after the assistant tag of the generation prompt;
        without a template, a DeepSeek-R1 name."""
        if chat_template is not None:
            return bool(_R1_OPENING.search(chat_template))
        return bool(_R1_NAMES.search(model_name or ""))

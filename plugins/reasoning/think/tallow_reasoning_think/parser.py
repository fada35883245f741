"""``<think>…</think>`` reasoning parsers, on :class:`tallow.plugin.TagReasoningParser`."""

from __future__ import annotations

from tallow.plugin import TagReasoningParser


class ThinkReasoningParser(TagReasoningParser):
    """Qwen3 / QwQ: the response may open with ``<think>``; the block's text is reasoning."""

    start_tag = "<think>"
    end_tag = "</think>"


class OpenThinkReasoningParser(ThinkReasoningParser):
    """DeepSeek-R1 distills: the template opens ``<think>`` in the prompt, so the response
    begins inside the block and only ``</think>`` appears."""

    starts_inside = True

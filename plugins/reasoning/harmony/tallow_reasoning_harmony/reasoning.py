"""The harmony reasoning parser: ``analysis`` messages are reasoning, the others content.

Where each message's body goes:

- a call to a function (recipient ``functions.NAME``): content, as harmony markup in its
  canonical form (``<|start|>assistant`` + the header as written + body + stop token), so that
  the ``harmony`` tool parser, which reads the content, finds the call;
- the ``analysis`` channel, and messages to a built-in tool the model runs in its chain of
  thought (``to=python``, ``to=browser.search``): reasoning;
- every other message (``final``; ``commentary`` preambles meant for the user; no channel):
  content, without its markup.

Text outside any message is content: a response without harmony markup is all content.
Headers, stop tokens and the markup between messages appear in neither part.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin import ReasoningParser, ReasoningSplit, ReasoningStream

from .messages import Body, Close, Event, HarmonyReader, Header, Open, Text

#: a chat template that writes harmony (gpt-oss's), or a model named after it
TEMPLATE_MARK = "<|channel|>"
NAME_HINT = re.compile(r"gpt-oss|harmony", re.IGNORECASE)
_REASONING, _CONTENT, _CALL = range(3)
_NOT_TOOLS = (None, "assistant", "user")


def route(header: Header) -> int:
    """Where a message's body goes (see the module docstring)."""
    if header.function is not None:
        return _CALL
    if header.channel == "analysis" or header.recipient not in _NOT_TOOLS:
        return _REASONING
    return _CONTENT


class HarmonyFormat:
    """What both harmony parsers declare: they claim a chat template that writes harmony
    channels (without a template, a gpt-oss model name), above the other formats, and read the
    special tokens harmony's markup is made of."""

    name = "harmony"
    priority: ClassVar[int] = 80
    reads_special_tokens: ClassVar[bool] = True

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        if chat_template is not None:
            return TEMPLATE_MARK in chat_template
        return bool(NAME_HINT.search(model_name or ""))


class HarmonyReasoningStream(ReasoningStream):
    """Streaming half of :class:`HarmonyReasoningParser`."""

    def __init__(self) -> None:
        self._reader = HarmonyReader()
        self._route = _CONTENT

    def feed(self, text: str) -> ReasoningSplit:
        return self._split(self._reader.feed(text))

    def finish(self) -> ReasoningSplit:
        return self._split(self._reader.finish())

    def _split(self, events: list[Event]) -> ReasoningSplit:
        reasoning: list[str] = []
        content: list[str] = []
        for event in events:
            if isinstance(event, Text):
                content.append(event.text)
            elif isinstance(event, Open):
                self._route = route(event.header)
                if self._route == _CALL:
                    content.append(event.markup)
            elif isinstance(event, Body):
                (reasoning if self._route == _REASONING else content).append(event.text)
            elif isinstance(event, Close):
                if self._route == _CALL:
                    content.append(event.token)
                self._route = _CONTENT
        return ReasoningSplit("".join(reasoning), "".join(content))


class HarmonyReasoningParser(HarmonyFormat, ReasoningParser):
    """gpt-oss: the ``analysis`` channel is reasoning, ``final`` (and preambles) content."""

    def stream(self) -> HarmonyReasoningStream:
        return HarmonyReasoningStream()

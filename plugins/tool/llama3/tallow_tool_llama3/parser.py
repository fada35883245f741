"""Llama 3.x JSON tool calls.

::

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}

The calls must be the whole response: they start it (after whitespace or a ``<think>`` block)
or follow ``<|python_tag|>``, and nothing but whitespace (or a last ``;``) comes after them —
otherwise the JSON is an answer, not a call, and stays content. ``"arguments"`` is accepted for
``"parameters"``; ``"type": "function"`` may be present.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    JsonSpan,
    MarkupToolParser,
    bracket_opens,
    call_from_json,
    loads_strict,
    skip_ws,
)

PYTHON_TAG = "<|python_tag|>"
_NAME_HINT = re.compile(r"llama[-_ ]?3", re.IGNORECASE)


class Llama3Region(CallRegion):
    """``object (; object)* [;]`` up to the end of the response."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        # The anchored opener "{" is the first character of the first object itself.
        self._pos = len(opener) if opener == PYTHON_TAG else 0
        self._span: JsonSpan | None = None
        self._calls: list[FoundCall] = []
        self._want_object = True

    def decide(self, text: str, final: bool) -> Decision | None:
        while True:
            if self._span is None:
                i = skip_ws(text, self._pos)
                if i == len(text):
                    if not final:
                        return None
                    return self.accept(len(text), self._calls)  # no call: malformed
                if not self._want_object:
                    if text[i] != ";":
                        return self.malformed(i)
                    self._pos, self._want_object = i + 1, True
                    continue
                opens = text[i] == "{" and bracket_opens(text, i, '"}')
                if opens is None:
                    return self.pending(final)
                if not opens:
                    return self.malformed(i)
                self._span = JsonSpan(i)
            end = self._span.scan(text)
            if end is None:
                return self.pending(final)
            try:
                call = call_from_json(
                    loads_strict(text[self._span.start : end]), ("parameters", "arguments")
                )
            except ValueError:
                call = None
            if call is None or not self.tools.known(call.name):
                return self.malformed()
            self._calls.append(call)
            self._span, self._pos, self._want_object = None, end, False


class Llama3JsonToolParser(MarkupToolParser):
    """Llama 3.x ``{"name", "parameters"}`` calls making up the whole response."""

    name = "llama3_json"
    priority: ClassVar[int] = 40
    openers = {PYTHON_TAG: Llama3Region}
    anchored_openers = {"{": Llama3Region}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template is a Llama 3 one that offers tools; else a Llama 3 model name."""
        if chat_template is not None:
            return PYTHON_TAG in chat_template or (
                "<|start_header_id|>" in chat_template and '"parameters"' in chat_template
            )
        return bool(_NAME_HINT.search(model_name or ""))

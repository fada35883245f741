"""The Hermes / Qwen2.5 tool-call format.

::

    Some text
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The object must be followed (after whitespace) by ``</tool_call>``; ``"parameters"`` is accepted
for ``"arguments"``, and arguments given as a string holding a JSON object are decoded.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    JsonSpan,
    MarkupToolParser,
    bracket_opens,
    call_from_json,
    loads_strict,
    match_literal,
    skip_ws,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME_HINT = re.compile(r"qwen|hermes", re.IGNORECASE)


class HermesRegion(CallRegion):
    """``<tool_call>`` ws JSON-object ws ``</tool_call>``."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._span: JsonSpan | None = None

    def decide(self, text: str, final: bool) -> Decision | None:
        if self._span is None:
            i = skip_ws(text, len(self.opener))
            if i == len(text):
                return self.pending(final)
            opens = text[i] == "{" and bracket_opens(text, i, '"}')
            if opens is None:
                return self.pending(final)
            if not opens:
                return self.malformed(i)
            self._span = JsonSpan(i)
        end = self._span.scan(text)
        if end is None:
            return self.pending(final)
        j = skip_ws(text, end)
        closed = match_literal(text, j, CLOSE)
        if closed is None:
            return self.pending(final)
        if not closed:
            return self.malformed(j)
        try:
            call = call_from_json(loads_strict(text[self._span.start : end]))
        except ValueError:
            return self.malformed()
        return self.accept(j + len(CLOSE), [call] if call else [])


class HermesToolParser(MarkupToolParser):
    """``<tool_call>{json}</tool_call>`` calls, as Qwen2.5 and Hermes models write them."""

    name = "hermes"
    priority: ClassVar[int] = 60
    call_opening: ClassVar[str] = OPEN + "\n"
    call_closing: ClassVar[str] = "\n" + CLOSE
    openers = {OPEN: HermesRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template asks for ``<tool_call>``; without a template, a Qwen/Hermes model name."""
        if chat_template is not None:
            return OPEN in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

"""Plain JSON tool calls: the whole response is one call object or a list of them.

::

    {"name": "get_weather", "arguments": {"city": "Paris"}}
    [{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": 1}}]

Only whitespace (or a leading ``<think>`` block) may surround the JSON; JSON that is not made of
calls — an answer that happens to be JSON — stays content, as does JSON in a code fence.
"""

from __future__ import annotations

from typing import ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion, Decision, JsonSpan, MarkupToolParser, bracket_opens, call_from_json,
    loads_strict, skip_ws,
)


class JsonRegion(CallRegion):
    """One JSON value (object or array) that must end the response."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._span = JsonSpan(0)
        self._calls: list | None = None

    def decide(self, text: str, final: bool) -> Decision | None:
        if self._calls is None:  # "[" must open a list of objects, "{" an object with keys
            opens = bracket_opens(text, 0, '{]' if text[0] == "[" else '"}')
            if opens is None:
                return self.pending(final)
            if not opens:
                return self.malformed()
        end = self._span.scan(text)
        if end is None:
            return self.pending(final)
        if self._calls is None:
            try:
                value = loads_strict(text[:end])
            except ValueError:
                return self.malformed()
            items = value if isinstance(value, list) else [value]
            calls = [call_from_json(item) for item in items]
            if not calls or not all(calls) or not all(self.tools.known(c.name) for c in calls):
                return self.malformed()  # decided as soon as the value closes
            self._calls = calls
        j = skip_ws(text, end)
        if j < len(text):
            return self.malformed(j)
        return self.accept(len(text), self._calls) if final else None


class JsonToolParser(MarkupToolParser):
    """A response that is a JSON call object ``{"name", "arguments"}`` or a list of them."""

    name = "json"
    priority: ClassVar[int] = -100
    anchored_openers = {"{": JsonRegion, "[": JsonRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """Always: the fallback for models without a known format."""
        return True

"""Plain JSON tool calls: the whole response is call objects, bare or in one code fence.

::

    {"name": "get_weather", "arguments": {"city": "Paris"}}
    [{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": 1}}]
    {"name": "a", "arguments": {}}
    {"name": "b", "arguments": {}}
    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

The response is one JSON value, or several separated by whitespace (small models write one call
object per line), each a call object or a list of them; or such values inside one code fence
(```` ``` ```` or ```` ```json ````). Only whitespace (or a leading ``<think>`` block) may surround
them; JSON that is not made of calls — an answer that happens to be JSON — stays content, as
does a fence holding anything else.
"""

from __future__ import annotations

from typing import ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    JsonSpan,
    MarkupToolParser,
    ToolSet,
    bracket_opens,
    call_from_json,
    loads_strict,
    skip_ws,
)


class _Values:
    """Reads whitespace-separated JSON values of call objects from a growing text."""

    def __init__(self, tools: ToolSet) -> None:
        self.tools = tools
        self.calls: list[FoundCall] = []
        self.next = 0  # where the next value may start
        self._span: JsonSpan | None = None

    def read(self, text: str, stop: int) -> bool | None:
        """Read the values in ``text[:stop]``: False when something there is not a call value,
        None while the last value is still open, True when every value read is calls (the
        text up to ``stop`` is then whitespace after the last one)."""
        visible = text if stop == len(text) else text[:stop]
        while True:
            start = skip_ws(visible, self.next) if self._span is None else self._span.start
            if start >= stop:
                return True
            if self._span is None:
                if text[start] not in "{[":
                    return False
                opens = bracket_opens(visible, start, "{]" if text[start] == "[" else '"}')
                if opens is None:
                    return None
                if not opens:
                    return False
                self._span = JsonSpan(start)
            end = self._span.scan(visible)
            if end is None:
                return None
            self._span = None
            try:
                value = loads_strict(text[start:end])
            except ValueError:
                return False
            items = value if isinstance(value, list) else [value]
            calls = [call_from_json(item) for item in items]
            if (
                not calls
                or not all(calls)
                or not all(
                    self.tools.known(c.name)  # type: ignore[union-attr]
                    for c in calls
                )
            ):
                return False  # decided as soon as the value closes
            self.calls += calls  # type: ignore[arg-type]
            self.next = end


class JsonRegion(CallRegion):
    """JSON values of calls that must end the response."""

    def __init__(self, opener: str, tools: ToolSet) -> None:
        super().__init__(opener, tools)
        self._values = _Values(tools)

    def decide(self, text: str, final: bool) -> Decision | None:
        got = self._values.read(text, len(text))
        if got is False:
            return self.malformed()
        if got is None:
            return self.pending(final)
        return self.accept(len(text), self._values.calls) if final else None


class FencedJsonRegion(CallRegion):
    """A code fence holding JSON values of calls, which must end the response."""

    def __init__(self, opener: str, tools: ToolSet) -> None:
        super().__init__(opener, tools)
        self._values: _Values | None = None

    def decide(self, text: str, final: bool) -> Decision | None:
        if self._values is None:
            line_end = text.find("\n", len(self.opener))
            if line_end < 0:
                return self.pending(final)
            if text[len(self.opener) : line_end].strip() not in ("", "json"):
                return self.malformed()
            self._values = _Values(self.tools)
            self._values.next = line_end + 1
        close = text.find(self.opener, self._values.next)
        # before the closing fence arrives, a trailing "`" or "``" may be its start
        stop = close if close >= 0 else max(self._values.next, len(text.rstrip("`")))
        got = self._values.read(text, stop)
        if got is False:
            return self.malformed()
        if close < 0 or got is None:
            return self.pending(final)
        if skip_ws(text, close + len(self.opener)) < len(text):
            return self.malformed()
        return self.accept(len(text), self._values.calls) if final else None


class JsonToolParser(MarkupToolParser):
    """A response that is a JSON call object ``{"name", "arguments"}`` or a list of them."""

    name = "json"
    priority: ClassVar[int] = -100
    anchored_openers = {"{": JsonRegion, "[": JsonRegion, "```": FencedJsonRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """Always: the fallback for models without a known format."""
        return True

"""The harmony tool parser: messages addressed to ``functions.NAME`` are tool calls.

::

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>

A call is such a message whose body is a JSON object; it ends at its stop token (``<|call|>``
usually), at the next header, or at the end of the response (the server's stop token may have
ended the generation without appearing in the text). The recipient may stand in the role part or
the channel part of the header, on any channel.

Everything else is content exactly as written, markup included: the parser is meant to read the
content left by the ``harmony`` reasoning parser (final text and call markup); without it, the
other messages stay in the content as the model wrote them. A call message that is not a valid
call (a body that is not a JSON object, a tool not offered) is content, character for character.
"""

from __future__ import annotations

from typing import Any

from tallow.plugin import StreamDelta, StreamingToolParser, ToolCallDelta, ToolParser
from tallow.plugin import ParseResult, assemble, new_call_id
from tallow.plugin.tool_parsing import ToolSet, compact_json, loads_strict

from .messages import Body, Close, Event, HarmonyReader, Markup, Open, Text
from .reasoning import HarmonyFormat


class HarmonyToolStream(StreamingToolParser):
    """Streaming half of :class:`HarmonyToolParser`: content flows as it comes (trailing
    whitespace held back, since a response with calls drops it); a call is sent whole once its
    message ends."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._tools = ToolSet(tools)
        self._reader = HarmonyReader()
        self._call: str | None = None  # the function of the open call message
        self._raw: list[str] = []  # that message as written
        self._body: list[str] = []
        self._calls = 0
        self._ws = ""
        self._out = StreamDelta()

    def feed(self, text: str) -> StreamDelta:
        return self._emit(self._reader.feed(text))

    def finish(self) -> StreamDelta:
        out = self._emit(self._reader.finish())
        if self._ws and not self._calls:
            out.content += self._ws
        self._ws = ""
        return out

    def _emit(self, events: list[Event]) -> StreamDelta:
        self._out = StreamDelta()
        for event in events:
            if isinstance(event, Open) and event.header.function is not None:
                self._call, self._raw, self._body = event.header.function, [event.raw], []
            elif self._call is not None and isinstance(event, Body):
                self._body.append(event.text)
            elif self._call is not None and isinstance(event, Close):
                self._close(event.token)
            elif isinstance(event, (Text, Markup, Body)):
                self._content(event.text)
            elif isinstance(event, Open):
                self._content(event.raw)
            else:
                self._content(event.token)
        return self._out

    def _close(self, token: str) -> None:
        name, body = self._call, "".join(self._body)
        assert name is not None
        self._call = None
        args = _json_object(body)
        if args is None or not self._tools.known(name):
            self._content("".join(self._raw) + body + token)
            return
        self._out.tool_calls.append(
            ToolCallDelta(self._calls, new_call_id(), name, compact_json(args))
        )
        self._calls += 1

    def _content(self, text: str) -> None:
        if not text:
            return
        held = self._ws + text
        body = held.rstrip()
        self._out.content += body
        self._ws = held[len(body) :]


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = loads_strict(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class HarmonyToolParser(HarmonyFormat, ToolParser):
    """Tool calls of gpt-oss: harmony messages to ``functions.NAME`` with a JSON body."""

    def stream(self, tools: list[dict[str, Any]] | None = None) -> HarmonyToolStream:
        return HarmonyToolStream(tools)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        stream = self.stream(tools)
        return assemble([stream.feed(text), stream.finish()])

"""A tool-call parser for lines of the form ``CALL <name> <json arguments>``."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from tallow.plugin import ParseResult, StreamDelta, StreamingToolParser, ToolCall, ToolCallDelta
from tallow.plugin import ToolParser

PREFIX = "CALL "


class CallLineParser(ToolParser):
    """Every line ``CALL name {...}`` with a JSON object is a call; other lines are content."""

    name: ClassVar[str] = "{{ cookiecutter.component_name }}"
    priority: ClassVar[int] = 0

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        # chosen automatically only for templates that teach the model this syntax
        return bool(chat_template) and PREFIX.strip() in chat_template

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        content: list[str] = []
        calls: list[ToolCall] = []
        names = _tool_names(tools)
        for line in text.splitlines(keepends=True):
            call = _call(line, names)
            if call is None:
                content.append(line)
            else:
                calls.append(call)
        rest = "".join(content)
        return ParseResult(content=rest if rest or not calls else None, tool_calls=calls)

    def stream(self, tools: list[dict[str, Any]] | None = None) -> StreamingToolParser:
        return _LineStream(_tool_names(tools))


def _tool_names(tools: list[dict[str, Any]] | None) -> set[str] | None:
    """The names a call may use (None: any, when the request offers no tools)."""
    if not tools:
        return None
    return {t.get("function", {}).get("name") for t in tools}


def _call(line: str, names: set[str] | None) -> ToolCall | None:
    if not line.startswith(PREFIX):
        return None
    name, _, arguments = line[len(PREFIX):].strip().partition(" ")
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None  # malformed markup stays content
    if not name or not isinstance(parsed, dict) or (names is not None and name not in names):
        return None  # not a call: the line stays content
    return ToolCall(name=name, arguments=json.dumps(parsed))


class _LineStream(StreamingToolParser):
    """Holds text until a line is complete, then emits it as content or as one call."""

    def __init__(self, names: set[str] | None) -> None:
        self._names = names
        self._buffer = ""
        self._index = 0

    def feed(self, text: str) -> StreamDelta:
        self._buffer += text
        delta = StreamDelta()
        while "\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition("\n")
            self._emit(line + "\n", delta)
        return delta

    def finish(self) -> StreamDelta:
        delta = StreamDelta()
        if self._buffer:
            self._emit(self._buffer, delta)
            self._buffer = ""
        return delta

    def _emit(self, line: str, delta: StreamDelta) -> None:
        call = _call(line, self._names)
        if call is None:
            delta.content += line
            return
        delta.tool_calls.append(ToolCallDelta(index=self._index, id=call.id, name=call.name,
                                              arguments=call.arguments))
        self._index += 1

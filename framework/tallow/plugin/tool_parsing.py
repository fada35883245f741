"""The contract of tool-call parsers (model text → OpenAI ``tool_calls``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .components import Component


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One complete call: ``arguments`` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)


@dataclass
class ParseResult:
    """Text left for ``content`` (None if nothing but calls) and the calls found."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolCallDelta:
    """A piece of the call at ``index``: the first piece carries id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamDelta:
    """What one chunk of model text adds: plain content and/or tool-call pieces."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


class StreamingToolParser:
    """Incremental parser for one response. ``feed`` each text delta, then ``finish`` once."""

    def feed(self, text: str) -> StreamDelta:
        raise NotImplementedError

    def finish(self) -> StreamDelta:
        raise NotImplementedError


class ToolParser(Component):
    """Finds tool calls in model output.

    ``matches`` decides automatic selection from the model name and chat template; ``parse``
    handles a whole response; ``stream`` returns a fresh :class:`StreamingToolParser` whose deltas,
    assembled, equal ``parse``'s result. Markup never leaks into content; text inside code fences
    or ``<think>`` is not taken for a call; malformed markup degrades to plain content.
    """

    priority: ClassVar[int] = 0

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        return False

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        raise NotImplementedError

    def stream(self, tools: list[dict[str, Any]] | None = None) -> StreamingToolParser:
        raise NotImplementedError

"""Forced tool calls (``tool_choice: "required"`` or a named function).

With a grammar backend (:mod:`tallow.server.structured`), the call is constrained: the prompt
ends with the tool parser's ``call_opening`` and the output is the JSON object of one call,
``{"name": <a tool>, "arguments": <valid against that tool's parameters>}``
(:func:`call_schema`), which the grammar ends. :class:`CallStream` reads it as it is written:
the name as soon as it is complete, then the arguments text piece by piece, which is what a
stream sends (OpenAI's shape: a first delta with id and name, then ``arguments`` fragments).

Without a grammar backend, the server steers the model by appending the start of a call to the
generation prompt:

- named function: ``{"name": "<fn>", "arguments": `` — the model writes the arguments object;
- required: ``{"name": "`` — the model picks a tool name, then writes the arguments.

Both are preceded by the tool parser's ``call_opening`` (``<tool_call>\\n`` for the hermes/Qwen
format) when the parser declares one, so the model sees its trained call format. The model's
continuation is read by :class:`ForcedCallScanner`, which finds the tool name and the arguments
object (by bracket depth outside strings) and reports as soon as the object closes, so the server
stops the generation there. A forced call therefore yields exactly one call. A continuation that
does not form a call (bad JSON, an unknown tool, cut off by ``max_tokens``) is returned as
content: the steering prefix plus the model's text, unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tallow.plugin.tool_parsing import (
    JsonSpan,
    ToolCall,
    ToolCallDelta,
    compact_json,
    loads_strict,
    new_call_id,
)

# Required mode: the rest of the name string, then the key of the arguments.
_NAME_THEN_ARGS = re.compile(r'((?:[^"\\\n]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
# A constrained call's head: the name, then the key of the arguments and where they start.
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


def call_schema(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The JSON Schema of one call to the tool ``name`` (None: to any of ``tools``): its name,
    then arguments valid against the tool's ``parameters``."""

    def one(tool: dict[str, Any]) -> dict[str, Any]:
        fn = tool["function"]
        return {
            "type": "object",
            "properties": {
                "name": {"const": fn["name"]},
                "arguments": fn.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    return one(chosen[0]) if len(chosen) == 1 else {"anyOf": [one(t) for t in chosen]}


class CallStream:
    """Reads a constrained call's JSON object as it grows (see the module docstring).

    ``feed(text)`` returns the :class:`ToolCallDelta` s the new text completes: the first, once
    the name is known, carries the call's id and name; the others carry the arguments text as
    it arrives. ``arguments`` is everything sent so far; ``closed`` turns true once the
    arguments object is complete.
    """

    def __init__(self) -> None:
        self.text = ""
        self.name: str | None = None
        self.call_id = new_call_id()
        self._span: JsonSpan | None = None
        self._sent = 0

    def feed(self, text: str) -> list[ToolCallDelta]:
        self.text += text
        out: list[ToolCallDelta] = []
        if self._span is None:
            head = _CALL_HEAD.match(self.text)
            if head is None:
                return out
            self.name = json.loads('"' + head.group(1) + '"')
            self._span = JsonSpan(head.end())
            out.append(ToolCallDelta(0, id=self.call_id, name=self.name))
        end = self._span.scan(self.text)
        upto = end if end is not None else len(self.text)
        piece = self.text[self._span.start + self._sent : upto]
        if piece:
            self._sent += len(piece)
            out.append(ToolCallDelta(0, arguments=piece))
        return out

    @property
    def arguments(self) -> str:
        if self._span is None:
            return ""
        return self.text[self._span.start : self._span.start + self._sent]

    @property
    def closed(self) -> bool:
        return self._span is not None and self._span.end is not None

    def call(self) -> ToolCall | None:
        """The call read so far (its arguments cut short if the output was), or None before
        the name is complete."""
        if self.name is None:
            return None
        return ToolCall(name=self.name, arguments=self.arguments, id=self.call_id)


def steering_prefix(name: str | None, opening: str = "") -> str:
    """The text appended to the generation prompt to force a call (to ``name`` if given)."""
    if name is None:
        return opening + '{"name": "'
    return opening + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


class ForcedCallScanner:
    """Reads the model's continuation of :func:`steering_prefix` into one :class:`ToolCall`.

    ``feed(text)`` adds model text; ``done`` turns true once the arguments object is closed.
    ``result()`` is the call (arguments re-serialized compactly), or None when the text is not
    one; ``raw`` is then the content to return.
    """

    def __init__(self, name: str | None, opening: str = "") -> None:
        self.prefix = steering_prefix(name, opening)
        self.name = name
        self.call_id = new_call_id()
        self.text = ""
        self.done = False
        self._span: JsonSpan | None = None
        self._args_from: int | None = 0 if name is not None else None

    @property
    def raw(self) -> str:
        """What the response says when no call came of it: the prefix and the model's text."""
        return self.prefix + self.text

    def feed(self, text: str) -> None:
        self.text += text
        if self.done:
            return
        if self._args_from is None:
            match = _NAME_THEN_ARGS.match(self.text)
            if match is None:
                return
            try:
                self.name = json.loads('"' + match.group(1) + '"')
            except json.JSONDecodeError:
                self.name = None
                return
            self._args_from = match.end()
        if self._span is None:
            start = self._args_from
            while start < len(self.text) and self.text[start] in " \t\r\n":
                start += 1
            if start == len(self.text):
                return
            if self.text[start] != "{":
                return  # not an object: never done, returned as content at the end
            self._span = JsonSpan(start)
        if self._span.scan(self.text) is not None:
            self.done = True

    def result(self) -> ToolCall | None:
        """The call once ``done`` and well formed; None otherwise."""
        if not self.done or self._span is None or self.name is None:
            return None
        try:
            arguments = loads_strict(self.text[self._span.start : self._span.end])
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(name=self.name, arguments=compact_json(arguments), id=self.call_id)

"""Forced tool calls (``tool_choice: "required"`` or a named function).

The server steers the model by appending the start of a call to the generation prompt:

- named function: ``{"name": "<fn>", "arguments": `` — the model writes the arguments object;
- required: ``{"name": "`` — the model picks a tool name, then writes the arguments.

(Preceded by the tool parser's ``call_opening`` — e.g. ``<tool_call>\\n`` — when the parser
declares one, so the model sees its trained call format.) The text produced after the prefix
is read by :class:`ForcedCallScanner`: a small incremental JSON scanner that finds the tool
name, then the arguments object by brace depth (outside strings), and reports as soon as the
object closes, so the server can stop the generation there. A forced call therefore yields
exactly one call. Output that does not form a call (bad JSON, unknown tool, cut off by
``max_tokens``) degrades to content: the steering prefix plus the model's text, unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tallow.plugin.tool_parsing import StreamDelta, ToolCall, ToolCallDelta, new_call_id

_AFTER_NAME = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def steering_prefix(name: str | None, opening: str = "") -> str:
    """The text appended to the generation prompt to force a call (to ``name`` if given)."""
    if name is None:
        return opening + '{"name": "'
    return opening + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


class ForcedCallScanner:
    """Reads the model's continuation of :func:`steering_prefix` into one :class:`ToolCall`.

    ``feed(text)`` returns the stream delta the new text allows (the id and name first, then
    argument fragments whose concatenation is the arguments JSON text); ``done`` turns true when
    the arguments object is closed; ``failed`` when the text cannot be a call. ``result()``
    gives the call, or None when there is none (then ``raw`` is the content to return).
    """

    def __init__(self, name: str | None, tool_names: set[str], opening: str = "") -> None:
        self.prefix = steering_prefix(name, opening)
        self.tool_names = tool_names
        self.name = name
        self.call_id = new_call_id()
        self.text = ""  # everything the model wrote
        self.done = False
        self.failed = False
        self._announced = False
        self._args_start: int | None = None  # index in self.text where the object starts
        self._pos = 0  # next index of self.text to scan
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.arguments = ""
        if name is not None:
            self._args_start = -1  # the object starts at the first non-space character

    @property
    def raw(self) -> str:
        """What the response says when no call came of it: the prefix and the model's text."""
        return self.prefix + self.text

    def feed(self, text: str) -> StreamDelta:
        if self.done or self.failed:
            self.text += text
            return StreamDelta()
        self.text += text
        delta = StreamDelta()
        if self.name is None or self._args_start is None:
            self._scan_name()
        if self.failed:
            return StreamDelta()
        if self.name is not None and not self._announced:
            if self.name not in self.tool_names:
                self.failed = True
                return StreamDelta()
            self._announced = True
            delta.tool_calls.append(ToolCallDelta(0, id=self.call_id, name=self.name))
        if self._args_start is not None:
            fragment = self._scan_arguments()
            if fragment:
                if delta.tool_calls:
                    delta.tool_calls[0].arguments = fragment
                else:
                    delta.tool_calls.append(ToolCallDelta(0, arguments=fragment))
        return delta if not self.failed else StreamDelta()

    def _scan_name(self) -> None:
        """Required mode: read the JSON string after ``{"name": "``, then ``, "arguments": ``."""
        if self.name is None:
            i = 0
            escape = False
            while i < len(self.text):
                ch = self.text[i]
                if escape:
                    escape = False
                elif ch == "\\":
                    escape = True
                elif ch == '"':
                    break
                elif ch == "\n":
                    self.failed = True
                    return
                i += 1
            else:
                return  # the name is still being written
            try:
                self.name = json.loads('"' + self.text[:i] + '"')
            except json.JSONDecodeError:
                self.failed = True
                return
            self._name_end = i + 1
            if self.name not in self.tool_names:
                self.failed = True
                return
        rest = self.text[self._name_end:]
        match = _AFTER_NAME.match(rest)
        if match is None:
            # Either not written yet (a prefix of ', "arguments": ') or something else.
            stripped = rest.lstrip()
            if stripped and not ', "arguments": '.startswith(stripped[:15]) and \
                    not re.match(r'^,\s*("a?r?g?u?m?e?n?t?s?"?\s*:?)?\s*$', stripped):
                self.failed = True
            return
        if match.end() == len(rest):
            return  # the separator may still grow (more spaces)
        self._args_start = self._name_end + match.end()
        self._pos = self._args_start

    def _scan_arguments(self) -> str:
        start = self._pos
        if self._args_start == -1:
            stripped = self.text.lstrip()
            if not stripped:
                return ""
            self._args_start = len(self.text) - len(stripped)
            self._pos = start = self._args_start
        assert self._args_start is not None
        if self._pos == self._args_start and self._pos < len(self.text):
            if self.text[self._pos] != "{":
                self.failed = True
                return ""
        i = self._pos
        while i < len(self.text):
            ch = self.text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch == "{":
                self._depth += 1
            elif ch == "}":
                self._depth -= 1
                if self._depth == 0:
                    i += 1
                    self.done = True
                    break
            i += 1
        self._pos = i
        fragment = self.text[start:i]
        self.arguments += fragment
        if self.done:
            try:
                value = json.loads(self.arguments)
            except json.JSONDecodeError:
                value = None
            if not isinstance(value, dict):
                self.failed, self.done = True, False
                return ""
        return fragment

    def result(self) -> ToolCall | None:
        """The call, once ``done``; None if the text did not form one."""
        if not self.done or self.failed or self.name is None:
            return None
        return ToolCall(name=self.name, arguments=self.arguments, id=self.call_id)


def parsed_arguments(call: ToolCall) -> Any:
    return json.loads(call.arguments)

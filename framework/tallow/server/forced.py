"""Forced tool calls (``tool_choice: "required"`` or a named function).

The server steers the model by appending the start of a call to the generation prompt:

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

from tallow.plugin.tool_parsing import JsonSpan, ToolCall, compact_json, loads_strict, new_call_id

# Required mode: the rest of the name string, then the key of the arguments.
_NAME_THEN_ARGS = re.compile(r'((?:[^"\\\n]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


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
            arguments = loads_strict(self.text[self._span.start:self._span.end])
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(name=self.name, arguments=compact_json(arguments), id=self.call_id)

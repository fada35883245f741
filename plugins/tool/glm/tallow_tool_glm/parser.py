"""The GLM-4.5 / 4.6 / 4.7 tool-call format.

::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

GLM-4.5 and 4.6 put a newline after the name and after each tag pair; GLM-4.7 writes the same
markup without them. Whitespace between tags is ignored; a value is the exact text between
``<arg_value>`` and the first ``</arg_value>``, so it may hold any other markup. The templates
write a string argument as it is and any other one as JSON (``tojson``), so a value is typed
by the parameter's JSON Schema (:func:`tallow.plugin.tool_values.typed_value`), and read as
JSON when the schema names no type. A key given twice makes the call malformed.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    MarkupToolParser,
    match_literal,
    skip_ws,
)
from tallow.plugin.tool_values import property_schema, typed_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
_NAME = re.compile(r"[^\s<>]*")
_MAX_NAME = 256
_NAME_HINT = re.compile(r"glm[-_ ]?4[._-]?[5-7]", re.IGNORECASE)


class GlmRegion(CallRegion):
    """``<tool_call>`` NAME (``<arg_key>`` K ``</arg_key>`` ``<arg_value>`` V ``</arg_value>``)*
    ``</tool_call>``, whitespace allowed between the parts.

    Read step by step; ``_pos`` keeps how far the text has been read and ``_search`` where to
    look for the end of a value next, so a long value fed in many pieces is scanned once.
    """

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._pos = len(opener)
        self._stage = "name"
        self._name = ""
        self._key = ""
        self._args: dict[str, Any] = {}
        self._search = 0

    def decide(self, text: str, final: bool) -> Decision | None:
        while True:
            step = self._advance(text)
            if isinstance(step, Decision):
                return step
            if step is None:
                return self.pending(final)

    def _advance(self, text: str) -> Decision | bool | None:
        """One step: a Decision, True to go on, None when the text ends too early."""
        stage, i = self._stage, self._pos
        if stage == "name":
            m = _NAME.match(text, i)
            assert m is not None  # the pattern matches the empty string
            if m.end() - i > _MAX_NAME:
                return self.malformed(i)
            if m.end() == len(text):
                return None
            j = skip_ws(text, m.end())
            if j == len(text):
                return None
            if m.end() == i or text[j] != "<" or not self.tools.known(m.group()):
                return self.malformed(i)
            self._name, self._pos, self._stage = m.group(), j, "body"
            return True
        if stage == "body":
            j = skip_ws(text, i)
            for literal, nxt in ((KEY_OPEN, "key"), (CLOSE, "end")):
                found = match_literal(text, j, literal)
                if found:
                    if nxt == "end":
                        return self.accept(j + len(CLOSE), [FoundCall(self._name, self._args)])
                    self._pos, self._stage = j + len(literal), nxt
                    return True
                if found is None:
                    return None
            return self.malformed(j)
        if stage == "key":
            k = text.find("<", i)
            if k < 0:
                return self.malformed(i) if len(text) - i > _MAX_NAME else None
            closed = match_literal(text, k, KEY_CLOSE)
            if closed is None:
                return None
            key = text[i:k].strip()
            if not closed or not key or key in self._args:
                return self.malformed(i)
            self._key, self._pos, self._stage = key, k + len(KEY_CLOSE), "value_open"
            return True
        if stage == "value_open":
            j = skip_ws(text, i)
            found = match_literal(text, j, VALUE_OPEN)
            if not found:
                return None if found is None else self.malformed(j)
            self._pos, self._search, self._stage = j + len(VALUE_OPEN), j + len(VALUE_OPEN), "value"
            return True
        # stage == "value"
        k = text.find(VALUE_CLOSE, self._search)
        if k < 0:
            self._search = max(i, len(text) - len(VALUE_CLOSE) + 1)
            return None
        schema = property_schema(self.tools.parameters(self._name), self._key)
        self._args[self._key] = typed_value(text[i:k], schema, untyped_json=True)
        self._pos, self._stage = k + len(VALUE_CLOSE), "body"
        return True


class GlmToolParser(MarkupToolParser):
    """GLM-4.5 / 4.6 / 4.7 ``<arg_key>``/``<arg_value>`` calls, values typed by the schema."""

    name = "glm45"
    priority: ClassVar[int] = 65
    openers = {OPEN: GlmRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes ``<arg_key>``; without a template, a GLM-4.5/4.6/4.7 name."""
        if chat_template is not None:
            return KEY_OPEN in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

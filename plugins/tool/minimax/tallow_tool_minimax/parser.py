"""The MiniMax M2 tool-call format.

::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    <invoke name="search">
    <parameter name="q">tallow</parameter>
    </invoke>
    </minimax:tool_call>

One block holds one or more invokes, each a call; whitespace between tags is ignored. A value is
the exact text between ``<parameter name="...">`` and the first ``</parameter>``, so it may hold
any other markup. The template writes a string argument as it is and any other one as JSON, so
a value is typed by the parameter's JSON Schema (:func:`tallow.plugin.tool_values.typed_value`)
and read as JSON when the schema names no type. A block is taken whole or not at all: an invoke
of an unknown tool, or a parameter given twice, makes the whole block content.
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

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = '<invoke name="', "</invoke>"
PARAM_OPEN, PARAM_CLOSE = '<parameter name="', "</parameter>"
_ATTRIBUTE = re.compile(r'[^"<>\n]*')
_MAX_NAME = 256
_NAME_HINT = re.compile(r"minimax[-_ ]?m2", re.IGNORECASE)

#: what may follow, after whitespace, at each place between tags, and the stage it leads to
_NEXT = {
    "block": ((INVOKE_OPEN, "invoke"), (CLOSE, "end")),
    "invoke_body": ((PARAM_OPEN, "param"), (INVOKE_CLOSE, "invoke_end")),
}


class MiniMaxRegion(CallRegion):
    """``<minimax:tool_call>`` (``<invoke name="N">`` (``<parameter name="P">`` V
    ``</parameter>``)* ``</invoke>``)+ ``</minimax:tool_call>``.

    Read step by step; ``_pos`` keeps how far the text has been read and ``_search`` where to
    look for the end of a value next, so a long value fed in many pieces is scanned once.
    """

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._pos = len(opener)
        self._stage = "block"
        self._calls: list[FoundCall] = []
        self._name = ""
        self._param = ""
        self._args: dict[str, Any] = {}
        self._search = 0

    def decide(self, text: str, final: bool) -> Decision | None:
        while True:
            step = self._advance(text)
            if isinstance(step, Decision):
                return step
            if step is None:
                return self.pending(final)

    def _attribute(self, text: str) -> str | Decision | None:
        """The quoted name at ``_pos`` (its opening quote already read), then ``">``; None
        while the text ends first."""
        i = self._pos
        m = _ATTRIBUTE.match(text, i)
        assert m is not None  # the pattern matches the empty string
        if m.end() - i > _MAX_NAME:
            return self.malformed(i)
        closed = match_literal(text, m.end(), '">')
        if closed is None:
            return None
        if not closed or m.end() == i:
            return self.malformed(m.end())
        self._pos = m.end() + 2
        return m.group()

    def _advance(self, text: str) -> Decision | bool | None:
        """One step: a Decision, True to go on, None when the text ends too early."""
        stage = self._stage
        if stage in _NEXT:
            j = skip_ws(text, self._pos)
            for literal, nxt in _NEXT[stage]:
                found = match_literal(text, j, literal)
                if found is None:
                    return None
                if found:
                    self._pos, self._stage = j + len(literal), nxt
                    return self._closed(nxt)
            return self.malformed(j)
        if stage in ("invoke", "param"):
            name = self._attribute(text)
            if not isinstance(name, str):
                return name
            if stage == "invoke":
                if not self.tools.known(name):
                    return self.malformed()
                self._name, self._args, self._stage = name, {}, "invoke_body"
            elif name in self._args:
                return self.malformed()
            else:
                self._param, self._search, self._stage = name, self._pos, "value"
            return True
        # stage == "value"
        k = text.find(PARAM_CLOSE, self._search)
        if k < 0:
            self._search = max(self._pos, len(text) - len(PARAM_CLOSE) + 1)
            return None
        schema = property_schema(self.tools.parameters(self._name), self._param)
        self._args[self._param] = typed_value(text[self._pos : k], schema, untyped_json=True)
        self._pos, self._stage = k + len(PARAM_CLOSE), "invoke_body"
        return True

    def _closed(self, stage: str) -> Decision | bool:
        """After a closing tag: the invoke is a call, or the block is over."""
        if stage == "invoke_end":
            self._calls.append(FoundCall(self._name, self._args))
            self._stage = "block"
        elif stage == "end":
            return self.accept(self._pos, self._calls)
        return True


class MiniMaxM2ToolParser(MarkupToolParser):
    """MiniMax M2 ``<minimax:tool_call>`` blocks of ``<invoke>`` calls, values typed by the
    schema."""

    name = "minimax_m2"
    priority: ClassVar[int] = 64
    openers = {OPEN: MiniMaxRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes ``<minimax:tool_call>``; without a template, a MiniMax M2 name."""
        if chat_template is not None:
            return OPEN in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

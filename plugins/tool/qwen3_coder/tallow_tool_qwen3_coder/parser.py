"""The Qwen3-Coder XML tool-call format.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values are typed by the tool's schema (:mod:`.values`). A value runs to the first
``</parameter>``, so it may hold any other text, markup included. A ``<function=...>`` block
without its ``<tool_call>`` wrapper is read as a call too (these models sometimes drop it), and
so is a wrapped one whose ``</tool_call>`` the end of the response cut off.
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

from .values import convert_value

WRAP_OPEN, WRAP_CLOSE = "<tool_call>", "</tool_call>"
FUNC_OPEN, FUNC_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
_NAME_CHAR = re.compile(r"[^>\s<]*")
_MAX_NAME = 256
_NAME_HINT = re.compile(r"qwen3[-_ ]?coder", re.IGNORECASE)


class _Bad(Exception):
    """The markup stops fitting the grammar at ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at


class _More(Exception):
    """The text ends before the grammar can say."""


class Qwen3CoderRegion(CallRegion):
    """``[<tool_call>] <function=NAME> (<parameter=P>value</parameter>)* </function> [</tool_call>]``.

    Parsed step by step; ``self._pos`` remembers how far the text has been read, so a long
    value streamed in many pieces is searched once.
    """

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._pos = len(opener)
        self._stage = "function" if opener == WRAP_OPEN else "name"
        self._name = ""
        self._param = ""
        self._args: dict[str, Any] = {}
        self._search = 0  # where to look for the end of the current value next time

    def decide(self, text: str, final: bool) -> Decision | None:
        try:
            while True:
                done = self._advance(text)
                if done is not None:
                    return done
        except _Bad as bad:
            return self.malformed(bad.at)
        except _More:
            # At the end, a complete function block is a call even if the closing wrapper
            # (or part of it) is missing: nothing else can follow it any more.
            if final and self._stage == "wrap_close":
                return self._accept(len(text))
            if final and self._stage == "after":
                return self._accept(self._pos)
            return self.pending(final)

    def _literal(self, text: str, i: int, literal: str) -> bool:
        found = match_literal(text, i, literal)
        if found is None:
            raise _More
        return found

    def _read_name(self, text: str) -> str:
        m = _NAME_CHAR.match(text, self._pos)
        if m.end() == len(text):
            if m.end() - self._pos > _MAX_NAME:
                raise _Bad(self._pos)
            raise _More
        if text[m.end()] != ">" or m.end() == self._pos:
            raise _Bad(m.end())
        name = m.group()
        self._pos = m.end() + 1
        return name

    def _advance(self, text: str) -> Decision | None:
        stage = self._stage
        if stage == "function":
            i = skip_ws(text, self._pos)
            if not self._literal(text, i, FUNC_OPEN):
                raise _Bad(i)
            self._pos, self._stage = i + len(FUNC_OPEN), "name"
        elif stage == "name":
            at = self._pos
            self._name = self._read_name(text)
            if not self.tools.known(self._name):
                raise _Bad(at)
            self._stage = "body"
        elif stage == "body":
            i = skip_ws(text, self._pos)
            if match_literal(text, i, PARAM_OPEN):
                self._pos, self._stage = i + len(PARAM_OPEN), "param"
            elif self._literal(text, i, FUNC_CLOSE):
                self._pos = i + len(FUNC_CLOSE)
                self._stage = "wrap_close" if self.opener == WRAP_OPEN else "after"
            elif match_literal(text, i, PARAM_OPEN) is None:
                raise _More
            else:
                raise _Bad(i)
        elif stage == "param":
            self._param = self._read_name(text)
            self._stage, self._search = "value", self._pos
        elif stage == "value":
            k = text.find(PARAM_CLOSE, self._search)
            if k < 0:
                self._search = max(self._pos, len(text) - len(PARAM_CLOSE) + 1)
                raise _More
            schema = self.tools.parameters(self._name).get("properties", {})
            prop = schema.get(self._param) if isinstance(schema, dict) else None
            self._args[self._param] = convert_value(text[self._pos : k], prop)
            self._pos, self._stage = k + len(PARAM_CLOSE), "body"
        elif stage == "wrap_close":
            i = skip_ws(text, self._pos)
            if not self._literal(text, i, WRAP_CLOSE):
                raise _Bad(i)
            return self._accept(i + len(WRAP_CLOSE))
        else:  # "after" an unwrapped call: take a stray closing wrapper along
            i = skip_ws(text, self._pos)
            if self._literal(text, i, WRAP_CLOSE):
                return self._accept(i + len(WRAP_CLOSE))
            return self._accept(self._pos)
        return None

    def _accept(self, end: int) -> Decision:
        return self.accept(end, [FoundCall(self._name, self._args)])


class Qwen3CoderToolParser(MarkupToolParser):
    """Qwen3-Coder's XML calls, parameter values typed by the tool's JSON Schema."""

    name = "qwen3_coder"
    priority: ClassVar[int] = 70
    openers = {WRAP_OPEN: Qwen3CoderRegion, FUNC_OPEN: Qwen3CoderRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template shows ``<function=`` and ``<parameter=``; else a Qwen3-Coder name."""
        if chat_template is not None:
            return FUNC_OPEN in chat_template and PARAM_OPEN in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

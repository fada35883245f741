"""The Gemma 4 tool-call format.

::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,metric:true}<tool_call|>

Each call is one ``<|tool_call>`` … ``<tool_call|>`` block (several may follow each other);
inside it ``call:``, the tool's name, and the arguments as an object. Gemma 4's chat template
writes argument values with its ``format_argument`` macro: a string between two ``<|"|>``
tokens (its text exactly, quotes and braces included), ``true``/``false``, a number as written,
an object ``{key:value,...}`` with bare keys, an array ``[value,...]``. These markers are special
tokens, so the parser reads the text with special tokens kept (``reads_special_tokens``).

Read leniently as well: keys between ``<|"|>`` (how the template writes keys in tool
declarations) or in JSON quotes, JSON strings as values, ``null`` (and ``None``, which is how the
template's Jinja writes a null), whitespace between the parts. A key given twice, a value of no
such form, an unknown tool or a block never closed makes the markup content. The end-of-turn
markers that can follow a reply (``<turn|>``, ``<eos>``, ``<|tool_response>``) are dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    MarkupToolParser,
    match_literal,
)

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CALL = "call:"
#: what ends a model turn or a call turn: special tokens that are never content
END_MARKERS = ("<turn|>", "<eos>", "<|tool_response>")
_NAME = re.compile(r"[^\s{}<>]*")
_MAX_NAME = 256
_BARE_KEY = re.compile(r"[^\s:,{}\[\]<>\"]+")
_ATOM = re.compile(r"[A-Za-z0-9_.+\-]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_WS = re.compile(r"\s*")
_NAME_HINT = re.compile(r"gemma[-_ ]?4", re.IGNORECASE)
_JSON = json.JSONDecoder()
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None, "None": None}


class _Incomplete(Exception):
    """The text ends before the value does."""


class _Malformed(Exception):
    """The text is not a value of the format."""


class _ValueReader:
    """Reads one value of the format from ``text`` at a position (recursive descent)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def skip(self, i: int) -> int:
        m = _WS.match(self.text, i)
        assert m is not None  # the pattern matches the empty string
        if m.end() == len(self.text):
            raise _Incomplete
        return m.end()

    def value(self, i: int) -> tuple[Any, int]:
        """The value starting at ``i`` (after whitespace) and the index just past it."""
        text, i = self.text, self.skip(i)
        c = text[i]
        if c == "{":
            return self.obj(i + 1)
        if c == "[":
            return self.array(i + 1)
        if c == '"':
            return self.json_string(i)
        if match_literal(text, i, QUOTE) is not False:
            return self.quoted(i)
        m = _ATOM.match(text, i)
        if m is None:
            raise _Malformed
        if m.end() == len(text):
            raise _Incomplete  # the number or word may go on
        word = m.group()
        if word in _CONSTANTS:
            return _CONSTANTS[word], m.end()
        number = _NUMBER.fullmatch(word)
        if number is None:
            raise _Malformed
        if number.group(1) or number.group(2):
            return float(word), m.end()
        return int(word), m.end()

    def quoted(self, i: int) -> tuple[str, int]:
        if len(self.text) - i < len(QUOTE):
            raise _Incomplete
        k = self.text.find(QUOTE, i + len(QUOTE))
        if k < 0:
            raise _Incomplete
        return self.text[i + len(QUOTE) : k], k + len(QUOTE)

    def json_string(self, i: int) -> tuple[str, int]:
        try:
            value, end = _JSON.raw_decode(self.text, i)
        except ValueError:
            # unterminated (more may come) or a bad escape: decided once the text is whole
            raise _Incomplete from None
        assert isinstance(value, str)  # the text at i opens a JSON string
        return value, end

    def key(self, i: int) -> tuple[str, int]:
        text = self.text
        if text[i] == '"':
            return self.json_string(i)
        if match_literal(text, i, QUOTE) is not False:
            return self.quoted(i)
        m = _BARE_KEY.match(text, i)
        if m is None:
            raise _Malformed
        if m.end() == len(text):
            raise _Incomplete
        return m.group(), m.end()

    def obj(self, i: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        i = self.skip(i)
        if self.text[i] == "}":
            return out, i + 1
        while True:
            key, i = self.key(i)
            if key in out:
                raise _Malformed
            i = self.skip(i)
            if self.text[i] != ":":
                raise _Malformed
            out[key], i = self.value(i + 1)
            i = self.skip(i)
            if self.text[i] == "}":
                return out, i + 1
            if self.text[i] != ",":
                raise _Malformed
            i = self.skip(i + 1)

    def array(self, i: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        i = self.skip(i)
        if self.text[i] == "]":
            return out, i + 1
        while True:
            item, i = self.value(i)
            out.append(item)
            i = self.skip(i)
            if self.text[i] == "]":
                return out, i + 1
            if self.text[i] != ",":
                raise _Malformed
            i = self.skip(i + 1)


class Gemma4Region(CallRegion):
    """``<|tool_call>call:NAME{...}<tool_call|>``.

    The arguments can only end just before a ``<tool_call|>``; the region looks for each one
    once (``_search``) and reads the arguments up to it: a string that holds ``<tool_call|>``
    leaves the object unfinished there, and the next one is tried.
    """

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._search = 0

    def decide(self, text: str, final: bool) -> Decision | None:
        i = len(self.opener)
        head = match_literal(text, i, CALL)
        if not head:
            return self.pending(final) if head is None else self.malformed(i)
        start = i + len(CALL)
        m = _NAME.match(text, start)
        assert m is not None  # the pattern matches the empty string
        if m.end() - start > _MAX_NAME:
            return self.malformed(start)
        if m.end() == len(text):
            return self.pending(final)
        name, body = m.group(), m.end()
        if not name or text[body] != "{" or not self.tools.known(name):
            return self.malformed(start)
        self._search = max(self._search, body)
        while True:
            k = text.find(CLOSE, self._search)
            if k < 0:
                self._search = max(self._search, len(text) - len(CLOSE) + 1)
                return self.pending(final)
            self._search = k + 1
            reader = _ValueReader(text[:k])
            try:
                args, end = reader.obj(body + 1)
            except _Incomplete:
                continue  # the close marker sits inside a value: try the next one
            except _Malformed:
                return self.malformed(start)
            if text[end:k].strip():
                return self.malformed(start)
            return self.accept(k + len(CLOSE), [FoundCall(name, args)])


class _EndMarker(CallRegion):
    """An end-of-turn marker: consumed, neither call nor content."""

    def decide(self, text: str, final: bool) -> Decision | None:
        return Decision(len(self.opener), [])


class Gemma4ToolParser(MarkupToolParser):
    """Gemma 4 ``<|tool_call>call:NAME{...}<tool_call|>`` calls."""

    name = "gemma4"
    priority: ClassVar[int] = 66
    reads_special_tokens: ClassVar[bool] = True
    openers: ClassVar[dict[str, type[CallRegion]]] = {
        OPEN: Gemma4Region,
        **{marker: _EndMarker for marker in END_MARKERS},
    }

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes ``<|tool_call>call:``; without a template, a Gemma 4 name."""
        if chat_template is not None:
            return OPEN + CALL in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

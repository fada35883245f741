"""JSON text in model output: strict decoding, the canonical arguments text, and scanning.

Tool-call formats read JSON that a model writes and that may still be arriving:
:func:`loads_strict` decodes it as JSON defines it, :func:`compact_json` writes arguments the
one way every parser emits them, and :class:`JsonSpan`, :func:`skip_ws`,
:func:`match_literal` and :func:`bracket_opens` find where a value or a literal ends in a text
that grows, without scanning it again from the start. Re-exported by
:mod:`tallow.plugin.tool_parsing`, where formats import them from.
"""

from __future__ import annotations

import json
import re
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity (Python accepts them; JSON does not)."""
    return json.loads(text, parse_constant=_no_constant)


def compact_json(value: object) -> str:
    """The canonical arguments text: compact separators, non-ASCII kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_WS = re.compile(r"[ \t\r\n]*")
_JSON_STRUCT = re.compile(r'["{}\[\]]')
_STRING_STOP = re.compile(r'["\\]')


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i`` (JSON whitespace)."""
    match = _WS.match(text, i)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def bracket_opens(text: str, i: int, allowed: str) -> bool | None:
    """Whether the bracket at ``i`` is followed, after whitespace, by one of ``allowed``; None
    while the text ends first. A cheap early sign that bracketed prose is no call, so that it
    is not held back until the end of the response."""
    j = skip_ws(text, i + 1)
    return None if j == len(text) else text[j] in allowed


def match_literal(text: str, i: int, literal: str) -> bool | None:
    """True if ``literal`` starts at ``i``; None if the text ends inside it; else False."""
    rest = text[i : i + len(literal)]
    if rest == literal:
        return True
    return None if literal.startswith(rest) else False


class JsonSpan:
    """Finds where a JSON object or array that starts at ``start`` ends, in a growing text.

    Only brackets outside strings are counted (``json.loads`` judges the rest), and scanning
    resumes where it stopped, so feeding a long call piece by piece costs linear time.
    """

    def __init__(self, start: int) -> None:
        self.start = start
        self.end: int | None = None
        self._pos = start
        self._depth = 0
        self._in_string = False

    def scan(self, text: str) -> int | None:
        """The index just past the value, or None while it is still open."""
        if self.end is not None:
            return self.end
        i, n = self._pos, len(text)
        while i < n:
            if self._in_string:
                m = _STRING_STOP.search(text, i)
                if m is None:
                    i = n
                elif m.group() == "\\":
                    if m.end() >= n:  # the escaped character has not arrived yet
                        i = m.start()
                        break
                    i = m.end() + 1
                else:
                    self._in_string, i = False, m.end()
                continue
            m = _JSON_STRUCT.search(text, i)
            if m is None:
                i = n
                break
            c, i = m.group(), m.end()
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    self.end = i
                    return i
        self._pos = i
        return None

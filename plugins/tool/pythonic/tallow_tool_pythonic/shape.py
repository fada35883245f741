"""Where a Python list of calls ends, and whether a growing text can still be one.

:class:`CallListShape` reads ``[name(key=value, ...), ...]`` one character at a time, resuming
where it stopped when more text arrives. It checks only the shape outside the argument values
(the list, call names, parentheses, ``key=``), and follows brackets and string literals inside
the values to find where each ends; :mod:`.parser` judges the values with :mod:`ast` once the
list is closed. So text that cannot be a call list (``[1] see below``, ``[Note]``,
``[f(1)]``) is refused as soon as the first character that breaks the shape arrives.
"""

from __future__ import annotations

_OPENING = {"(": ")", "[": "]", "{": "}"}
_CLOSING = set(_OPENING.values())
_QUOTES = "'\""
_SPACE = " \t\r\n"


def _starts_name(c: str) -> bool:
    return c.isidentifier()


def _continues_name(c: str) -> bool:
    return ("a" + c).isidentifier()


class CallListShape:
    """Incremental shape check of a call list starting at ``start`` (a ``[``).

    ``scan(text)`` returns the index just past the closing ``]``, ``None`` while the text ends
    first, or ``-1`` once the text cannot be a call list (:attr:`bad_at` says where).
    """

    def __init__(self, start: int) -> None:
        self.start = start
        self.bad_at = start
        self._pos = start + 1
        self._state = "item"  # what the next non-space character must begin
        self._nest: list[str] = []  # closers expected inside a value
        self._quote = ""  # the open string's delimiter (one or three quote characters)
        self._value_empty = True

    def scan(self, text: str) -> int | None:
        i, n = self._pos, len(text)
        while i < n:
            step = self._step(text, i)
            if step is None:  # the next character(s) are needed to decide
                break
            if step < 0:
                self.bad_at = i
                return -1
            if self._state == "closed":
                self._pos = step
                return step
            i = step
        self._pos = i
        return None

    def _step(self, text: str, i: int) -> int | None:
        """Read at ``i``; the index to go on from, -1 when the shape is broken, None to wait."""
        c, state = text[i], self._state
        if state == "value":
            return self._value(text, i)
        if state in ("name", "key"):
            if _continues_name(c):
                return i + 1
            self._state = "call_open" if state == "name" else "equals"
        if c in _SPACE:
            return i + 1
        state = self._state
        if state == "item":  # after "[" or "," in the list: a call, or the end
            if c == "]":
                self._state = "closed"
                return i + 1
            if _starts_name(c):
                self._state = "name"
                return i + 1
        elif state == "call_open" and c == "(":
            self._state = "argument"
            return i + 1
        elif state == "argument":  # after "(" or "," in a call: a keyword, or the end
            if c == ")":
                self._state = "after_call"
                return i + 1
            if _starts_name(c):
                self._state = "key"
                return i + 1
        elif state == "equals" and c == "=":
            if i + 1 == len(text):
                return None
            if text[i + 1] == "=":
                return -1
            self._state, self._value_empty = "value", True
            return i + 1
        elif state == "after_call":
            if c == ",":
                self._state = "item"
                return i + 1
            if c == "]":
                self._state = "closed"
                return i + 1
        return -1

    def _value(self, text: str, i: int) -> int | None:
        """One step inside a keyword value: strings and brackets are followed; at the call's
        level a ``,`` or ``)`` ends the value."""
        c = text[i]
        if self._quote:
            if c == "\\":
                return None if i + 1 == len(text) else i + 2
            q = self._quote
            if text.startswith(q, i):
                self._quote = ""
                return i + len(q)
            if len(q) == 3 and q.startswith(text[i:]):
                return None
            return i + 1
        if c in _QUOTES:
            if len(text) - i < 3:
                return None  # a triple quote or not: wait for the next characters
            self._quote = c * 3 if text.startswith(c * 3, i) else c
            self._value_empty = False
            return i + len(self._quote)
        if c == "#":  # a comment could hide brackets and quotes: never a call
            return -1
        if c in _OPENING:
            self._nest.append(_OPENING[c])
            self._value_empty = False
        elif c in _CLOSING:
            if self._nest:
                if self._nest.pop() != c:
                    return -1
            elif c == ")" and not self._value_empty:
                self._state = "after_call"
            else:
                return -1
        elif c == "," and not self._nest:
            if self._value_empty:
                return -1
            self._state = "argument"
        elif c not in _SPACE:
            self._value_empty = False
        return i + 1

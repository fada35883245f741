"""Python-style tool calls, as Llama 4 writes them.

::

    [get_weather(city="San Francisco", days=3), get_time()]
    <|python_start|>[search(q='tallow', filters={"lang": ["en"]}, exact=True)]<|python_end|>

The call list must be the whole reply: it starts it (after whitespace or a ``<think>`` block),
optionally after ``<|python_start|>``, and nothing but whitespace (and the ``<|python_end|>``
closing a ``<|python_start|>``) follows it. Every call is a plain name with keyword arguments
only, each a Python literal (strings, numbers, ``True``/``False``/``None``, lists, tuples and
dicts of them) read with :func:`ast.literal_eval` — nothing is evaluated. Anything else
(positional arguments, ``*args``, names or expressions as values, sets, bytes, a non-finite
number, an unknown tool) makes the reply content, exactly. While the reply could still be a call
list it is held back; once a character rules that out it is released as content
(:mod:`.shape`).
"""

from __future__ import annotations

import ast
import math
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

from .shape import CallListShape

LIST_OPEN = "["
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
HEADER_START = "<|header_start|>"
_NAME_HINT = re.compile(r"llama[-_ ]?4", re.IGNORECASE)


def json_value(value: Any) -> Any:
    """A Python literal as the JSON value it stands for (tuples become arrays); ValueError for
    what JSON cannot hold (sets, bytes, complex numbers, non-finite floats, non-string keys)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("object keys must be strings")
        return {k: json_value(v) for k, v in value.items()}
    raise ValueError(f"a {type(value).__name__} is not a JSON value")


def read_calls(source: str) -> list[FoundCall] | None:
    """The calls of a call-list ``source`` (``[f(a=1), g()]``); None when it is not one."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        args: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg in args:  # **kwargs, or a repeated key
                return None
            try:
                args[keyword.arg] = json_value(ast.literal_eval(keyword.value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        calls.append(FoundCall(node.func.id, args))
    return calls


class PythonicRegion(CallRegion):
    """``[<|python_start|>] ws [call, ...] ws [<|python_end|>] ws`` up to the end of the reply."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        # The anchored opener "[" is the first character of the list itself.
        self._shape: CallListShape | None = None if opener == PYTHON_START else CallListShape(0)
        self._end: int | None = None
        self._calls: list[FoundCall] | None = None

    def decide(self, text: str, final: bool) -> Decision | None:
        if self._shape is None:
            i = skip_ws(text, len(self.opener))
            if i == len(text):
                return self.pending(final)
            if text[i] != LIST_OPEN:
                return self.malformed(i)
            self._shape = CallListShape(i)
        if self._end is None:
            end = self._shape.scan(text)
            if end is None:
                return self.pending(final)
            if end < 0:
                return self.malformed(self._shape.bad_at)
            self._calls = read_calls(text[self._shape.start : end])
            if self._calls is None or not all(self.tools.known(c.name) for c in self._calls):
                return self.malformed(end)
            self._end = end
        j = skip_ws(text, self._end)
        if self.opener == PYTHON_START:
            closed = match_literal(text, j, PYTHON_END)
            if closed is None:
                return self.pending(final)
            if closed:
                j = skip_ws(text, j + len(PYTHON_END))
        if j < len(text):
            return self.malformed(j)  # text after the list: the reply is not a call list
        if not final:
            return None  # more text may follow
        assert self._calls is not None
        return self.accept(len(text), self._calls)


class PythonicToolParser(MarkupToolParser):
    """A reply that is a Python list of calls with literal keyword arguments (Llama 4)."""

    name = "pythonic"
    priority: ClassVar[int] = 45
    anchored_openers = {PYTHON_START: PythonicRegion, LIST_OPEN: PythonicRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template is a Llama 4 one (``<|header_start|>`` headers, ``<|python_start|>``);
        without a template, a Llama 4 name."""
        if chat_template is not None:
            return PYTHON_START in chat_template or HEADER_START in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

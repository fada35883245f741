"""Mistral's tool-call formats, both introduced by ``[TOOL_CALLS]``.

::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}

A single object instead of the list is accepted. With ``[CALL_ID]`` the model's id becomes the
call's id (Mistral templates check the ids of earlier calls). The ``[TOOL_CALLS]`` markers are
special tokens: the detokenizer must keep them in the text for this parser to see them.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    JsonSpan,
    MarkupToolParser,
    bracket_opens,
    call_from_json,
    loads_strict,
    match_literal,
    skip_ws,
)

OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID = re.compile(r"[A-Za-z0-9_\-]*")
_NAME_HINT = re.compile(r"mistral|mixtral|ministral|magistral|devstral|codestral", re.I)


class MistralRegion(CallRegion):
    """One ``[TOOL_CALLS]`` group: a JSON list (or object) of calls, or ``name[ARGS]{...}``."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self._span: JsonSpan | None = None
        self._name: str | None = None  # set for the name[ARGS] form
        self._call_id: str | None = None

    def decide(self, text: str, final: bool) -> Decision | None:
        if self._span is None:
            i = skip_ws(text, len(self.opener))
            if i == len(text):
                return self.pending(final)
            if text[i] not in "[{":
                return self._header(text, i, final)
            opens = bracket_opens(text, i, "{]" if text[i] == "[" else '"}')
            if opens is None:
                return self.pending(final)
            if not opens:
                return self.malformed(i)
            self._span = JsonSpan(i)
        end = self._span.scan(text)
        if end is None:
            return self.pending(final)
        try:
            value = loads_strict(text[self._span.start : end])
        except ValueError:
            return self.malformed()
        if self._name is not None:
            if not isinstance(value, dict):
                return self.malformed()
            return self.accept(end, [FoundCall(self._name, value, self._call_id)])
        items = value if isinstance(value, list) else [value]
        calls = [call_from_json(item) for item in items]
        return self.accept(end, calls if all(calls) else [])  # type: ignore[arg-type]

    def _header(self, text: str, i: int, final: bool) -> Decision | None:
        """``name`` [``[CALL_ID]id``] ``[ARGS]``, then where the arguments object starts."""
        name = _NAME.match(text, i)
        j = name.end()
        if j == len(text):
            return self.pending(final)
        if j == i:
            return self.malformed(i)
        call_id = None
        if match_literal(text, j, CALL_ID):
            found = _ID.match(text, j + len(CALL_ID))
            call_id, j = found.group(), found.end()
            if j == len(text):
                return self.pending(final)
            if not call_id:
                return self.malformed(j)
        elif match_literal(text, j, CALL_ID) is None:
            return self.pending(final)
        has_args = match_literal(text, j, ARGS)
        if has_args is None:
            return self.pending(final)
        if not has_args:
            return self.malformed(j)
        k = skip_ws(text, j + len(ARGS))
        if k == len(text):
            return self.pending(final)
        opens = text[k] == "{" and bracket_opens(text, k, '"}')
        if opens is None:
            return self.pending(final)
        if not opens:
            return self.malformed(k)
        self._name, self._call_id, self._span = name.group(), call_id, JsonSpan(k)
        return self.decide(text, final)


class MistralToolParser(MarkupToolParser):
    """``[TOOL_CALLS]`` calls in either Mistral format."""

    name = "mistral"
    priority: ClassVar[int] = 50
    call_opening: ClassVar[str] = OPEN
    openers = {OPEN: MistralRegion}

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes ``[TOOL_CALLS]``; without a template, a Mistral-family name."""
        if chat_template is not None:
            return OPEN in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

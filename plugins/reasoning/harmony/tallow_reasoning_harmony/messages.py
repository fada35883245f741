"""Reading harmony output incrementally: the messages, their headers and bodies.

A harmony message is ``<|start|>{header}<|message|>{body}`` ended by ``<|end|>``, ``<|return|>``
or ``<|call|>``. The header names the role, then optionally ``<|channel|>`` and the channel, a
recipient ``to=NAME`` (in the role part or the channel part) and a content type (after
``<|constrain|>``, or a bare word after the channel such as ``json``)::

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>

The prompt ends with ``<|start|>assistant``, so a response begins inside the first header:
usually with ``<|channel|>``, possibly with the role part's recipient (`` to=functions.x``).
:class:`HarmonyReader` turns text, fed in pieces split anywhere, into :data:`Event` s whose raw
texts concatenate to the text exactly:

- :class:`Text`: text outside any message (a response without harmony markup is all Text);
- :class:`Open`: a complete header (its markup as written, and in the canonical form that starts
  with ``<|start|>`` and the role);
- :class:`Body`: body text of the open message;
- :class:`Close`: the end of the open message (its stop token as written, or empty when the
  message ended otherwise: a new header began, or the response ended);
- :class:`Markup`: special tokens that carry no text: a stray stop token, a header that never
  reached ``<|message|>``, whitespace between a message's end and the next ``<|start|>``.

Special tokens are matched as text: the server detokenizes with special tokens kept while a
parser that reads them is active (``reads_special_tokens``). A suffix that could be the start of
one is held back until the next piece decides it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
SPECIAL = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
STOPS = (END, RETURN, CALL)
#: tokens that open a header where no ``<|start|>`` came (the prompt wrote it)
_IMPLICIT_OPENERS = (CHANNEL, CONSTRAIN, MESSAGE)
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in SPECIAL))
_LONGEST = max(map(len, SPECIAL))
FUNCTIONS = "functions."

# Text before a header token that is the role part of a header the prompt opened: whitespace
# and at most a recipient. _LEAD_PARTIAL: text that could still become one.
_WS = r"[ \t\r\n]*"
_LEAD = re.compile(_WS + r"(?:to=[^\s<]+" + _WS + r")?")
_LEAD_PARTIAL = re.compile(_WS + r"(?:t|to|to=[^\s<]*|to=[^\s<]+[ \t\r\n]+)?")


@dataclass(frozen=True)
class Header:
    """What a message header says: its role, channel, recipient and content type."""

    role: str
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None

    @property
    def function(self) -> str | None:
        """The function a ``to=functions.NAME`` recipient calls; None for any other."""
        r = self.recipient
        return r[len(FUNCTIONS) :] if r and r.startswith(FUNCTIONS) and r != FUNCTIONS else None


def parse_header(raw: str) -> Header:
    """The :class:`Header` of ``raw``, a header's markup up to ``<|message|>`` (with or without
    the leading ``<|start|>`` and role: a header the prompt opened is the assistant's)."""
    text = raw[len(START) :] if raw.startswith(START) else raw
    implicit = not raw.startswith(START)
    parts = _SPECIAL_RE.split(text)
    tokens = _SPECIAL_RE.findall(text)
    role: str | None = "assistant" if implicit else None
    channel = recipient = content_type = None
    extra: list[str] = []
    for k, part in enumerate(parts):
        opener = tokens[k - 1] if k else None
        for word in part.split():
            if word.startswith("to="):
                recipient = recipient or word[3:]
            elif opener is None and role is None:
                role = word
            elif opener == CHANNEL and channel is None:
                channel = word
            elif opener == CONSTRAIN and content_type is None:
                content_type = word
            elif opener == CHANNEL:
                extra.append(word)
    if content_type is None and extra:
        content_type = extra[0]  # "<|channel|>commentary json": the type without <|constrain|>
    return Header(role or "assistant", channel, recipient, content_type)


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Open:
    header: Header
    raw: str
    markup: str


@dataclass(frozen=True)
class Body:
    text: str


@dataclass(frozen=True)
class Close:
    token: str


@dataclass(frozen=True)
class Markup:
    text: str


Event = Union[Text, Open, Body, Close, Markup]

_LEAD_STATE, _TEXT, _HEADER, _BODY = range(4)


def _held(buf: str) -> int:
    """Where a suffix of ``buf`` that could begin a special token starts (``len(buf)`` if
    none)."""
    k = buf.rfind("<", max(0, len(buf) - _LONGEST + 1))
    while k != -1:
        tail = buf[k:]
        if any(t.startswith(tail) for t in SPECIAL):
            return k
        k = buf.rfind("<", max(0, len(buf) - _LONGEST + 1), k)
    return len(buf)


class HarmonyReader:
    """Incremental reader of one response: ``feed`` pieces of text, then ``finish`` once;
    each returns the :data:`Event` s the text so far decides (see the module docstring)."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = _LEAD_STATE
        self._lead = ""  # text that may be the role part of a header the prompt opened
        self._header = ""  # the header's markup so far
        self._implicit = False  # the header has no <|start|> of its own
        self._events: list[Event] = []
        self._finished = False

    def feed(self, text: str) -> list[Event]:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        if self._finished:
            raise RuntimeError("feed() after finish(): a reader reads one response")
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        if self._finished:
            raise RuntimeError("finish() was already called")
        self._finished = True
        events = self._run(final=True)
        if self._state == _LEAD_STATE and self._lead:
            events.append(Text(self._lead))
        elif self._state == _HEADER:
            events.append(Markup(self._header))  # cut off before its body: no text
        elif self._state == _BODY:
            events.append(Close(""))
        self._lead = self._header = ""
        return events

    # -- scanning ---------------------------------------------------------------------------
    def _run(self, final: bool) -> list[Event]:
        self._events = []
        buf = self._buf
        while buf:
            m = _SPECIAL_RE.search(buf)
            if m is None:
                cut = len(buf) if final else _held(buf)
                self._text(buf[:cut])
                buf = buf[cut:]
                break
            self._text(buf[: m.start()])
            self._token(m.group())
            buf = buf[m.end() :]
        self._buf = buf
        return self._events

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._state == _LEAD_STATE:
            self._lead += text
            if not _LEAD_PARTIAL.fullmatch(self._lead):
                self._events.append(Text(self._lead))
                self._lead, self._state = "", _TEXT
        elif self._state == _TEXT:
            self._events.append(Text(text))
        elif self._state == _HEADER:
            self._header += text
        else:
            self._events.append(Body(text))

    def _token(self, token: str) -> None:
        state = self._state
        if state == _LEAD_STATE:
            lead, self._lead = self._lead, ""
            if token in _IMPLICIT_OPENERS and _LEAD.fullmatch(lead):
                self._begin(lead + token, implicit=True)
                return
            if token == START and not lead.strip():
                if lead:
                    self._events.append(Markup(lead))
                self._begin(token, implicit=False)
                return
            if lead:
                self._events.append(Text(lead))
            self._state = state = _TEXT
        if state == _TEXT:
            if token == START:
                self._begin(token, implicit=False)
            elif token in _IMPLICIT_OPENERS:
                self._begin(token, implicit=True)
            else:
                self._events.append(Markup(token))
                self._state = _LEAD_STATE
        elif state == _HEADER:
            if token == START:
                self._events.append(Markup(self._header))  # abandoned: a new message began
                self._begin(token, implicit=False)
            elif token in STOPS:
                self._events.append(Markup(self._header + token))
                self._header, self._state = "", _LEAD_STATE
            else:
                self._header += token
                if token == MESSAGE:
                    self._open()
        else:  # inside a body
            if token in STOPS:
                self._events.append(Close(token))
                self._state = _LEAD_STATE
            else:
                # a header token cannot be body text: the message ended without its stop token
                self._events.append(Close(""))
                self._begin(token, implicit=token != START)

    def _begin(self, markup: str, implicit: bool) -> None:
        self._header, self._implicit, self._state = markup, implicit, _HEADER
        if markup.endswith(MESSAGE):
            self._open()

    def _open(self) -> None:
        raw = self._header
        markup = START + "assistant" + raw if self._implicit else raw
        self._events.append(Open(parse_header(raw), raw, markup))
        self._header, self._state = "", _BODY

"""Reasoning parsing: the contract (model text → ``reasoning`` and ``content``) and the
machinery shared by parsers that delimit reasoning with tags.

The contract is :class:`ReasoningParser`: ``parse(text)`` splits a whole response into its
reasoning and its content; ``stream()`` returns a fresh :class:`ReasoningStream` whose deltas,
concatenated, equal ``parse``'s result for any split of the text into chunks (a tag split across
chunks included). The server uses the one ``server.reasoning_parser`` names, or else, by
default, the highest-priority parser whose ``matches(model_name, chat_template)`` is true, the
rule tool parsers follow (``none`` turns reasoning parsing off).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from .components import Component


class ReasoningSplit(NamedTuple):
    """Reasoning text and content text: of a whole response, or what one chunk adds."""

    reasoning: str
    content: str


class ReasoningStream:
    """Incremental splitter for one response. ``feed`` each text delta, then ``finish`` once."""

    def feed(self, text: str) -> ReasoningSplit:
        raise NotImplementedError

    def finish(self) -> ReasoningSplit:
        raise NotImplementedError


class ReasoningParser(Component):
    """Separates a model's reasoning from its answer.

    ``parse(text)`` returns ``ReasoningSplit(reasoning, content)`` for a whole response;
    ``stream()`` returns a fresh :class:`ReasoningStream`. Contract: for every split of a text
    into chunks, the reasoning parts of the stream's deltas (``finish`` included) concatenate to
    ``parse(text).reasoning`` and the content parts to ``parse(text).content``; the delimiting
    markup appears in neither. A response without reasoning markup is all content.

    ``matches`` decides automatic selection from the model name and chat template (the highest
    ``priority`` parser that matches is used, as for tool parsers); ``reads_special_tokens``
    says that the parser's markup consists of the tokenizer's special tokens, so the server
    keeps them in the text it gives the parser (it skips them otherwise).
    """

    priority: ClassVar[int] = 0
    reads_special_tokens: ClassVar[bool] = False

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        return False

    def parse(self, text: str) -> ReasoningSplit:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return ReasoningSplit(first.reasoning + last.reasoning, first.content + last.content)

    def stream(self) -> ReasoningStream:
        raise NotImplementedError


def _held(text: str, marker: str) -> int:
    """Where a suffix of ``text`` that could begin ``marker`` starts (``len(text)`` if none)."""
    for p in range(max(0, len(text) - len(marker) + 1), len(text)):
        if marker.startswith(text[p:]):
            return p
    return len(text)


class TagReasoningStream(ReasoningStream):
    """Streaming half of :class:`TagReasoningParser`: the states are *before* (only whitespace
    or part of a tag seen), *inside* the reasoning, and *after* it (all content)."""

    _BEFORE, _INSIDE, _AFTER = range(3)

    def __init__(self, start: str, end: str, starts_inside: bool) -> None:
        self._start, self._end = start, end
        self._starts_inside = starts_inside
        self._state = self._BEFORE
        self._buf = ""
        self._finished = False

    def feed(self, text: str) -> ReasoningSplit:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        if self._finished:
            raise RuntimeError("feed() after finish(): a stream reads one response")
        self._buf += text
        return self._run(final=False)

    def finish(self) -> ReasoningSplit:
        if self._finished:
            raise RuntimeError("finish() was already called")
        self._finished = True
        return self._run(final=True)

    def _run(self, final: bool) -> ReasoningSplit:
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            buf = self._buf
            if self._state == self._AFTER:
                content.append(buf)
                self._buf = ""
            elif self._state == self._BEFORE:
                rest = buf.lstrip()
                if rest.startswith(self._start):
                    self._state, self._buf = self._INSIDE, rest[len(self._start) :]
                    continue
                if not final and (
                    not rest or self._start.startswith(rest) or self._end.startswith(rest)
                ):
                    break
                # no opening tag: inside the block when the template opened it in the prompt,
                # or when the closing tag comes first; otherwise there is no reasoning
                inside = self._starts_inside or rest.startswith(self._end)
                self._state = self._INSIDE if inside else self._AFTER
            else:
                k = buf.find(self._end)
                if k >= 0:
                    reasoning.append(buf[:k])
                    self._state, self._buf = self._AFTER, buf[k + len(self._end) :]
                    continue
                p = len(buf) if final else _held(buf, self._end)
                reasoning.append(buf[:p])
                self._buf = buf[p:]
                break
        return ReasoningSplit("".join(reasoning), "".join(content))


class TagReasoningParser(ReasoningParser):
    """Reasoning between ``start_tag`` and ``end_tag`` at the start of the response.

    The opening tag counts only as the first non-whitespace of the response; a closing tag as
    the first non-whitespace ends an empty block. Everything after an opening tag never closed
    is reasoning. With ``starts_inside`` (templates that open the block in the prompt, as the
    DeepSeek-R1 distills' do) a response without the opening tag begins inside the block: the
    text before the first closing tag is reasoning, all of it when none comes. Otherwise a
    response that does not begin with a tag is all content. Content after the closing tag is
    kept exactly; reasoning is the text between the tags, exactly.
    """

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    starts_inside: ClassVar[bool] = False

    def stream(self) -> TagReasoningStream:
        return TagReasoningStream(self.start_tag, self.end_tag, self.starts_inside)

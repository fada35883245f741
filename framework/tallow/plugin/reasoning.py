"""Reasoning parsing: the contract (model text → ``reasoning`` and ``content``) and the
machinery shared by parsers that delimit reasoning with tags.

The contract is :class:`ReasoningParser`: ``parse(text)`` splits a whole response into its
reasoning and its content; ``stream()`` returns a fresh :class:`ReasoningStream` whose deltas,
concatenated, equal ``parse``'s result for any split of the text into chunks (a tag split across
chunks included). The server uses the one ``server.reasoning_parser`` names, or else, by
default, the highest-priority parser whose ``matches(model_name, chat_template)`` is true, the
rule tool parsers follow (``none`` turns reasoning parsing off).

A response continues its prompt, and some chat templates open the reasoning block in the
prompt only sometimes (GLM-4.7 opens ``<think>`` when thinking is on and writes a closed
``</think>`` when a request turns it off). The server therefore gives each parser the rendered
prompt first: ``for_prompt(prompt)`` returns the parser that reads the response to it.
"""

from __future__ import annotations

import copy
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

    ``for_prompt(prompt)`` returns the parser that reads the response to the rendered chat
    ``prompt`` (generation prompt included); the default is the parser itself, for parsers
    whose reading does not depend on the prompt. The server calls it once per response, before
    ``parse`` or ``stream``; a parser that never had it called reads as it always did.

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

    def for_prompt(self, prompt: str) -> ReasoningParser:
        """The parser for the response to ``prompt``: this one, unless a subclass reads where
        the prompt left off (:meth:`TagReasoningParser.for_prompt`). Never changes ``self``."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt: expected a str, got {type(prompt).__name__}")
        return self

    def parse(self, text: str) -> ReasoningSplit:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return ReasoningSplit(first.reasoning + last.reasoning, first.content + last.content)

    def stream(self) -> ReasoningStream:
        raise NotImplementedError


def prompt_leaves_block_open(prompt: str, start: str, end: str) -> bool | None:
    """Whether ``prompt`` ends inside a reasoning block delimited by ``start`` and ``end``:
    True when its last non-whitespace is the opening tag (the template opened the block for
    the model), False when it is the closing tag (the template closed it: thinking is off), and
    None when it ends in neither, so the prompt does not say."""
    tail = prompt.rstrip()
    if tail.endswith(start):
        return True
    if tail.endswith(end):
        return False
    return None


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

    The prompt overrides ``starts_inside`` when it says where the response begins
    (:func:`prompt_leaves_block_open`): a prompt ending in the opening tag starts the response
    inside the block, one ending in the closing tag (a template that turned thinking off) starts
    it in the content; a leading block the model writes anyway is still read as reasoning.
    """

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    starts_inside: ClassVar[bool] = False
    #: where the prompt left the response (see :meth:`for_prompt`); None: ``starts_inside``
    _prompt_inside: bool | None = None

    @property
    def begins_inside(self) -> bool:
        """Whether the response begins inside the block: as the prompt left it when
        :meth:`for_prompt` learnt that, else ``starts_inside``."""
        return self.starts_inside if self._prompt_inside is None else self._prompt_inside

    def for_prompt(self, prompt: str) -> TagReasoningParser:
        """A copy that begins where ``prompt`` leaves the block; itself when the prompt ends in
        neither tag."""
        super().for_prompt(prompt)
        inside = prompt_leaves_block_open(prompt, self.start_tag, self.end_tag)
        if inside is None:
            return self
        parser = copy.copy(self)
        parser._prompt_inside = inside
        return parser

    def stream(self) -> TagReasoningStream:
        return TagReasoningStream(self.start_tag, self.end_tag, self.begins_inside)

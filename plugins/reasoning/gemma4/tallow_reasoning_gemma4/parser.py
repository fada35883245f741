"""Gemma 4's thinking: ``<|channel>thought\\n`` … ``<channel|>`` before the answer.

With thinking on (``chat_template_kwargs: {"enable_thinking": true}``, which puts ``<|think|>``
in the system turn) the generation prompt ends in ``<|turn>model\\n`` and the model writes its
thought channel first::

    <|channel>thought
    The user asks …<channel|>The answer.<turn|>

With thinking off the template closes an empty channel in the prompt
(``<|channel>thought\\n<channel|>``) and the reply is all content. ``thought`` is the channel's
name, not reasoning: a ``thought`` line that opens the block is dropped. The markers are special
tokens of Gemma 4's tokenizer (``reads_special_tokens``), and so are the end-of-turn markers
that close a reply (``<turn|>``, ``<eos>``, and ``<|tool_response>`` after a turn of calls): they
are dropped from both parts.
"""

from __future__ import annotations

import copy
import re
from typing import ClassVar

from tallow.plugin import ReasoningParser, ReasoningSplit, ReasoningStream, TagReasoningStream

OPEN, CLOSE = "<|channel>", "<channel|>"
LABEL = "thought"
END_MARKERS = ("<turn|>", "<eos>", "<|tool_response>")
_NAME_HINT = re.compile(r"gemma[-_ ]?4", re.IGNORECASE)


class _MarkerFilter:
    """Removes ``markers`` from a text fed in pieces, holding back a tail that could still
    become one, so the output does not depend on how the text was cut."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._markers = markers
        self._buf = ""

    def feed(self, text: str, final: bool) -> str:
        buf, out = self._buf + text, []
        while True:
            hits = [(buf.find(m), m) for m in self._markers if m in buf]
            if not hits:
                break
            at, marker = min(hits)
            out.append(buf[:at])
            buf = buf[at + len(marker) :]
        keep = 0 if final else self._tail(buf)
        out.append(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return "".join(out)

    def _tail(self, buf: str) -> int:
        """The length of the longest end of ``buf`` that begins a marker."""
        longest = max(map(len, self._markers))
        for n in range(min(len(buf), longest - 1), 0, -1):
            if any(m.startswith(buf[-n:]) for m in self._markers):
                return n
        return 0


class Gemma4ReasoningStream(ReasoningStream):
    """Streaming half of :class:`Gemma4ReasoningParser`: the channel read by
    :class:`tallow.plugin.TagReasoningStream`, its ``thought`` line dropped (held back while
    the reasoning so far could still be it), the end markers filtered out of both parts."""

    def __init__(self, starts_inside: bool, labelled: bool) -> None:
        self._tags = TagReasoningStream(OPEN, CLOSE, starts_inside)
        self._label_open = labelled  # the reasoning may still begin with the channel's name
        self._head = ""  # reasoning held back while it could be the name
        self._reasoning = _MarkerFilter(END_MARKERS)
        self._content = _MarkerFilter(END_MARKERS)

    def feed(self, text: str) -> ReasoningSplit:
        return self._split(self._tags.feed(text), final=False)

    def finish(self) -> ReasoningSplit:
        return self._split(self._tags.finish(), final=True)

    def _split(self, part: ReasoningSplit, final: bool) -> ReasoningSplit:
        reasoning = self._unlabel(part.reasoning, closed=final or bool(part.content))
        return ReasoningSplit(
            self._reasoning.feed(reasoning, final), self._content.feed(part.content, final)
        )

    def _unlabel(self, reasoning: str, closed: bool) -> str:
        """``reasoning`` without the channel's name line; ``closed``: no reasoning follows."""
        if not self._label_open:
            return reasoning
        head = self._head + reasoning
        line = LABEL + "\n"
        if head.startswith(line):
            self._label_open, self._head = False, ""
            return head[len(line) :]
        if line.startswith(head) and not closed:
            self._head = head
            return ""
        self._label_open, self._head = False, ""
        return "" if head == LABEL else head


class Gemma4ReasoningParser(ReasoningParser):
    """Gemma 4's thought channel; see the module docstring."""

    priority: ClassVar[int] = 65
    reads_special_tokens: ClassVar[bool] = True
    #: where the prompt left the response (:meth:`for_prompt`)
    _inside: bool = False
    _labelled: bool = True

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        """The template writes the channel markers; without a template, a Gemma 4 name."""
        if chat_template is not None:
            return OPEN in chat_template and CLOSE in chat_template
        return bool(_NAME_HINT.search(model_name or ""))

    def for_prompt(self, prompt: str) -> Gemma4ReasoningParser:
        """A copy that begins inside the channel when ``prompt`` opened it (``<|channel>``,
        or ``<|channel>thought`` with its name written already); itself otherwise (Gemma 4's
        templates end in ``<|turn>model\\n`` or in a closed, empty channel)."""
        super().for_prompt(prompt)
        tail = prompt.rstrip()
        if not (tail.endswith(OPEN) or tail.endswith(OPEN + LABEL)):
            return self
        parser = copy.copy(self)
        parser._inside, parser._labelled = True, tail.endswith(OPEN)
        return parser

    def stream(self) -> Gemma4ReasoningStream:
        return Gemma4ReasoningStream(self._inside, self._labelled)

"""Reasoning output of chat completions: the server's reasoning parser, chosen once at start-up,
and its use on one choice.

``server.reasoning_parser`` names a registered :class:`tallow.plugin.ReasoningParser`
(``--reasoning-parser``); empty (the default) means none, and responses are as without reasoning
support. An unknown name fails start-up listing the registered names. With a parser, a choice's
text is split into reasoning (``message.reasoning_content``, streamed as
``delta.reasoning_content``) and content, and tool calls are parsed from the content only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tallow.plugin import ReasoningParser, ReasoningSplit, ReasoningStream

from .parsers import named_entry

if TYPE_CHECKING:
    from tallow.config import TallowConfig

    from .served import ServedEngine


class ReasoningParserError(RuntimeError):
    """The configured reasoning parser cannot be used."""


@dataclass(frozen=True)
class ReasoningParsing:
    """The server's reasoning parser: its name and class, or None for both."""

    name: str | None = None
    parser: type[ReasoningParser] | None = None

    def describe(self) -> dict[str, object]:
        return {"reasoning_parser": self.name}


def choose_reasoning_parser(engine: ServedEngine,
                            config: TallowConfig | None = None) -> ReasoningParsing:
    """The parser ``config.server.reasoning_parser`` names (none when empty); raises
    :class:`ReasoningParserError` naming the registered parsers when it is unknown."""
    name = getattr(getattr(config, "server", None), "reasoning_parser", "") or ""
    if not name:
        return ReasoningParsing()
    pm = getattr(engine, "plugin_manager", None)
    registry = getattr(getattr(pm, "registries", None), "reasoning_parsers", None)
    entry = named_entry(registry, config, name, "--reasoning-parser", "reasoning parser",
                        ReasoningParserError)
    return ReasoningParsing(name, entry.load())


class ChoiceReasoning:
    """One choice's reasoning split: ``feed`` stream deltas, then ``finish``; or ``split`` a
    whole text. Without a parser everything is content."""

    def __init__(self, parser_cls: type[ReasoningParser] | None) -> None:
        self.parser = parser_cls() if parser_cls is not None else None
        self._stream: ReasoningStream | None = None

    def feed(self, text: str) -> ReasoningSplit:
        if self.parser is None:
            return ReasoningSplit("", text)
        if self._stream is None:
            self._stream = self.parser.stream()
        return self._stream.feed(text)

    def finish(self) -> ReasoningSplit:
        if self._stream is None:
            return ReasoningSplit("", "")
        stream, self._stream = self._stream, None
        return stream.finish()

    def split(self, text: str) -> ReasoningSplit:
        return ReasoningSplit("", text) if self.parser is None else self.parser.parse(text)

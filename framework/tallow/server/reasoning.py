"""Reasoning output of chat completions: the server's reasoning parser, chosen once at start-up,
and its use on one choice.

``server.reasoning_parser`` (``--reasoning-parser``) names a registered
:class:`tallow.plugin.ReasoningParser`; an unknown name fails start-up listing the registered
names. ``auto`` (the default) takes the highest-priority parser whose ``matches(model_name,
chat_template)`` is true — the rule, and the owner of the decision, that tool parsers have
(:mod:`.parsers`): the parser recognises its model's template — and none when no parser matches.
``none`` (or empty) turns reasoning parsing off, and responses are as without reasoning support.
With a parser, a choice's text is split into reasoning (``message.reasoning_content``, streamed
as ``delta.reasoning_content``) and content, and tool calls are parsed from the content only.
The parser is first told the rendered prompt, so a prompt whose template closed the reasoning
block (``chat_template_kwargs: {"enable_thinking": false}``) starts the response in the content.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tallow.plugin import ReasoningParser, ReasoningSplit, ReasoningStream

from .parsers import matching, named_entry

if TYPE_CHECKING:
    from tallow.config import TallowConfig

    from .served import ServedEngine

log = logging.getLogger("tallow.server")

#: settings that turn reasoning parsing off
OFF = ("", "none")


class ReasoningParserError(RuntimeError):
    """The configured reasoning parser cannot be used."""


@dataclass(frozen=True)
class ReasoningParsing:
    """The server's reasoning parser: its name and class, or None for both."""

    name: str | None = None
    parser: type[ReasoningParser] | None = None

    def describe(self) -> dict[str, object]:
        return {"reasoning_parser": self.name}


def choose_reasoning_parser(
    engine: ServedEngine, config: TallowConfig | None = None
) -> ReasoningParsing:
    """The parser ``config.server.reasoning_parser`` names, or for ``auto`` the one that matches
    ``engine``'s model and chat template (see the module docstring); raises
    :class:`ReasoningParserError` naming the registered parsers when a name is unknown."""
    server = getattr(config, "server", None)
    name = str(getattr(server, "reasoning_parser", "auto") if server is not None else "auto")
    if name.strip().lower() in OFF:
        return ReasoningParsing()
    pm = getattr(engine, "plugin_manager", None)
    registry = getattr(getattr(pm, "registries", None), "reasoning_parsers", None)
    if name != "auto":
        entry = named_entry(
            registry, config, name, "--reasoning-parser", "reasoning parser", ReasoningParserError
        )
        return ReasoningParsing(name, entry.load())
    if registry is None:
        return ReasoningParsing()
    fitting = matching(
        registry, config, engine, "reasoning parser", "reasoning stays in the content"
    )
    if not fitting:
        return ReasoningParsing()
    log.info("reasoning parser: chose %r for %s", fitting[0].name, engine.model_name)
    return ReasoningParsing(fitting[0].name, fitting[0].load())


class ChoiceReasoning:
    """One choice's reasoning split: ``feed`` stream deltas, then ``finish``; or ``split`` a
    whole text. Without a parser everything is content. ``prompt`` is the rendered prompt the
    choice continues: the parser reads the response from where the prompt left it
    (:meth:`tallow.plugin.ReasoningParser.for_prompt`; a template that closed the reasoning
    block, thinking being off, starts the response in the content)."""

    def __init__(self, parser_cls: type[ReasoningParser] | None, prompt: str | None = None) -> None:
        parser = parser_cls() if parser_cls is not None else None
        if parser is not None and prompt is not None:
            parser = parser.for_prompt(prompt)
        self.parser = parser
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

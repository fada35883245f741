"""Choosing the tool-call parsers of a server, once, at start-up.

``server.tool_parser`` names one (``--tool-parser``): it must be registered, else start-up fails
listing the registered parsers, and it is the only parser used. With ``auto``, the registered
parsers are asked by priority, highest first, whether they ``matches(model_name,
chat_template)``: the first that does is the *primary* parser, and the other matching ones, in
priority order, are *fallbacks*. A response in which the primary parser finds no call is given
to the fallbacks in turn (small models often write a call without their format's markup; the
plain-JSON parser, which matches every model, catches those). When no parser matches, tool
calling is unavailable and a request with ``tools`` (and a tool_choice other than ``none``) gets
a 400 saying so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tallow.plugin import Entry, Registry, SelectionError, select, serving
from tallow.plugin.tool_parsing import ToolParser, template_match

if TYPE_CHECKING:
    from tallow.config import TallowConfig

    from .served import ServedEngine

log = logging.getLogger("tallow.server")


class ToolParserError(RuntimeError):
    """The configured tool parser cannot be used."""


@dataclass(frozen=True)
class ToolParsing:
    """The parsers of a server: ``parser`` (a ToolParser class, or None) and its fallbacks."""

    name: str | None = None
    parser: type[ToolParser] | None = None
    fallbacks: tuple[tuple[str, type[ToolParser]], ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, object]:
        return {"tool_parser": self.name, "fallbacks": [name for name, _ in self.fallbacks]}


def named_entry(
    registry: Registry | None,
    config: TallowConfig | None,
    name: str,
    flag: str,
    what: str,
    error: type[RuntimeError],
) -> Entry:
    """The component ``name`` of ``registry`` as the setting behind ``flag`` names it; raises
    ``error`` naming the flag, and the registered names, when it cannot be used."""
    if registry is None:
        raise error(f"{flag} {name!r}: no plugin manager, so no {what} is registered")
    try:
        return select(registry, config, name)
    except SelectionError as exc:
        raise error(f"{flag} {name!r}: {exc}") from None


def matching(
    registry: Registry, config: TallowConfig | None, engine: ServedEngine, what: str, otherwise: str
) -> list[Entry]:
    """The parsers of ``registry`` whose ``matches(model_name, chat_template)`` claims
    ``engine``'s model, highest priority first (:func:`tallow.plugin.serving`); when none does,
    logs that, and ``otherwise`` (what it means)."""
    template = getattr(engine.tokenizer, "chat_template", None)
    fitting = serving(registry, config, check=template_match(engine.model_name, template))
    if not fitting:
        log.info(
            "%s: none of %s matches %s; %s",
            what,
            registry.names() or "[]",
            engine.model_name,
            otherwise,
        )
    return fitting


def choose_tool_parser(engine: ServedEngine, config: TallowConfig | None = None) -> ToolParsing:
    """The tool parsers for ``engine``'s model (see the module docstring): the primary is
    chosen by :func:`tallow.plugin.select`, the fallbacks are the other parsers it would serve
    with (:func:`tallow.plugin.serving`)."""
    pm = getattr(engine, "plugin_manager", None)
    registry = getattr(getattr(pm, "registries", None), "tool_parsers", None)
    name = getattr(getattr(config, "server", None), "tool_parser", "auto") or "auto"
    if name != "auto":
        entry = named_entry(registry, config, name, "--tool-parser", "tool parser", ToolParserError)
        return ToolParsing(name, entry.load())
    if registry is None:
        return ToolParsing()
    fitting = matching(registry, config, engine, "tool parser", "tool calling is off")
    if not fitting:
        return ToolParsing()
    first, rest = fitting[0], tuple((e.name, e.load()) for e in fitting[1:])
    log.info(
        "tool parser: chose %r for %s%s",
        first.name,
        engine.model_name,
        f" (fallbacks: {', '.join(n for n, _ in rest)})" if rest else "",
    )
    return ToolParsing(first.name, first.load(), rest)

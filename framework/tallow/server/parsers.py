"""Choosing the tool-call parser of a server, once, at start-up.

``server.tool_parser`` names one (``--tool-parser``): it must be registered, else start-up fails
listing the registered parsers. With ``auto``, the registered parsers are asked by priority,
highest first, whether they ``matches(model_name, chat_template)``; the first that does serves.
When none does, tool calling is unavailable and a request with ``tools`` (and a tool_choice
other than ``none``) gets a 400 saying so.
"""

from __future__ import annotations

import logging
from typing import Any

from tallow.plugin import RegistryError

log = logging.getLogger("tallow.server")


class ToolParserError(RuntimeError):
    """The configured tool parser cannot be used."""


def choose_tool_parser(engine: Any, config: Any = None) -> tuple[str | None, Any]:
    """(registered name, ToolParser class) for ``engine``'s model; (None, None) if none fits."""
    pm = getattr(engine, "plugin_manager", None)
    registry = getattr(getattr(pm, "registries", None), "tool_parsers", None)
    name = getattr(getattr(config, "server", None), "tool_parser", "auto") or "auto"
    template = getattr(engine.tokenizer, "chat_template", None)
    if name != "auto":
        if registry is None:
            raise ToolParserError(f"--tool-parser {name!r}: no plugin manager, so no tool "
                                  "parser is registered")
        try:
            entry = registry.entry(name)
            parser = entry.load()
        except RegistryError as exc:
            raise ToolParserError(f"--tool-parser {name!r}: {exc}") from None
        except Exception as exc:
            raise ToolParserError(f"--tool-parser {name!r} (from {entry.distribution}) cannot "
                                  f"be imported: {type(exc).__name__}: {exc}") from exc
        log.info("tool parser: %r from %s (named in the config)", name, entry.distribution)
        return name, parser
    if registry is None:
        return None, None
    for entry in registry.by_priority():
        try:
            parser = entry.load()
            fits = bool(parser.matches(engine.model_name, template))
        except Exception as exc:  # a broken parser plugin must not stop the server
            log.warning("tool parser %r from %s failed: %s: %s", entry.name, entry.distribution,
                        type(exc).__name__, exc)
            continue
        if fits:
            log.info("tool parser: chose %r from %s (priority %d) for %s", entry.name,
                     entry.distribution, entry.priority, engine.model_name)
            return entry.name, parser
    log.info("tool parser: none of %s matches %s; tool calling is off",
             registry.names() or "[]", engine.model_name)
    return None, None

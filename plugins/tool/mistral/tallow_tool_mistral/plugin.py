"""Registration of the mistral tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    registry.register("mistral", "tallow_tool_mistral.parser:MistralToolParser", priority=50)

"""Registration of the gemma4 tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    registry.register("gemma4", "tallow_tool_gemma4.parser:Gemma4ToolParser", priority=66)

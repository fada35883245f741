"""Registration of the minimax_m2 tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Its markup is its own; above the generic formats so that auto selection prefers it.
    registry.register("minimax_m2", "tallow_tool_minimax.parser:MiniMaxM2ToolParser", priority=64)

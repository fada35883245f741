"""Registration of the llama3_json tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    registry.register("llama3_json", "tallow_tool_llama3.parser:Llama3JsonToolParser", priority=40)

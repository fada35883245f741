"""Registration of the hermes tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Above the generic formats; below qwen3_coder, whose templates also contain "<tool_call>".
    registry.register("hermes", "tallow_tool_hermes.parser:HermesToolParser", priority=60)

"""Registration of the json tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # The fallback: it matches every model, so it must come after every specific format.
    registry.register("json", "tallow_tool_json.parser:JsonToolParser", priority=-100)

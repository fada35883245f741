"""Registration of the pythonic tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Claims Llama 4 templates only; above llama3_json, whose format Llama 4 does not use.
    registry.register("pythonic", "tallow_tool_pythonic.parser:PythonicToolParser", priority=45)

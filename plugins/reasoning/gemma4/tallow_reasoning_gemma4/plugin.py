"""Registration of the gemma4 reasoning parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_reasoning_parsers(registry) -> None:
    registry.register("gemma4", "tallow_reasoning_gemma4.parser:Gemma4ReasoningParser", priority=65)

"""Registration of the harmony reasoning and tool parsers (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_reasoning_parsers(registry) -> None:
    registry.register(
        "harmony", "tallow_reasoning_harmony.reasoning:HarmonyReasoningParser", priority=80
    )


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Above every markup format: a harmony template is unmistakable (its <|channel|> token).
    registry.register("harmony", "tallow_reasoning_harmony.tools:HarmonyToolParser", priority=80)

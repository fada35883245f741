"""Registration of the ``<think>`` reasoning parsers (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_reasoning_parsers(registry) -> None:
    registry.register("think", "tallow_reasoning_think.parser:ThinkReasoningParser")
    registry.register("deepseek_r1", "tallow_reasoning_think.parser:OpenThinkReasoningParser")

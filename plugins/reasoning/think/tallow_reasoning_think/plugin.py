"""Registration of the ``<think>`` reasoning parsers (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_reasoning_parsers(registry) -> None:
    # deepseek_r1 is asked first: its templates contain <think> too, but open it in the prompt.
    registry.register("think", "tallow_reasoning_think.parser:ThinkReasoningParser", priority=50)
    registry.register(
        "deepseek_r1", "tallow_reasoning_think.parser:OpenThinkReasoningParser", priority=60
    )

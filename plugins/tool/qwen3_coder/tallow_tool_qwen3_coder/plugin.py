"""Registration of the qwen3_coder tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Above hermes: Qwen3-Coder templates contain "<tool_call>" too, and also "<function=".
    registry.register(
        "qwen3_coder", "tallow_tool_qwen3_coder.parser:Qwen3CoderToolParser", priority=70
    )

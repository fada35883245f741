"""Registration of the glm45 tool parser (imports nothing heavy)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_tool_parsers(registry) -> None:
    # Above hermes: GLM templates contain "<tool_call>" too, and also "<arg_key>".
    registry.register("glm45", "tallow_tool_glm.parser:GlmToolParser", priority=65)

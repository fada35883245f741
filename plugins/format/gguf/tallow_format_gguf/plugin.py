"""Registration of the GGUF weight format (imports neither torch nor gguf)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_weight_formats(registry) -> None:
    # Above generic directory/hub loaders: a path ending in .gguf is unambiguous.
    registry.register("gguf", "tallow_format_gguf.format:GGUFFormat", priority=100)

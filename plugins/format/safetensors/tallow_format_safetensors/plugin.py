"""Registration of the safetensors weight format (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_weight_formats(registry) -> None:
    # Above hub ids: a local directory is asked first, so a path that exists is never mistaken
    # for a repository name.
    registry.register(
        "safetensors", "tallow_format_safetensors.format:SafetensorsFormat", priority=50
    )

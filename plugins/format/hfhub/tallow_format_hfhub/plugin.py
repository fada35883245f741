"""Registration of the hub weight format (a lazy target: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_weight_formats(registry) -> None:
    # Below local formats: only a source that is not a local path is taken for a hub id.
    registry.register("hfhub", "tallow_format_hfhub.format:HFHubFormat", priority=10)

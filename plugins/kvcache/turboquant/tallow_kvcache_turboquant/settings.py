"""The plugin's settings (``plugins.settings.tallow-kvcache-turboquant``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tallow.plugin import plugin_settings

DISTRIBUTION = "tallow-kvcache-turboquant"


class TurboSettings(BaseModel):
    """Which parts of the format are used (switching them off measures what each buys):
    ``rotation`` (off: plain per-token scalar quantization), ``center_keys`` and
    ``center_values`` (subtract the calibrated mean key or value of each head; values off by
    default: on Qwen2.5-0.5B it did not lower perplexity consistently),
    ``smooth_keys`` (the calibrated per-channel balance between keys and queries); ``seed``
    picks the random signs of the rotation."""

    model_config = ConfigDict(extra="forbid")

    rotation: bool = True
    center_keys: bool = True
    smooth_keys: bool = True
    center_values: bool = False
    seed: int = Field(0, ge=0, lt=2**31)


def turbo_settings(config: Any) -> TurboSettings:
    """The settings in ``config`` (a TallowConfig, or None: the defaults); errors name the key
    (:class:`tallow.plugin.PluginSettingsError`)."""
    return plugin_settings(TurboSettings, config, DISTRIBUTION)

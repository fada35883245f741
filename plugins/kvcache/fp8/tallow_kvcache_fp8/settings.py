"""The plugin's settings (``plugins.settings.tallow-kvcache-fp8``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tallow.plugin import plugin_settings

DISTRIBUTION = "tallow-kvcache-fp8"


class FP8Settings(BaseModel):
    """``scales``: ``none`` stores K and V as they are; ``checkpoint`` divides each layer's
    keys and values by the ``self_attn.k_scale``/``v_scale`` its checkpoint carries (FP8-KV
    checkpoints; one value per layer or one per KV head) before rounding, and multiplies them
    back when read. A checkpoint without them then stops start-up.

    ``center_keys``: store each key less its head's mean key, calibrated at start-up over the
    engine's calibration text (:class:`tallow.kernels.kv_cast.CastKVCodec`), for models whose
    keys carry a large constant per channel (Qwen2's key biases)."""

    model_config = ConfigDict(extra="forbid")

    scales: Literal["none", "checkpoint"] = "none"
    center_keys: bool = False


def fp8_settings(config: Any) -> FP8Settings:
    """The settings in ``config`` (a TallowConfig, or None: the defaults); errors name the key
    (:class:`tallow.plugin.PluginSettingsError`)."""
    return plugin_settings(FP8Settings, config, DISTRIBUTION)

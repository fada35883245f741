"""The plugin's settings: ``plugins.settings.tallow-attention-flashinfer``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tallow.plugin import plugin_settings

DISTRIBUTION = "tallow-attention-flashinfer"


class FlashInferSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: kernels of steps with prompts: "fa3" (Hopper only, 16-bit caches), "fa2", or "auto"
    #: (fa3 where it can serve, else fa2)
    prefill_backend: Literal["auto", "fa2", "fa3"] = "auto"
    #: decode-only steps on tensor cores (flashinfer's FA2 prefill kernels with one query row
    #: per sequence) or on CUDA cores (its decode kernels); "auto": tensor cores from 4 query
    #: heads per KV head or with an 8-bit cache
    decode_tensor_cores: Literal["auto", "always", "never"] = "auto"
    #: scratch memory of the split-KV kernels (MiB), shared by every layer and step: a long
    #: chunk of a prompt split over many thread blocks outgrows the 128 MiB of FlashInfer's
    #: examples
    workspace_mb: int = Field(512, ge=16, le=16384)


def read_settings(config: Any) -> FlashInferSettings:
    """The validated settings of ``config`` (a TallowConfig or None); errors name the key."""
    return plugin_settings(FlashInferSettings, config, DISTRIBUTION)

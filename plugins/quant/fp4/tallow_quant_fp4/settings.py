"""The settings of ``tallow-quant-fp4`` (``plugins.settings.tallow-quant-fp4``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

DISTRIBUTION = "tallow-quant-fp4"


class FP4Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: ``tensor_core``: every product on a GPU through tallow's packed-weight tensor-core GEMM
    #: (:mod:`tallow_quant_fp4.tensor_core`; the weights re-laid at load, kept beside the
    #: default layout); ``default``: the plugin's GEMV for a few rows, a workspace and cuBLAS
    #: above
    kernel: Literal["default", "tensor_core"] = "default"

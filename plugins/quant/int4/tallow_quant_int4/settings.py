"""The settings of ``tallow-quant-int4`` (``plugins.settings.tallow-quant-int4``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .isq import Recipe
from .ops import DEFAULT_GEMV_ROWS, MAX_GEMV_ROWS

DISTRIBUTION = "tallow-quant-int4"


class Int4Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: the most rows of x that take the CUDA-core kernel on a GPU
    gemv_max_rows: int = Field(DEFAULT_GEMV_ROWS, ge=0, le=MAX_GEMV_ROWS)
    #: ``tensor_core``: every matmul on a GPU through tallow's packed-weight tensor-core GEMM
    #: (:mod:`tallow_quant_int4.tensor_core`; the weights re-laid at load, kept beside the
    #: default layout); ``default``: the CUDA-core kernel for a few rows, a workspace and
    #: cuBLAS above
    kernel: Literal["default", "tensor_core"] = "default"
    # -- model.isq: int4 ---------------------------------------------------------------------
    method: Literal["gptq", "rtn"] = "gptq"
    group_size: Literal[32, 64, 128] = 128
    symmetric: bool = False
    #: columns in decreasing order of input energy (static groups); on by default with
    #: ``sequential`` (measured: docs/benchmarks.md, int4 GPTQ perplexity)
    act_order: bool = True
    damp: float = Field(0.01, gt=0.0, le=1.0)
    #: GPTQ picks each group's clipping ratio by its error weighted per column
    #: (``clip_weighting``), over a finer grid of ratios
    clip_search: bool = False
    #: with ``clip_search``: each column's error weighted by the Hessian's diagonal
    #: (``hessian``) or by what GPTQ's own cost gives it, ``1 / [H^-1]_ii`` over the columns
    #: not yet rounded (``inverse``: the error left after the later columns compensate)
    clip_weighting: Literal["hessian", "inverse"] = "hessian"
    #: each group's range searched over clipping ratios by its squared error (false: every
    #: group takes its whole range, min to max, as GPTQ's reference implementation does)
    clip: bool = True
    calibration_sequences: int = Field(64, ge=1, le=4096)
    calibration_tokens: int = Field(512, ge=16, le=65536)
    #: GPTQ layer by layer: each layer quantized as the calibration pass reaches it, so the
    #: layers after it see its quantized outputs (one forward pass over every window)
    sequential: bool = True
    #: with ``sequential``: each layer aims at the float model's outputs over the float
    #: model's inputs (the windows also run through the float layers, side by side), so it
    #: corrects the error the quantized layers before it left in its inputs
    float_reference: bool = False
    #: the built-in text to calibrate on: English prose (the King James Bible) or tallow's
    #: own Python source
    calibration_corpus: Literal["kjv", "source"] = "kjv"
    #: a UTF-8 text file to calibrate on instead (None: ``calibration_corpus``)
    calibration_text: Optional[str] = None

    @model_validator(mode="after")
    def _dependent_settings(self) -> "Int4Settings":
        if self.float_reference and not self.sequential:
            raise ValueError(
                "float_reference needs sequential: true (the float model's "
                "inputs are gathered in the sequential calibration pass)"
            )
        if self.clip_weighting != "hessian" and not self.clip_search:
            raise ValueError(
                "clip_weighting needs clip_search: true (it weights the clip search's errors)"
            )
        if self.clip_search and not self.clip:
            raise ValueError("clip_search needs clip: true (it searches clipping ratios)")
        return self

    def recipe(self) -> Recipe:
        return Recipe(
            method=self.method,
            group=self.group_size,
            symmetric=self.symmetric,
            act_order=self.act_order,
            damp=self.damp,
            clip_search=self.clip_search,
            clip_weighting=self.clip_weighting,
            clip=self.clip,
        )

    def read_calibration_text(self) -> str | None:
        """The text of ``calibration_text`` (None when unset)."""
        if self.calibration_text is None:
            return None
        path = Path(self.calibration_text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"plugins.settings.{DISTRIBUTION}.calibration_text: cannot read "
                f"{str(path)!r} as UTF-8 text ({exc})"
            ) from None
        if not text.strip():
            raise ValueError(
                f"plugins.settings.{DISTRIBUTION}.calibration_text: {str(path)!r} is empty"
            )
        return text

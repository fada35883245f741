"""The scheme's settings (``plugins.settings.tallow-quant-fp8``), validated (imports no torch).

``gemv_max_rows``  matmuls of at most this many rows (0–16, default 16: decode batches) take
                   the weight-only GEMV, activations unquantized; more rows quantize the
                   activations to e4m3 and run on the float8 tensor cores (W8A8). The CPU
                   reference follows the same rule, so it computes what the GPU computes.
``matmul``         the W8A8 matmul on a GPU: ``auto`` (``torch._scaled_mm`` where cuBLAS takes
                   the layer, checked once per shape at load, else the Triton kernel),
                   ``scaled_mm`` (refuse to load a layer it does not take) or ``triton``
``fast_accum``     let ``torch._scaled_mm`` accumulate in the tensor cores' reduced precision
                   (faster; default false)
``kernel``         ``tensor_core``: the weight-only products (the rows of ``gemv_max_rows``, or
                   every row of a weights-only checkpoint) run tallow's packed-weight
                   tensor-core GEMM (:mod:`tallow_quant_fp8.tensor_core`) instead of the GEMV
                   and the Triton GEMM; ``default`` (the default): those kernels
``isq_vocab``      under ``model.isq: fp8``, quantize the token embedding and the LM head too
                   (a head tied to the embedding follows it). Default false: both stay in the
                   model's dtype, as in published FP8 checkpoints; true saves their memory and,
                   at batch 1, half the head's bytes, at a cost in quality (docs/performance.md)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DISTRIBUTION = "tallow-quant-fp8"
MATMULS = ("auto", "scaled_mm", "triton")
KERNELS = ("default", "tensor_core")
#: the most rows the GEMV takes
GEMV_ROWS_LIMIT = 16


@dataclass(frozen=True)
class Fp8Settings:
    gemv_max_rows: int = 16
    matmul: str = "auto"
    fast_accum: bool = False
    isq_vocab: bool = False
    kernel: str = "default"

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "Fp8Settings":
        where = f"plugins.settings.{DISTRIBUTION}"
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise ValueError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; expected {', '.join(names)}"
            )
        s = cls(**settings)
        rows = s.gemv_max_rows
        if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= GEMV_ROWS_LIMIT:
            raise ValueError(
                f"{where}.gemv_max_rows: expected an integer from 0 to "
                f"{GEMV_ROWS_LIMIT}, got {rows!r}"
            )
        if s.matmul not in MATMULS:
            raise ValueError(
                f"{where}.matmul: expected one of {', '.join(MATMULS)}, got {s.matmul!r}"
            )
        if s.kernel not in KERNELS:
            raise ValueError(
                f"{where}.kernel: expected one of {', '.join(KERNELS)}, got {s.kernel!r}"
            )
        for name in ("fast_accum", "isq_vocab"):
            if not isinstance(getattr(s, name), bool):
                raise ValueError(
                    f"{where}.{name}: expected true or false, got {getattr(s, name)!r}"
                )
        return s

    @classmethod
    def of(cls, config: Any) -> "Fp8Settings":
        """The settings in a :class:`tallow.config.TallowConfig` (defaults without one)."""
        if config is None:
            return cls()
        return cls.from_settings(dict(config.plugins.settings.get(DISTRIBUTION, {})))

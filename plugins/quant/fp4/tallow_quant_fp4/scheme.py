"""The quant scheme ``fp4``: MXFP4 and NVFP4 weights (gpt-oss-style ``mxfp4`` checkpoints,
compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``, or a float model
quantized at load with ``model.isq: mxfp4``) decoded by Triton kernels. Hopper has no FP4
tensor cores: the weights are decoded to the activations' type (W4A16). The setting
``kernel: tensor_core`` (``plugins.settings.tallow-quant-fp4``) sends every product through
tallow's packed-weight tensor-core GEMM instead (:mod:`.tensor_core`). Dense linear layers,
and the mixture-of-experts experts of ``mxfp4`` checkpoints (gpt-oss: :mod:`.moe`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from tallow.plugin import QuantScheme, plugin_settings

from .checkpoint import FP4Layout, fp4_layout, holds_fp4_weights
from .settings import DISTRIBUTION, FP4Settings

ISQ_TYPES = ("mxfp4",)


class FP4QuantScheme(QuantScheme):
    name: ClassVar[str] = "fp4"
    #: the NVFP4 scales' e4m3 decoding and the kernels are built for Ampere and later
    min_capability: ClassVar[int] = 80
    isq_types: ClassVar[tuple[str, ...]] = ISQ_TYPES

    def __init__(self, config: Any = None, isq: str | None = None) -> None:
        super().__init__(config, isq)
        if isq is not None and isq not in ISQ_TYPES:
            raise ValueError(f"model.isq: expected one of {', '.join(ISQ_TYPES)}, got {isq!r}")
        self.settings = plugin_settings(FP4Settings, config, DISTRIBUTION)
        self.layout: FP4Layout | None = None
        self.methods: list[Any] = []

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        plugin_settings(FP4Settings, config, DISTRIBUTION)  # a bad setting stops start-up
        return []

    @classmethod
    def detect(cls, config: dict[str, Any]) -> bool:
        return holds_fp4_weights(config)

    def use_checkpoint_config(self, config: dict[str, Any]) -> None:
        super().use_checkpoint_config(config)
        self.layout = fp4_layout(config)

    def _method(self, prefix: str) -> Any:
        from .method import FP4LinearMethod

        method = FP4LinearMethod(self, prefix)
        self.methods.append(method)
        return method

    linear_method = head_method = _method

    def moe_method(self, prefix: str) -> Any:
        """MXFP4 experts kept packed for an ``mxfp4`` checkpoint (gpt-oss's
        ``*_blocks`` / ``*_scales``); None (float experts) otherwise."""
        if self.layout is None or self.layout.method != "mxfp4":
            return None
        from .moe import MXFP4MoEMethod

        method = MXFP4MoEMethod(prefix)
        self.methods.append(method)
        return method

    def summary(self) -> str:
        counts = Counter(name for m in self.methods for name in m.type_names())
        kinds = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
        how = (
            f", quantized at load to {self.isq}"
            if self.isq
            else f", from a {self.layout.method} checkpoint"
            if self.layout
            else ""
        )
        return f"fp4: {kinds}{how}"

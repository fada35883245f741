"""The quant scheme ``int4``: integer weights (GPTQ, AWQ, Marlin and compressed-tensors
checkpoints, or a float model quantized at load with ``model.isq: int4``) kept as codes in
one layout and multiplied by Triton kernels.

Settings (``plugins.settings.tallow-quant-int4``, :mod:`tallow_quant_int4.settings`):

``gemv_max_rows``  the most rows of x (0 to 16, default 8) that take the CUDA-core kernel on
                   a GPU; more take the weight decoded into a workspace and cuBLAS.
``method``, ``group_size``, ``symmetric``, ``act_order``, ``damp``, ``sequential``,
``float_reference``, ``calibration_*``
                   how ``model.isq: int4`` chooses codes (:mod:`tallow_quant_int4.isq`):
                   GPTQ on calibration text (the default) or round to nearest.

On a CPU the matmul decodes the whole weight on every call (the exact torch reference); the
scheme serves there too, since a checkpoint of packed integers has no other way to load.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from tallow.plugin import CalibrationRequest, QuantScheme, plugin_settings

from .checkpoint_config import CheckpointLayout, checkpoint_layout, holds_integer_weights
from .ops import KernelPolicy
from .settings import DISTRIBUTION, Int4Settings

ISQ_TYPES = ("int4",)


class IntQuantScheme(QuantScheme):
    """Integer weights with a scale (and zero point) per group of columns (see the module
    docstring)."""

    name: ClassVar[str] = "int4"
    #: the Triton kernels are built and tested for Ampere and later
    min_capability: ClassVar[int] = 80
    isq_types: ClassVar[tuple[str, ...]] = ISQ_TYPES

    def __init__(self, config: Any = None, isq: str | None = None) -> None:
        super().__init__(config, isq)
        if isq is not None and isq not in ISQ_TYPES:
            raise ValueError(f"model.isq: expected one of {', '.join(ISQ_TYPES)}, got {isq!r}")
        self.settings = plugin_settings(Int4Settings, config, DISTRIBUTION)
        self.policy = KernelPolicy(
            gemv_max_rows=self.settings.gemv_max_rows,
            tensor_core=self.settings.kernel == "tensor_core",
        )
        self.recipe = self.settings.recipe()
        self.layout: CheckpointLayout | None = None
        self.methods: list[Any] = []
        #: the MoE layers' methods, once loaded
        self.moe_methods: list[Any] = []
        #: while True, the layers add their inputs to their Hessians (GPTQ's calibration)
        self.calibrating = bool(isq) and self.recipe.method == "gptq"

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        plugin_settings(Int4Settings, config, DISTRIBUTION)  # a bad setting stops start-up
        return []

    @classmethod
    def detect(cls, config: dict[str, Any]) -> bool:
        return holds_integer_weights(config)

    def use_checkpoint_config(self, config: dict[str, Any]) -> None:
        """Read how the checkpoint stores its weights; ``ValueError`` naming the
        ``quantization_config`` field this scheme cannot serve."""
        super().use_checkpoint_config(config)
        self.layout = checkpoint_layout(config)

    def _method(self, prefix: str) -> Any:
        from .method import IntLinearMethod

        method = IntLinearMethod(self, prefix)
        self.methods.append(method)
        return method

    # every linear layer and the LM head (kept as the checkpoint stores it, or quantized under
    # model.isq); token embeddings stay dense
    linear_method = head_method = _method

    def moe_method(self, prefix: str) -> Any:
        """The routed experts of a FusedMoE layer, kept as integer codes
        (:mod:`tallow_quant_int4.moe_method`)."""
        from .moe_method import IntMoEMethod

        return IntMoEMethod(self, prefix)

    def calibration_request(self) -> CalibrationRequest | None:
        """GPTQ under ``model.isq``: the text its layers' inputs are gathered over."""
        if not self.calibrating:
            return None
        return CalibrationRequest(
            sequences=self.settings.calibration_sequences,
            tokens=self.settings.calibration_tokens,
            text=self.settings.read_calibration_text(),
            corpus=self.settings.calibration_corpus,
            sequential=self.settings.sequential,
            paired=self.settings.float_reference,
        )

    def calibrated(self) -> None:
        """Quantize every layer from the inputs it saw (GPTQ)."""
        self.calibrating = False
        for method in self.methods:
            method.quantize_held_weights()

    def summary(self) -> str:
        """What the loaded weights hold, e.g. ``int4: int4 g128 x224, dense x1``."""
        counts = Counter(
            name for m in [*self.methods, *self.moe_methods] for name in m.type_names()
        )
        kinds = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
        how = (
            f", quantized at load to {self.isq} ({self.recipe.method})"
            if self.isq
            else f", from a {self.layout.method} checkpoint"
            if self.layout
            else ""
        )
        return f"int4: {kinds}{how}"

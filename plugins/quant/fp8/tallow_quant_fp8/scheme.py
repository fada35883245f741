"""The quant scheme ``fp8``: float8 e4m3 weights from checkpoints, or quantized at load.

- Checkpoints: HF / vLLM ``quant_method: "fp8"`` (per tensor, or 128 x 128 blocks) and
  compressed-tensors float8 (per tensor, per channel, 128 x 128 blocks);
  :mod:`tallow_quant_fp8.formats` reads their ``quantization_config``. The scheme serves the
  quantization methods ``fp8`` (its name) and ``compressed-tensors`` (registered in
  ``quant_methods``), and :meth:`Fp8QuantScheme.detect` claims the float8 checkpoints among
  them.
- ``model.isq: fp8``: every linear layer of a float model (and with the ``isq_vocab`` setting
  the embedding and head) quantized while it loads, one scale per output row.
- The routed experts of FusedMoE layers, from checkpoints or under ``model.isq``, stay e4m3 as
  well (:meth:`Fp8QuantScheme.moe_method`, :mod:`tallow_quant_fp8.moe_method`).

Products of up to ``gemv_max_rows`` rows are weight-only; larger ones quantize their
activations to e4m3 (W8A8; :mod:`tallow_quant_fp8.ops`). The kernels need compute capability
8.9 (float8 conversions and tensor cores); elsewhere (CPU, older GPUs) the torch reference
computes the same products, dequantizing the weights on every call. So the scheme serves any
device (``min_capability`` 0), except that ``model.isq: fp8`` is refused on a GPU below 8.9,
where it would only be slower than the float weights.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from tallow.plugin import QuantScheme

from .formats import ISQ_CONFIG, Fp8Config, detects, parse
from .settings import Fp8Settings

ISQ_TYPE = "fp8"


class Fp8QuantScheme(QuantScheme):
    """float8 e4m3 weights with float32 scales (see the module docstring)."""

    name: ClassVar[str] = "fp8"
    min_capability: ClassVar[int] = 0
    isq_types: ClassVar[tuple[str, ...]] = (ISQ_TYPE,)

    def __init__(self, config: Any = None, isq: str | None = None) -> None:
        super().__init__(config, isq)
        if isq is not None and isq != ISQ_TYPE:
            raise ValueError(f"model.isq: the fp8 scheme quantizes to {ISQ_TYPE!r}, got {isq!r}")
        self.settings = Fp8Settings.of(config)
        #: how the weights are stored (None until a checkpoint config or isq says)
        self.checkpoint: Fp8Config | None = ISQ_CONFIG if isq else None
        self.methods: list[Any] = []
        #: the MoE layers' methods, once loaded
        self.moe_methods: list[Any] = []

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        Fp8Settings.of(config)  # a bad setting stops start-up, naming the key
        if config is None or config.model.isq != ISQ_TYPE:
            return []
        from .ops import FP8_CAPABILITY, device_capability

        import torch

        name = config.model.device
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        cap = device_capability(torch.device(name))
        if cap is not None and cap < FP8_CAPABILITY:
            return [
                f"fp8 matmuls need compute capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} "
                f"(float8 tensor cores); {name} has {cap[0]}.{cap[1]}, where fp8 weights "
                "would only be slower than bf16 ones (q8_0 is the 8-bit type for it)"
            ]
        return []

    @classmethod
    def detect(cls, config: dict[str, Any]) -> bool:
        return detects(config)

    def use_checkpoint_config(self, config: dict[str, Any]) -> None:
        """Read how the checkpoint stores its float8 weights; ``ValueError`` naming the
        ``quantization_config`` field this scheme cannot serve."""
        super().use_checkpoint_config(config)
        self.checkpoint = parse(config)

    def _method(self, prefix: str) -> Any:
        from .method import Fp8LinearMethod

        method = Fp8LinearMethod(self, prefix)
        self.methods.append(method)
        return method

    linear_method = _method

    def moe_method(self, prefix: str) -> Any:
        """The routed experts of a FusedMoE layer: e4m3 like the linear layers
        (:mod:`tallow_quant_fp8.moe_method`)."""
        from .moe_method import Fp8MoEMethod

        return Fp8MoEMethod(self, prefix)

    def head_method(self, prefix: str) -> Any:
        """The LM head: a checkpoint's may be float8 or not (the loader keeps a float one
        dense); under ``model.isq`` float8 only with ``isq_vocab``."""
        return None if self.isq and not self.settings.isq_vocab else self._method(prefix)

    def embedding_method(self, prefix: str) -> Any:
        """Token embeddings: float8 under ``model.isq`` with ``isq_vocab`` (rows dequantized
        as they are read); checkpoints keep theirs dense."""
        return self._method(prefix) if self.isq and self.settings.isq_vocab else None

    def summary(self) -> str:
        """What the loaded weights are, e.g. ``fp8: e4m3 per channel, activations per token;
        225 layers (quantized at load)``."""
        kinds = Counter("fp8" if m.weight is not None else "dense" for m in self.methods)
        how = self.checkpoint.describe() if self.checkpoint is not None else "e4m3"
        dense = f", {kinds['dense']} dense" if kinds["dense"] else ""
        at_load = " (quantized at load)" if self.isq else ""
        moe = f", {len(self.moe_methods)} expert layers" if self.moe_methods else ""
        return f"fp8: {how}; {kinds['fp8']} layers{dense}{moe}{at_load}"

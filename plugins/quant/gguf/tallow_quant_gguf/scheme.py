"""The quant scheme ``gguf``: GGML block types kept quantized, and load-time quantization.

Settings (``plugins.settings.tallow-quant-gguf``). Three choose how a matmul runs on a GPU,
by its weight's type and shape and the number of input rows ``M`` (see
:mod:`tallow_quant_gguf.tuning`):

``matmul``            ``auto`` (the tuned table, else the defaults), ``fused`` (never the
                      workspace path), ``dequant`` (always decode the weight to a workspace in
                      the activation dtype and call cuBLAS) or ``tensor_core`` (layers whose
                      parts are all Q4_0, Q4_1, Q4_K or Q8_0 re-laid at load and multiplied
                      by tallow's packed-weight tensor-core GEMM at every row count:
                      :mod:`tallow_quant_gguf.tensor_core`; other layers as ``auto``)
``dequant_min_rows``  ``auto``: at least this many rows take the workspace and cuBLAS, fewer
                      never do (default: unset, the table decides)
``tuned_table``       a JSON table written by ``bench/gpu/quant_micro.py --sweep`` (default:
                      the table shipped for this GPU, if any)
``cpu``               keep a GGUF file's weights quantized on a CPU too (default false)
``moe_decode_max_tokens``  batches of at most this many tokens run a mixture of experts'
                      quantized experts through the decode kernels, larger ones decode every
                      expert and run the grouped GEMM (default 32;
                      :mod:`tallow_quant_gguf.experts`)

On a CPU the matmul decodes the whole weight on every call (the exact torch reference): a
quarter of the memory of float32 weights, but many times slower. So unless ``cpu`` is true
the scheme declines a GGUF file served on a CPU, and the engine dequantizes it at load (the
log says so); load-time quantization (``model.isq``) is served on a CPU regardless.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from tallow.plugin import QuantScheme

from .qtypes import ISQ_TYPES, QUANT_TYPES
from .quantize_file import FileQuantization

DISTRIBUTION = "tallow-quant-gguf"
MATMUL_MODES = ("auto", "fused", "dequant", "tensor_core")


@dataclass(frozen=True)
class KernelPolicy:
    """The scheme's settings, validated: how matmuls pick their kernel on a GPU, and whether
    a GGUF file is kept quantized on a CPU."""

    matmul: str = "auto"
    dequant_min_rows: int | None = None
    tuned_table: str | None = None
    cpu: bool = False
    moe_decode_max_tokens: int = 32

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "KernelPolicy":
        where = f"plugins.settings.{DISTRIBUTION}"
        unknown = set(settings) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(cls.__dataclass_fields__)}"
            )
        policy = cls(**settings)
        if policy.matmul not in MATMUL_MODES:
            raise ValueError(
                f"{where}.matmul: expected one of {', '.join(MATMUL_MODES)}, got {policy.matmul!r}"
            )
        if not isinstance(policy.cpu, bool):
            raise ValueError(f"{where}.cpu: expected true or false, got {policy.cpu!r}")
        most = policy.moe_decode_max_tokens
        if not isinstance(most, int) or isinstance(most, bool) or most < 0:
            raise ValueError(
                f"{where}.moe_decode_max_tokens: expected a non-negative integer, got {most!r}"
            )
        rows = policy.dequant_min_rows
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
            raise ValueError(
                f"{where}.dequant_min_rows: expected a non-negative integer, got {rows!r}"
            )
        if policy.tuned_table is not None:
            if not isinstance(policy.tuned_table, str):
                raise ValueError(
                    f"{where}.tuned_table: expected a file path, got {policy.tuned_table!r}"
                )
            from .tuning import TunedTable

            try:
                TunedTable.load(policy.tuned_table)
            except ValueError as exc:
                raise ValueError(f"{where}.tuned_table: {exc}") from None
        return policy

    def choice(self, qtype: str, n: int, k: int, m: int, device: Any, fused: bool = False) -> Any:
        """The :class:`~tallow_quant_gguf.tuning.Choice` for ``m`` rows through a ``qtype``
        weight ``[n, k]`` on the CUDA ``device`` (``fused``: never the workspace path)."""
        from .tuning import choose

        table, sm_count = _device_tuning(self.tuned_table, device)
        # under tensor_core, the layers it does not take choose as under auto
        mode = "auto" if self.matmul == "tensor_core" else self.matmul
        return choose(
            table, qtype, n, k, m, sm_count, self.dequant_min_rows, "fused" if fused else mode
        )


@functools.lru_cache(maxsize=None)
def _device_tuning(tuned_table: str | None, device: Any) -> tuple[Any, int]:
    """(tuned table, SM count) for ``device``; Triton's interpreter on a CPU takes the
    defaults of a 132-SM GPU."""
    import torch

    from .tuning import TunedTable, device_table

    if torch.device(device).type != "cuda":
        return (TunedTable.load(tuned_table) if tuned_table else TunedTable()), 132
    props = torch.cuda.get_device_properties(device)
    table = TunedTable.load(tuned_table) if tuned_table else device_table(props.name)
    return table, props.multi_processor_count


def _on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


class GGUFQuantScheme(FileQuantization, QuantScheme):
    """GGML block-quantized weights (GGUF files) kept quantized; ``model.isq`` quantizes a
    float model into the same types while it loads; ``tallow quantize`` writes GGUF files
    (:class:`~tallow_quant_gguf.quantize_file.FileQuantization`)."""

    name: ClassVar[str] = "gguf"
    min_capability: ClassVar[int] = 0
    isq_types: ClassVar[tuple[str, ...]] = ISQ_TYPES

    def __init__(self, config: Any = None, isq: str | None = None) -> None:
        super().__init__(config, isq)
        if isq is not None and isq not in ISQ_TYPES:
            raise ValueError(f"model.isq: expected one of {', '.join(ISQ_TYPES)}, got {isq!r}")
        settings = {}
        if config is not None:
            settings = dict(config.plugins.settings.get(DISTRIBUTION, {}))
        self.policy = KernelPolicy.from_settings(settings)
        self.methods: list[Any] = []

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        if config is None or config.model.isq:
            return []
        policy = KernelPolicy.from_settings(dict(config.plugins.settings.get(DISTRIBUTION, {})))
        if policy.cpu or not _on_cpu(config.model.device):
            return []
        return [
            f"on a CPU it decodes every weight on every call, many times slower than float "
            f"weights (plugins.settings.{DISTRIBUTION}.cpu: true keeps them quantized)"
        ]

    def _method(self, prefix: str) -> Any:
        from .method import GGUFLinearMethod

        method = GGUFLinearMethod(self, prefix)
        self.methods.append(method)
        return method

    # every linear layer, the head and the token embedding keep their GGUF blocks
    linear_method = head_method = embedding_method = _method

    def moe_method(self, prefix: str) -> Any:
        """The experts of a mixture of experts keep their GGUF blocks too (quantized at load
        under ``model.isq``): :class:`~tallow_quant_gguf.experts.GGUFMoEMethod`."""
        from .experts import GGUFMoEMethod

        method = GGUFMoEMethod(self, prefix)
        self.methods.append(method)
        return method

    def summary(self) -> str:
        """The storage types of the loaded weights, e.g. ``gguf: Q4_K x224, Q6_K x1``."""
        counts = Counter(p.type_name for m in self.methods for p in m.parts if p is not None)
        kinds = ", ".join(
            f"{name} x{n}"
            for name, n in sorted(counts.items(), key=lambda kv: (kv[0] not in QUANT_TYPES, kv[0]))
        )
        how = f", quantized at load to {self.isq}" if self.isq else ""
        return f"gguf: {kinds}{how}"

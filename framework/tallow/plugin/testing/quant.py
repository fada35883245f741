"""The quant-scheme suite: each linear layer the scheme's :class:`~tallow.layers.LinearMethod`
stores computes what a matmul by the dequantized weight computes.

::

    class TestMyScheme(QuantSchemeConformance):
        distribution = "tallow-quant-mine"
        component = "mine"

        def quantized_weights(self, rows, cols):
            return [QuantizedWeight("mine", "Q4", (rows, cols), blocks, dequantize), ...]

:meth:`~QuantSchemeConformance.quantized_weights` gives checkpoint tensors of every type the
scheme keeps quantized (as a weight format yields them); each is loaded into a plain, a merged
(two shards) and a row-parallel layer with an activation, and ``layer(x)`` is compared with
``x @ weight.dequantize().T`` for one row (decode) and several (prefill).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from ..components import QuantScheme
from .component import ComponentConformance


class QuantSchemeConformance(ComponentConformance):
    registry_kind = "quant_schemes"
    base_class = QuantScheme

    #: rows and columns of the test layers (columns a multiple of every block size)
    rows: ClassVar[int] = 64
    cols: ClassVar[int] = 256
    #: ``assert_close`` tolerances against the dequantized matmul
    rtol: ClassVar[float] = 1e-4
    atol: ClassVar[float] = 1e-4

    def quantized_weights(self, rows: int, cols: int) -> list[Any]:
        """Checkpoint tensors (:class:`tallow.layers.QuantizedWeight`) of shape ``(rows,
        cols)``, one per type the scheme stores."""
        raise NotImplementedError(f"{type(self).__name__} must implement quantized_weights")

    def make_scheme(self, component_class: Any) -> Any:
        """The scheme instance layers are built with (``component_class(config)``)."""
        from . import make_config

        return component_class(make_config({}))

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "qtype_index" in metafunc.fixturenames:
            n = len(self.quantized_weights(self.rows, self.cols))
            metafunc.parametrize("qtype_index", range(n))
        if "batch" in metafunc.fixturenames:
            metafunc.parametrize("batch", [1, 7])

    def test_states_its_requirements(self, component_class: Any) -> None:
        from . import make_config

        assert isinstance(component_class.min_capability, int)
        assert isinstance(component_class.detect({}), bool)
        reasons = component_class.validate(make_config({}))
        assert isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)

    def test_linear_equals_dequantized_matmul(self, component_class: Any, qtype_index: int,
                                              batch: int) -> None:
        from tallow.layers import BuildContext, ReplicatedLinear

        weight = self.quantized_weights(self.rows, self.cols)[qtype_index]
        build = BuildContext(quant=self.make_scheme(component_class))
        layer = ReplicatedLinear(self.cols, self.rows, build=build, prefix="layer.proj")
        _load(layer, weight)
        x = torch.randn(batch, self.cols, generator=torch.Generator().manual_seed(batch))
        self._compare(layer(x), x @ weight.dequantize().T, weight)

    def test_merged_shards_equal_dequantized_matmul(self, component_class: Any,
                                                    qtype_index: int) -> None:
        from tallow.layers import BuildContext, MergedColumnParallelLinear

        weights = [self.quantized_weights(self.rows, self.cols)[qtype_index] for _ in range(2)]
        build = BuildContext(quant=self.make_scheme(component_class))
        layer = MergedColumnParallelLinear(self.cols, [self.rows, self.rows], build=build,
                                           prefix="layer.gate_up_proj")
        for shard, weight in enumerate(weights):
            _load(layer, weight, shard)
        x = torch.randn(3, self.cols, generator=torch.Generator().manual_seed(3))
        dense = torch.cat([w.dequantize() for w in weights])
        self._compare(layer(x), x @ dense.T, weights[0])

    def test_row_parallel_with_activation(self, component_class: Any,
                                          qtype_index: int) -> None:
        from tallow.layers import BuildContext, RowParallelLinear, SiluAndMul

        weight = self.quantized_weights(self.rows, self.cols)[qtype_index]
        build = BuildContext(quant=self.make_scheme(component_class))
        layer = RowParallelLinear(self.cols, self.rows, build=build, prefix="layer.down_proj")
        _load(layer, weight)
        act = SiluAndMul()
        x = torch.randn(1, 2 * self.cols, generator=torch.Generator().manual_seed(5))
        self._compare(layer(x, act=act), act(x) @ weight.dequantize().T, weight)

    def _compare(self, got: torch.Tensor, expected: torch.Tensor, weight: Any) -> None:
        scale = max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(got.float(), expected.float(), rtol=self.rtol,
                                   atol=self.atol * scale,
                                   msg=lambda m: f"{weight.scheme} {weight.qtype}: {m}")


def _load(layer: Any, weight: Any, shard: Any = None) -> None:
    """Load a quantized checkpoint tensor the way a model's ``load_weights`` does, then let the
    method post-process it."""
    params = [p for p in layer.parameters() if getattr(p, "accepts_quantized", False)]
    if len(params) != 1:
        pytest.fail(f"the scheme's method for {layer.prefix} has {len(params)} parameters "
                    "that accept quantized checkpoint tensors, expected one")
    param = params[0]
    param.weight_loader(param, weight, shard)
    if shard in (None, 1):
        layer.quant_method.process_weights_after_loading(layer)

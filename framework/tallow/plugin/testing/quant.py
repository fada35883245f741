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

A scheme whose checkpoints store a layer as several plain tensors (GPTQ's ``qweight``,
``qzeros``, ``scales``...) implements :meth:`~QuantSchemeConformance.quantized_layers`
instead: :class:`QuantizedLayer` s, each the tensors by the parameter name they load into, the
float weight they stand for, and the checkpoint config the scheme reads their layout from
(:meth:`tallow.plugin.QuantScheme.use_checkpoint_config`). The suite checks that the scheme
claims each such config as the engine decides it: the config's
``quantization_config.quant_method`` is the scheme's name or among the ``quant_methods`` it
registered, and its ``detect`` accepts the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Hashable

import pytest
import torch
from torch import nn

from tallow.layers import (
    BuildContext,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    SiluAndMul,
)

from ..components import QuantScheme
from ..registry import Entry, serves_quant_method
from . import make_config
from .component import ComponentConformance


@dataclass(frozen=True)
class QuantizedLayer:
    """One linear layer's checkpoint tensors as a scheme's format stores them.

    ``tensors`` maps the name of the layer parameter each loads into (``"qweight"``...; ``""``
    for the one parameter that accepts a :class:`tallow.layers.QuantizedWeight`) to the
    tensor; ``dense`` is the float ``[rows, cols]`` weight they decode to; ``checkpoint_config``
    the HF-style config whose ``quantization_config`` describes them (handed to the scheme's
    ``use_checkpoint_config`` when not empty); ``label`` names the case in failures."""

    label: str
    tensors: dict[str, Any]
    dense: torch.Tensor
    checkpoint_config: dict[str, Any] = field(default_factory=dict)


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

    def quantized_layers(self, rows: int, cols: int) -> list[QuantizedLayer]:
        """One :class:`QuantizedLayer` of shape ``(rows, cols)`` per layout the scheme stores;
        by default each of :meth:`quantized_weights`, loaded into the parameter that accepts
        it."""
        return [
            QuantizedLayer(f"{w.scheme} {w.qtype}", {"": w}, w.dequantize())
            for w in self.quantized_weights(rows, cols)
        ]

    def make_scheme(
        self, component_class: type[QuantScheme], checkpoint_config: dict[str, Any] | None = None
    ) -> QuantScheme:
        """The scheme instance layers are built with (``component_class(config)``, told the
        ``checkpoint_config`` when one is given)."""
        scheme = component_class(make_config({}))
        if checkpoint_config:
            scheme.use_checkpoint_config(checkpoint_config)
        return scheme

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "qtype_index" in metafunc.fixturenames:
            n = len(self.quantized_layers(self.rows, self.cols))
            metafunc.parametrize("qtype_index", range(n))
        if "batch" in metafunc.fixturenames:
            metafunc.parametrize("batch", [1, 7])

    def test_states_its_requirements(
        self, component_class: type[QuantScheme], entry: Entry
    ) -> None:
        assert isinstance(component_class.min_capability, int)
        assert isinstance(component_class.detect({}), bool)
        methods = entry.meta.get("quant_methods", ())
        assert isinstance(methods, tuple) and all(isinstance(m, str) and m for m in methods)
        assert all(isinstance(t, str) and t for t in component_class.isq_types)
        reasons = component_class.validate(make_config({}))
        assert isinstance(reasons, list) and all(isinstance(r, str) for r in reasons)

    def test_claims_the_checkpoints_of_its_layouts(
        self, component_class: type[QuantScheme], entry: Entry
    ) -> None:
        for case in self.quantized_layers(self.rows, self.cols):
            if not case.checkpoint_config:
                continue
            method = case.checkpoint_config.get("quantization_config", {}).get("quant_method")
            assert isinstance(method, str) and serves_quant_method(entry, method), (
                f"{case.label}: its quant_method {method!r} is neither the scheme's name nor "
                f"among the quant_methods it registers ({entry.meta.get('quant_methods', ())})"
            )
            assert component_class.detect(dict(case.checkpoint_config)) is True, (
                f"{case.label}: the scheme's detect does not claim its own checkpoint config"
            )

    def test_linear_equals_dequantized_matmul(
        self, component_class: type[QuantScheme], qtype_index: int, batch: int
    ) -> None:
        case = self.quantized_layers(self.rows, self.cols)[qtype_index]
        build = BuildContext(quant=self.make_scheme(component_class, case.checkpoint_config))
        layer = ReplicatedLinear(self.cols, self.rows, build=build, prefix="layer.proj")
        _load(layer, case)
        layer.quant_method.process_weights_after_loading(layer)
        x = torch.randn(batch, self.cols, generator=torch.Generator().manual_seed(batch))
        self._compare(layer(x), x @ case.dense.T, case)

    def test_merged_shards_equal_dequantized_matmul(
        self, component_class: type[QuantScheme], qtype_index: int
    ) -> None:
        cases = [self.quantized_layers(self.rows, self.cols)[qtype_index] for _ in range(2)]
        build = BuildContext(quant=self.make_scheme(component_class, cases[0].checkpoint_config))
        layer = MergedColumnParallelLinear(
            self.cols, [self.rows, self.rows], build=build, prefix="layer.gate_up_proj"
        )
        for shard, case in enumerate(cases):
            _load(layer, case, shard)
        layer.quant_method.process_weights_after_loading(layer)
        x = torch.randn(3, self.cols, generator=torch.Generator().manual_seed(3))
        dense = torch.cat([c.dense for c in cases])
        self._compare(layer(x), x @ dense.T, cases[0])

    def test_row_parallel_with_activation(
        self, component_class: type[QuantScheme], qtype_index: int
    ) -> None:
        case = self.quantized_layers(self.rows, self.cols)[qtype_index]
        build = BuildContext(quant=self.make_scheme(component_class, case.checkpoint_config))
        layer = RowParallelLinear(self.cols, self.rows, build=build, prefix="layer.down_proj")
        _load(layer, case)
        layer.quant_method.process_weights_after_loading(layer)
        act = SiluAndMul()
        x = torch.randn(1, 2 * self.cols, generator=torch.Generator().manual_seed(5))
        self._compare(layer(x, act=act), act(x) @ case.dense.T, case)

    def _compare(self, got: torch.Tensor, expected: torch.Tensor, case: QuantizedLayer) -> None:
        scale = max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(
            got.float(),
            expected.float(),
            rtol=self.rtol,
            atol=self.atol * scale,
            msg=lambda m: f"{case.label}: {m}",
        )


def _load(layer: nn.Module, case: QuantizedLayer, shard: Hashable | None = None) -> None:
    """Load a layer's checkpoint tensors the way a model's ``load_weights`` does: each through
    its parameter's loader (a :class:`~tallow.layers.QuantizedWeight` through the one
    parameter that accepts it)."""
    for name, tensor in case.tensors.items():
        if name:
            param = getattr(layer, name, None)
            if not isinstance(param, torch.nn.Parameter):
                pytest.fail(
                    f"{case.label}: the scheme's method for {layer.prefix} has no "
                    f"parameter {name!r} for that checkpoint tensor"
                )
        else:
            params = [p for p in layer.parameters() if getattr(p, "accepts_quantized", False)]
            if len(params) != 1:
                pytest.fail(
                    f"the scheme's method for {layer.prefix} has {len(params)} "
                    "parameters that accept quantized checkpoint tensors, expected one"
                )
            param = params[0]
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            pytest.fail(f"{case.label}: parameter {name!r} of {layer.prefix} has no loader")
        if shard is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard)

"""The KV-codec suite: what the codec states (its cache dtype per model dtype, its bytes per
element) and what storing through it does to K and V.

::

    class TestMyCodec(KVCodecConformance):
        distribution = "tallow-kvcache-mine"
        component = "mine"

K/V are written the way every step writes them (:func:`tallow.kernels.attention_ref.
store_kv_ref`: scattered over shuffled blocks at ``slot_mapping``, partial blocks, rows with
slot -1 skipped) into a ``[2, blocks, block_size, Hkv, D]`` cache of the codec's dtype, and
read back through a block table. An elementwise codec must return every element rounded to
nearest in its cache dtype: within half a unit in the last place of the element (for an 8-bit
float, values beyond its largest finite magnitude saturate to it), or within
:attr:`KVCodecConformance.relative_tolerance` when the codec states one.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import pytest
import torch

from tallow.kernels.attention_ref import gather_context_ref, store_kv_ref

from ..components import KVCodec
from .component import ComponentConformance


def rounding_bound(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per element of ``x`` (float32), the largest error of rounding it to nearest in
    ``dtype``: half a unit in the last place, at least half the smallest subnormal."""
    info = torch.finfo(dtype)
    mag = x.abs().clamp_min(info.smallest_normal)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    return torch.maximum(ulp / 2, torch.full_like(ulp, info.smallest_normal * info.eps / 2))


class KVCodecConformance(ComponentConformance):
    registry_kind = "kv_codecs"
    base_class = KVCodec

    #: model dtypes the codec is checked for
    model_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16,
                                                       torch.float16)
    #: the error the codec promises relative to each value's magnitude; None: exact rounding
    #: to nearest in the cache dtype
    relative_tolerance: ClassVar[float | None] = None
    num_kv_heads: ClassVar[int] = 2
    head_dim: ClassVar[int] = 16
    block_size: ClassVar[int] = 8

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "model_dtype" in metafunc.fixturenames:
            metafunc.parametrize("model_dtype", self.model_dtypes, ids=str)

    @pytest.fixture(scope="class")
    def codec(self, component_class: Any) -> Any:
        return component_class()

    def test_states_its_cache_dtype(self, codec: Any, model_dtype: torch.dtype) -> None:
        dtype = codec.cache_dtype(model_dtype)
        assert isinstance(dtype, torch.dtype), f"cache_dtype({model_dtype}) gave {dtype!r}"
        assert dtype.is_floating_point or not codec.elementwise, (
            f"an elementwise codec casts into a float dtype, cache_dtype({model_dtype}) is "
            f"{dtype}")
        assert codec.bytes_per_element > 0

    def test_bytes_per_element_is_the_cache_dtype_size(self, codec: Any) -> None:
        dtypes = {codec.cache_dtype(d) for d in self.model_dtypes}
        if not codec.elementwise or len(dtypes) != 1:
            pytest.skip("the codec's storage follows the model dtype or has its own encoding: "
                        "bytes_per_element is nominal")
        (dtype,) = dtypes
        assert codec.bytes_per_element == dtype.itemsize

    def test_selected_by_name(self, plugin_manager: Any) -> None:
        from ..selection import select
        from . import make_config

        config = make_config({"cache": {"kv_codec": self.component}})
        assert select(plugin_manager.registries.kv_codecs, config, self.component).name == \
            self.component

    def test_round_trip_through_scattered_partial_blocks(self, codec: Any,
                                                         model_dtype: torch.dtype) -> None:
        if not codec.elementwise:
            pytest.skip(f"kv codec {self.component!r} has an encoding of its own; the KVCodec "
                        "contract has no reference read path for it")
        dtype = codec.cache_dtype(model_dtype)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.component}{model_dtype}".encode()))
        bs, heads, dim = self.block_size, self.num_kv_heads, self.head_dim
        tokens = 3 * bs + 3  # three full blocks and a partial one
        num_blocks = 7
        table = torch.randperm(num_blocks, generator=gen)[:4].to(torch.int32)
        k = self._values(gen, tokens, heads, dim, dtype).to(model_dtype)
        v = self._values(gen, tokens, heads, dim, dtype).to(model_dtype)
        slots = table.long()[torch.arange(tokens) // bs] * bs + torch.arange(tokens) % bs
        skipped = torch.zeros(tokens, dtype=torch.bool)
        skipped[[2, bs + 1]] = True  # padding rows: slot -1, nothing stored
        slots = torch.where(skipped, torch.full_like(slots, -1), slots)
        cache = torch.full((2, num_blocks, bs, heads, dim), float("nan")).to(dtype)
        order = torch.randperm(tokens, generator=gen)  # scatter does not depend on row order
        store_kv_ref(cache, k[order], v[order], slots[order])

        read_k, read_v = gather_context_ref(cache, table, tokens)
        for name, wrote, read in (("K", k, read_k), ("V", v, read_v)):
            read = read.float()
            assert torch.isnan(read[skipped]).all(), f"{name}: a row with slot -1 was stored"
            kept = ~skipped
            self._assert_rounded(name, wrote[kept].float(), read[kept], dtype)
        untouched = [b for b in range(num_blocks) if b not in table.tolist()]
        assert torch.isnan(cache[:, untouched].float()).all(), "blocks outside the table changed"
        tail = cache[:, int(table[3]), 3:].float()
        assert torch.isnan(tail).all(), "the partial block was written past its tokens"

    def _values(self, gen: torch.Generator, tokens: int, heads: int, dim: int,
                dtype: torch.dtype) -> torch.Tensor:
        """Normal values at several scales, and a few beyond an 8-bit float's range."""
        x = torch.randn(tokens, heads, dim, generator=gen)
        x *= torch.tensor([0.01, 1.0, 30.0])[torch.randint(0, 3, (tokens, heads, 1),
                                                            generator=gen)]
        if dtype.itemsize == 1:
            x[0, 0, :4] = torch.tensor([1e5, -1e5, 6e4, -7e4])
        return x

    def _assert_rounded(self, name: str, wrote: torch.Tensor, read: torch.Tensor,
                        dtype: torch.dtype) -> None:
        limit = float(torch.finfo(dtype).max)
        target = wrote.clamp(-limit, limit)
        if self.relative_tolerance is not None:
            bound = self.relative_tolerance * target.abs() + torch.finfo(dtype).smallest_normal
        else:
            bound = rounding_bound(target, dtype)
        err = (read - target).abs()
        bad = err > bound
        assert not bad.any(), (
            f"{name}: {int(bad.sum())} element(s) read back beyond the codec's rounding in "
            f"{dtype}, e.g. wrote {float(wrote[bad][0])}, read {float(read[bad][0])}")

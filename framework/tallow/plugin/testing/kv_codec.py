"""The KV-codec suite: the layout a codec states, and what its reference ``encode`` and
``decode`` do to K and V in a cache the core allocates from that layout.

::

    class TestMyCodec(KVCodecConformance):
        distribution = "tallow-kvcache-mine"
        component = "mine"
        vector_tolerance = 0.27  # what the codec promises (see below)

K/V are written the way every step writes them: scattered over shuffled blocks at
``slot_mapping``, partial blocks, rows with slot -1 skipped, into a layer cache allocated by
:func:`tallow.kernels.kv_cache.allocate_layer` whose paged tensors are poisoned first (NaN, or
0xFF bytes where the dtype has no NaN); then read back through :meth:`~tallow.plugin.KVCodec.
decode` of the blocks of a block table. What was read must be what was written, up to what
the codec promises, stated by one of:

- nothing, for a codec that casts each element into one storage dtype and says which
  (``storage_dtype(model_dtype)``, as :class:`tallow.kernels.kv_cast.CastKVCodec` does): every
  element rounded to nearest in it (values beyond an 8-bit float's largest finite magnitude
  saturate to it);
- :attr:`KVCodecConformance.relative_tolerance` (and :attr:`~KVCodecConformance.
  absolute_tolerance`): a bound per element, ``|read - wrote| <= rel * |wrote| + abs``;
- :attr:`KVCodecConformance.vector_tolerance`: a bound per head vector, for codecs that
  quantize a vector together (one scale per token and head):
  ``||read - wrote|| <= tol * ||wrote||``.

The suite also checks that ``encode`` touches nothing but the slots it is given (other blocks,
the rest of a partial block, the per-layer tensors), that a block copied for copy-on-write
(:func:`tallow.kernels.kv_cache.copy_blocks`) reads back the same, the layout's bytes against
the bits the codec states, and, for a codec that calibrates (``calibrated``), that its
``calibrate`` on a model's K/V keeps the round trip within the same promise over the whole
set (``||read - wrote|| <= tol * ||wrote||``; the promise of a casting codec is its dtype's
half unit in the last place, relative). :attr:`KVCodecConformance.settings` builds the codec
with its plugin's settings.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import pytest
import torch

from tallow.kernels import kv_cache
from tallow.kernels.kv_cache import LayerKVCache, allocate_layer, copy_blocks, footprint

from ..components import KVCodec, KVTensor
from ..selection import select
from . import make_config
from ..manager import PluginManager
from ..registry import Entry
from .component import ComponentConformance


def rounding_bound(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per element of ``x`` (float32), the largest error of rounding it to nearest in
    ``dtype``: half a unit in the last place, at least half the smallest subnormal."""
    info = torch.finfo(dtype)
    mag = x.abs().clamp_min(info.smallest_normal)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    return torch.maximum(ulp / 2, torch.full_like(ulp, info.smallest_normal * info.eps / 2))


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes (uint8, one more dimension of ``itemsize``): NaN compares equal to
    itself this way, and every dtype the same way."""
    t = tensor.contiguous()
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def poison(cache: LayerKVCache) -> None:
    """Fill every paged tensor of ``cache`` (a LayerKVCache) with NaN, or with 0xFF bytes
    where its dtype has no NaN, so that what no store wrote stands out."""
    for tensor in cache.paged():
        if tensor.dtype.is_floating_point:
            tensor.fill_(float("nan"))
        else:
            kv_cache.indexable(tensor).view(torch.uint8).fill_(0xFF)


class _Layer:
    """The attention layer a test cache serves (what codecs read from ``cache.layer``)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.layer_index = 0
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.sliding_window = None
        self.logit_softcap = None
        self.causal = True


class KVCodecConformance(ComponentConformance):
    registry_kind = "kv_codecs"
    base_class = KVCodec

    #: model dtypes the codec is checked for
    model_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    #: head sizes the codec is checked at (one a power of two, one not)
    head_dims: ClassVar[tuple[int, ...]] = (64, 80)
    #: per element: ``|read - wrote| <= relative_tolerance * |wrote| + absolute_tolerance``
    relative_tolerance: ClassVar[float | None] = None
    absolute_tolerance: ClassVar[float] = 0.0
    #: per head vector: ``||read - wrote|| <= vector_tolerance * ||wrote||``
    vector_tolerance: ClassVar[float | None] = None
    #: the codec's plugin settings (``plugins.settings.<distribution>``)
    settings: ClassVar[dict[str, Any]] = {}
    num_kv_heads: ClassVar[int] = 2
    block_size: ClassVar[int] = 8

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "model_dtype" in metafunc.fixturenames:
            metafunc.parametrize("model_dtype", self.model_dtypes, ids=str)
        if "head_dim" in metafunc.fixturenames:
            metafunc.parametrize("head_dim", self.head_dims)

    @pytest.fixture(scope="class")
    def codec(self, component_class: type[KVCodec]) -> KVCodec:
        config = make_config(
            {"plugins": {"settings": {self.distribution: dict(self.settings)}}}
            if self.settings
            else None
        )
        return component_class(config)

    def layout(self, codec: KVCodec, head_dim: int, model_dtype: torch.dtype) -> list[KVTensor]:
        return kv_cache.layer_layout(
            codec,
            num_kv_heads=self.num_kv_heads,
            head_dim=head_dim,
            block_size=self.block_size,
            model_dtype=model_dtype,
        )

    def allocate(
        self, codec: KVCodec, head_dim: int, model_dtype: torch.dtype, num_blocks: int
    ) -> LayerKVCache:
        cache = allocate_layer(
            codec,
            num_kv_heads=self.num_kv_heads,
            head_dim=head_dim,
            block_size=self.block_size,
            num_blocks=num_blocks,
            model_dtype=model_dtype,
            layer=_Layer(2 * self.num_kv_heads, self.num_kv_heads, head_dim),
        )
        poison(cache)
        return cache

    # -- what the codec states ---------------------------------------------------------------
    def test_selected_by_name(self, plugin_manager: PluginManager) -> None:
        config = make_config({"cache": {"kv_codec": self.component}})
        assert (
            select(plugin_manager.registries.kv_codecs, config, self.component).name
            == self.component
        )

    def test_layout_is_valid(self, codec: KVCodec, model_dtype: torch.dtype, head_dim: int) -> None:
        """The core accepts the layout (unique names, torch dtypes, positive sizes, a paged
        tensor), and the paged tensors start with the block's tokens."""
        for spec in self.layout(codec, head_dim, model_dtype):
            if spec.per_block:
                assert spec.shape[0] == self.block_size, (
                    f"paged tensor {spec.name!r} has block shape {spec.shape}: a block's "
                    f"tensors start with its {self.block_size} tokens"
                )

    def test_bytes_cover_the_stated_bits(self, codec: KVCodec, entry: Entry, head_dim: int) -> None:
        """``bits_per_element`` is what the registration lists, and the paged tensors hold at
        least that many bits per K and V element (scales come on top)."""
        bits = codec.bits_per_element
        assert bits > 0, f"bits_per_element is {bits!r}"
        listed = entry.meta.get("bits")
        assert listed is None or listed == bits, (
            f"registered with bits={listed}, the codec states bits_per_element={bits}"
        )
        for dtype in self.model_dtypes:
            cost = footprint(
                codec,
                [_Layer(2 * self.num_kv_heads, self.num_kv_heads, head_dim)],
                block_size=self.block_size,
                model_dtype=dtype,
            )
            nominal = listed if listed is not None else 8 * dtype.itemsize
            elements = 2 * self.num_kv_heads * head_dim
            assert cost.bytes_per_token * 8 >= nominal * elements, (
                f"{cost.bytes_per_token} bytes per token for {elements} K/V elements of "
                f"{nominal} bits (model dtype {dtype})"
            )

    def test_ignores_absent_checkpoint_scales(self, codec: KVCodec) -> None:
        """The engine hands every layer its checkpoint's KV scales, an empty mapping for a
        checkpoint without them; with its default settings a codec takes that."""
        if self.settings:
            pytest.skip("the codec runs with settings of its own, which may ask for scales")
        cache = self.allocate(codec, self.head_dims[0], self.model_dtypes[0], 2)
        before = {n: raw_bytes(t).clone() for n, t in cache.tensors.items()}
        codec.use_checkpoint_scales(cache, {})
        for name, tensor in cache.tensors.items():
            assert torch.equal(raw_bytes(tensor), before[name]), (
                f"use_checkpoint_scales({{}}) changed {name!r}"
            )

    # -- encode and decode -------------------------------------------------------------------
    def test_round_trip_through_scattered_partial_blocks(
        self, codec: KVCodec, model_dtype: torch.dtype, head_dim: int
    ) -> None:
        gen = torch.Generator().manual_seed(
            zlib.crc32(f"{self.component}{model_dtype}{head_dim}".encode())
        )
        bs, heads = self.block_size, self.num_kv_heads
        tokens = 3 * bs + 3  # three full blocks and a partial one
        num_blocks = 7
        # the last block never in the table: a write at slot -1 read as an index lands there
        table = torch.randperm(num_blocks - 1, generator=gen)[:4]
        cache = self.allocate(codec, head_dim, model_dtype, num_blocks)
        k = self._values(codec, gen, tokens, heads, head_dim, model_dtype)
        v = self._values(codec, gen, tokens, heads, head_dim, model_dtype)
        slots = table[torch.arange(tokens) // bs] * bs + torch.arange(tokens) % bs
        skipped = torch.zeros(tokens, dtype=torch.bool)
        skipped[[2, bs + 1]] = True  # padding rows: slot -1, nothing stored
        slots = torch.where(skipped, torch.full_like(slots, -1), slots)
        before = {n: raw_bytes(t).clone() for n, t in cache.tensors.items()}
        order = torch.randperm(tokens, generator=gen)  # a store cannot depend on row order
        codec.encode(cache, k[order], v[order], slots[order])

        read_k, read_v = codec.decode(cache, table)
        for name, wrote, read in (("K", k, read_k), ("V", v, read_v)):
            assert read.dtype == torch.float32, f"decode gave {name} as {read.dtype}"
            assert tuple(read.shape) == (4 * bs, heads, head_dim), (
                f"decode of 4 blocks gave {name} of shape {tuple(read.shape)}"
            )
            kept = (~skipped).nonzero().flatten()
            self._assert_within_promise(codec, name, wrote[kept].float(), read[kept], model_dtype)
        untouched = [b for b in range(num_blocks) if b not in table.tolist()]
        tail = int(table[3]), slice(3, None)  # the partial block past its three tokens
        for spec in cache.layout:
            now, was = raw_bytes(cache[spec.name]), before[spec.name]
            if not spec.per_block:
                assert torch.equal(now, was), f"encode changed the per-layer tensor {spec.name!r}"
                continue
            for where, index in (
                ("blocks outside the table", untouched),
                ("the rest of the partial block", tail),
            ):
                assert torch.equal(now[index], was[index]), (
                    f"encode wrote {spec.name!r} in {where} (rows with slot -1 store nothing)"
                )

    def test_copied_block_reads_the_same(self, codec: KVCodec) -> None:
        """Copy-on-write copies a block's paged tensors; every token's state must live there."""
        head_dim, dtype = self.head_dims[0], self.model_dtypes[0]
        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.component}cow".encode()))
        cache = self.allocate(codec, head_dim, dtype, 4)
        n = self.block_size
        k = self._values(codec, gen, n, self.num_kv_heads, head_dim, dtype)
        v = self._values(codec, gen, n, self.num_kv_heads, head_dim, dtype)
        codec.encode(cache, k, v, torch.arange(n) + n)  # block 1
        copy_blocks([cache], torch.tensor([1]), torch.tensor([3]))
        for a, b in zip(
            codec.decode(cache, torch.tensor([1])), codec.decode(cache, torch.tensor([3]))
        ):
            assert torch.equal(a, b), "a block copied for copy-on-write reads back differently"

    def test_calibration_keeps_the_round_trip(self, codec: KVCodec) -> None:
        """A codec that calibrates derives its per-layer tensors from a model's Q/K/V before
        anything is stored. Keys here carry a large constant per channel (as Qwen2's key
        biases give) that calibration is there to take out of the quantization: after
        ``calibrate``, K/V of the same kind read back within the codec's promise relative to
        how they vary around their mean (``||read - wrote|| <= tol * ||wrote - mean||``).
        A codec that does not calibrate is never calibrated by the engine, so its
        ``calibrate`` must leave the cache as it was."""
        head_dim, dtype = self.head_dims[0], self.model_dtypes[0]
        if not codec.calibrated:
            cache = self.allocate(codec, head_dim, dtype, 4)
            # bytes, not values: the allocation is poisoned with NaNs
            before = {name: t.clone() for name, t in cache.tensors.items()}
            n = 2 * self.block_size
            codec.calibrate(
                cache,
                torch.randn(n, 2 * self.num_kv_heads, head_dim),
                torch.randn(n, self.num_kv_heads, head_dim),
                torch.randn(n, self.num_kv_heads, head_dim),
            )
            for name, t in cache.tensors.items():
                same = torch.equal(
                    t.contiguous().view(-1).view(torch.uint8),
                    before[name].contiguous().view(-1).view(torch.uint8),
                )
                assert same, (
                    f"kv codec {self.component!r} does not set `calibrated`, yet its calibrate "
                    f"changed the cache's {name!r}"
                )
            return
        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.component}calib".encode()))
        heads, n = self.num_kv_heads, 4 * self.block_size
        bias = 8 * torch.randn(heads, head_dim, generator=gen)
        k = (torch.randn(2 * n, heads, head_dim, generator=gen) + bias).to(dtype).float()
        v = torch.randn(2 * n, heads, head_dim, generator=gen).to(dtype).float()
        q = torch.randn(n, 2 * heads, head_dim, generator=gen)
        cache = self.allocate(codec, head_dim, dtype, 4)
        codec.calibrate(cache, q, k[:n], v[:n])
        codec.encode(cache, k[n:].to(dtype), v[n:].to(dtype), torch.arange(n))
        read = codec.decode(cache, torch.arange(4))
        tol = self._set_tolerance(codec, dtype)
        for name, wrote, got in (("K", k[n:], read[0]), ("V", v[n:], read[1])):
            spread = (wrote - wrote.mean(dim=0)).norm()
            rel = float((got - wrote).norm() / spread)
            assert rel <= tol, (
                f"after calibrate, {name} reads back with an error of {rel:.3g} "
                f"of its spread around the mean, more than the codec's {tol:.3g}"
            )

    # -- helpers -----------------------------------------------------------------------------
    def _values(
        self,
        codec: KVCodec,
        gen: torch.Generator,
        tokens: int,
        heads: int,
        dim: int,
        model_dtype: torch.dtype,
    ) -> torch.Tensor:
        """Normal head vectors at several scales (in the model's dtype); for a codec casting
        into an 8-bit float, a few values beyond its range."""
        x = torch.randn(tokens, heads, dim, generator=gen)
        x *= torch.tensor([0.01, 1.0, 30.0])[torch.randint(0, 3, (tokens, heads, 1), generator=gen)]
        storage = self._storage(codec, model_dtype)
        if storage is not None and storage.itemsize == 1:
            x[0, 0, :4] = torch.tensor([1e5, -1e5, 6e4, -7e4])
        return x.to(model_dtype)

    @staticmethod
    def _storage(codec: KVCodec, model_dtype: torch.dtype) -> torch.dtype | None:
        storage = getattr(codec, "storage_dtype", None)
        return storage(model_dtype) if callable(storage) else None

    def _assert_within_promise(
        self,
        codec: KVCodec,
        name: str,
        wrote: torch.Tensor,
        read: torch.Tensor,
        model_dtype: torch.dtype,
    ) -> None:
        if self.vector_tolerance is not None:
            err = (read - wrote).norm(dim=-1)
            bound = self.vector_tolerance * wrote.norm(dim=-1) + self.absolute_tolerance
            bad = ~(err <= bound)
            assert not bad.any(), (
                f"{name}: {int(bad.sum())} head vector(s) read back beyond the codec's "
                f"{self.vector_tolerance} relative error, e.g. {float((err / wrote.norm(dim=-1))[bad][0]):.3g}"
            )
            return
        if self.relative_tolerance is not None:
            target = wrote
            bound = self.relative_tolerance * target.abs() + self.absolute_tolerance
            what = f"the codec's relative error {self.relative_tolerance}"
        else:
            storage = self._storage(codec, model_dtype)
            if storage is None:
                raise AssertionError(
                    f"{type(self).__name__}: kv codec {self.component!r} does not cast into "
                    "one storage dtype (storage_dtype); state what it promises with "
                    "relative_tolerance or vector_tolerance"
                )
            limit = float(torch.finfo(storage).max)
            target = wrote.clamp(-limit, limit)
            bound = rounding_bound(target, storage)
            what = f"rounding to nearest in {storage}"
        err = (read - target).abs()
        bad = ~(err <= bound)
        assert not bad.any(), (
            f"{name}: {int(bad.sum())} element(s) read back beyond {what}, e.g. wrote "
            f"{float(wrote[bad][0])}, read {float(read[bad][0])}"
        )

    def _set_tolerance(self, codec: KVCodec, model_dtype: torch.dtype) -> float:
        """The promise as a bound on ``||read - wrote|| / ||wrote||`` over a set of vectors."""
        if self.vector_tolerance is not None:
            return self.vector_tolerance
        if self.relative_tolerance is not None:
            return self.relative_tolerance
        storage = self._storage(codec, model_dtype)
        if storage is None:
            raise AssertionError(
                f"{type(self).__name__}: state relative_tolerance or vector_tolerance"
            )
        return float(torch.finfo(storage).eps) / 2

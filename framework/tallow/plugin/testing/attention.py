"""The attention-backend suite: the backend against the core's torch reference on random
prefill, decode, chunked-prefill, prefix-hit, bidirectional (encoder) and padded steps, latent
attention (MLA) and KV-sharing layers when it declares them, and with
each KV codec it declares (its layout accepted, a step stored as the codec's reference stores
it, attention over that cache as the reference's).

::

    class TestMyBackend(AttentionBackendConformance):
        distribution = "tallow-myattn"
        component = "myattn"
        kv_codecs = ("auto", "fp8")

It runs on a CPU when the backend's ``validate`` accepts ``model.device: cpu``, else on a CUDA
GPU, else it is skipped with "needs a CUDA GPU". Set
:attr:`AttentionBackendConformance.run_on` to force a device (a Triton backend under
``TRITON_INTERPRET=1`` runs on CPU tensors).
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import torch

from tallow.kernels import kv_cache

from ..components import AttentionBackend, KVCodec
from ..manager import load_plugins
from . import make_config
from .component import ComponentConformance, load_target
from .mla_step import check_mla_step, random_mla_step
from .paged_batch import check_step, output_tolerance, random_paged_step

if TYPE_CHECKING:
    from tallow.config import TallowConfig


class AttentionBackendConformance(ComponentConformance):
    registry_kind = "attention_backends"
    base_class = AttentionBackend

    #: activation dtypes of the checks
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    num_heads: ClassVar[int] = 4
    num_kv_heads: ClassVar[int] = 2
    head_dim: ClassVar[int] = 64
    block_size: ClassVar[int] = 16
    #: KV codecs (registered names) the backend serves; each is exercised
    kv_codecs: ClassVar[tuple[str, ...]] = ("auto",)
    #: codecs whose store the backend computes its own way (a fused kernel that rounds
    #: otherwise than the codec's reference): the bound on the relative difference of the
    #: decoded caches (:func:`~tallow.plugin.testing.paged_batch.assert_close_decoded`);
    #: every other codec's cache must be the reference's bit for bit
    kv_codec_store_tolerance: ClassVar[dict[str, float]] = {}
    #: codecs whose path through the backend rounds more than a plain cache's (queries or
    #: outputs transformed in the activations' dtype): a factor on the output tolerance
    kv_codec_output_scale: ClassVar[dict[str, float]] = {}
    #: the backend's plugin settings (``plugins.settings.<distribution>``)
    settings: ClassVar[dict[str, Any]] = {}
    #: "cpu" or "cuda" to force the device; None: decided from ``validate`` (module docstring)
    run_on: ClassVar[str | None] = None

    def config(self, device: str) -> TallowConfig:
        data: dict[str, Any] = {
            "model": {"device": device},
            "cache": {"block_size": self.block_size},
        }
        if self.settings:
            data["plugins"] = {"settings": {self.distribution: dict(self.settings)}}
        return make_config(data)

    @pytest.fixture(scope="class")
    def device(self, component_class: type[AttentionBackend]) -> str:
        if self.run_on is not None:
            return self.run_on
        cpu_reasons = component_class.validate(self.config("cpu"))
        if not cpu_reasons:
            return "cpu"
        if torch.cuda.is_available():
            return "cuda"
        pytest.skip("needs a CUDA GPU (on a CPU: " + "; ".join(cpu_reasons) + ")")

    @pytest.fixture(scope="class")
    def backend(self, component_class: type[AttentionBackend], device: str) -> AttentionBackend:
        return component_class(self.config(device))

    def check(
        self, backend: AttentionBackend, device: str, dtype: torch.dtype, name: str, **shape: Any
    ) -> torch.Tensor:  # Any: random_paged_step's keywords, of several types
        seed = zlib.crc32(f"{type(self).__name__}/{name}/{dtype}".encode())
        step = random_paged_step(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=self.block_size,
            dtype=dtype,
            device=device,
            seed=seed,
            **shape,
        )
        return check_step(step, backend)

    def test_validate_gives_reasons_as_text(self, component_class: type[AttentionBackend]) -> None:
        for device in ("cpu", "auto"):
            reasons = component_class.validate(self.config(device))
            assert isinstance(reasons, list) and all(isinstance(r, str) and r for r in reasons), (
                reasons
            )

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", self.dtypes, ids=str)
        if "codec_name" in metafunc.fixturenames:
            metafunc.parametrize("codec_name", self.kv_codecs)

    def test_prefill(self, backend: AttentionBackend, device: str, dtype: torch.dtype) -> None:
        """Whole prompts, one spanning several blocks and ending inside one."""
        bs = self.block_size
        self.check(
            backend, device, dtype, "prefill", query_lens=[3, 2 * bs + 5, 1], context_lens=[0, 0, 0]
        )

    def test_decode(self, backend: AttentionBackend, device: str, dtype: torch.dtype) -> None:
        """One query per sequence over contexts from empty to several blocks."""
        bs = self.block_size
        contexts = [0, 1, bs - 1, bs, 3 * bs + 2]
        self.check(
            backend, device, dtype, "decode", query_lens=[1] * len(contexts), context_lens=contexts
        )

    def test_chunked_prefill_beside_decodes(self, backend: AttentionBackend, device: str) -> None:
        """Later chunks of prompts (context already cached) in the same step as decodes."""
        bs = self.block_size
        self.check(
            backend,
            device,
            self.dtypes[0],
            "chunked",
            query_lens=[bs + 3, 1, 7, 1],
            context_lens=[bs + 4, 2 * bs, 2 * bs - 1, 5],
        )

    def test_prefix_hit(self, backend: AttentionBackend, device: str) -> None:
        """Sequences whose first blocks are one shared cached prefix."""
        bs = self.block_size
        self.check(
            backend,
            device,
            self.dtypes[0],
            "prefix",
            query_lens=[1, 5, bs + 1],
            context_lens=[2 * bs + 3, 2 * bs, 2 * bs + 7],
            shared_prefix_blocks=2,
        )

    def test_bidirectional_layer(self, backend: AttentionBackend, device: str) -> None:
        """An encoder layer (``causal=False``): whole sequences, every query over all of its
        sequence's keys — or, for a backend that cannot, a refusal with reasons before any
        step (``supports_layer``), so that the engine picks another backend."""
        bs = self.block_size
        step = random_paged_step(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=bs,
            dtype=self.dtypes[0],
            device=device,
            query_lens=[bs + 5, 1, 2 * bs],
            context_lens=[0, 0, 0],
            causal=False,
            seed=zlib.crc32(type(self).__name__.encode()),
        )
        if _refused(backend, step.layer):
            return
        check_step(step, backend)

    def test_attention_sinks(self, backend: AttentionBackend, device: str) -> None:
        """A layer with attention sinks (gpt-oss: a learned logit per query head in every
        softmax's denominator), with and without a sliding window, over prefills, chunks and
        decodes — or, for a backend that cannot add them, a refusal with reasons before any
        step (``supports_layer``), so that the engine picks another backend."""
        bs = self.block_size
        gen = torch.Generator().manual_seed(zlib.crc32(b"sinks"))
        # sinks around the scores' scale: some heads keep most of their weight, some little
        sinks = torch.randn(self.num_heads, generator=gen) * 2.0
        for window in (None, bs // 2 + 1):
            step = random_paged_step(
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim,
                block_size=bs,
                dtype=self.dtypes[0],
                device=device,
                query_lens=[bs + 3, 1, 5, 1],
                context_lens=[0, 2 * bs, bs, 0],
                sliding_window=window,
                sinks=sinks,
                seed=zlib.crc32(f"{type(self).__name__}/sinks/{window}".encode()),
            )
            if _refused(backend, step.layer):
                return
            check_step(step, backend)

    def test_chunked_local_attention(self, backend: AttentionBackend, device: str) -> None:
        """A layer with chunked local attention (Llama 4: each query sees only the keys of its
        own ``attention_chunk_size``-token chunk) over a whole prompt across several chunks, a
        chunked prefill starting inside a chunk, and decodes at a chunk's first and last
        position, for a backend that sets ``supports_chunked_attention`` (the engine gives
        chunked layers to no other backend, so there is nothing to check then)."""
        if not getattr(backend, "supports_chunked_attention", False):
            return
        bs = self.block_size
        chunk = bs // 2 + 3  # not a multiple of the block size: chunks and blocks disagree
        step = random_paged_step(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=bs,
            dtype=self.dtypes[0],
            device=device,
            query_lens=[3 * chunk + 2, chunk + 4, 1, 1, 1],
            context_lens=[0, chunk - 2, chunk, 2 * chunk - 1, 4 * chunk + 5],
            attention_chunk_size=chunk,
            seed=zlib.crc32(f"{type(self).__name__}/chunked".encode()),
        )
        if _refused(backend, step.layer):
            return
        check_step(step, backend)

    def test_kv_sharing_layer(
        self, backend: AttentionBackend, device: str, dtype: torch.dtype
    ) -> None:
        """A backend that sets ``supports_kv_sharing``: after a layer stored a step (decodes
        beside a chunk, under a window), a layer with ``kv_shared_from`` set attends over that
        cache with its own queries, scale and softcap as the reference does, and leaves every
        cache byte as it was (its ``k``/``v`` are zero-strided placeholders). The engine gives
        a backend without it no such model, so there is nothing to check then."""
        if not getattr(backend, "supports_kv_sharing", False):
            return
        bs = self.block_size
        step = random_paged_step(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=bs,
            dtype=dtype,
            device=device,
            query_lens=[1, bs + 3, 1],
            context_lens=[2 * bs + 1, bs, 5],
            sliding_window=bs + 2,
            seed=zlib.crc32(f"{type(self).__name__}/kv-sharing/{dtype}".encode()),
        )
        check_step(step, backend)  # the source layer stores the step
        before = [t.clone() for t in step.kv_cache.paged()]
        heads = 2 * self.num_heads
        shared = replace(
            step.layer,
            layer_index=step.layer.layer_index + 1,
            num_heads=heads,
            scale=0.5 * step.layer.scale,
            logit_softcap=4.0,
            kv_shared_from=step.layer.layer_index,
        )
        gen = torch.Generator().manual_seed(zlib.crc32(b"kv-sharing-queries"))
        n = step.q.shape[0]
        q = torch.randn(n, heads, self.head_dim, generator=gen).to(dtype).to(device)
        placeholder = q.new_zeros(()).expand(n, self.num_kv_heads, self.head_dim)
        out = backend.forward(shared, q, placeholder, placeholder, step.kv_cache, step.meta)
        for old, new in zip(before, step.kv_cache.paged()):
            assert torch.equal(old.view(torch.uint8), new.view(torch.uint8)), (
                f"a KV-sharing layer changed the cache ({step.description})"
            )
        view = replace(step, layer=shared, q=q)
        torch.testing.assert_close(
            out[: step.valid_rows].cpu(),
            view.reference_output(step.kv_cache).cpu(),
            **output_tolerance(dtype),
            msg=lambda m: f"KV-sharing layer output differs ({step.description}): {m}",
        )

    def test_padding_rows_store_nothing(self, backend: AttentionBackend, device: str) -> None:
        """Rows with slot -1 (a padded batch) leave the cache alone."""
        self.check(
            backend,
            device,
            self.dtypes[0],
            "padding",
            query_lens=[1, 1],
            context_lens=[5, 9],
            padding_rows=3,
        )

    def test_latent_attention(
        self, backend: AttentionBackend, device: str, dtype: torch.dtype
    ) -> None:
        """A backend that sets ``supports_mla`` stores a step's latent rows as
        ``store_latent_ref`` does and attends as ``mla_attention_ref`` over decodes (20 heads:
        more than one block of 16), prefix-cached chunks, a whole prompt and padding rows;
        one that does not says so by raising NotImplementedError."""
        bs = self.block_size
        step = random_mla_step(
            query_lens=[1, bs + 3, 1, 6],
            context_lens=[2 * bs + 1, bs, 0, 0],
            num_heads=20,
            block_size=bs,
            dtype=dtype,
            device=device,
            padding_rows=2,
            seed=zlib.crc32(f"{type(self).__name__}/mla/{dtype}".encode()),
        )
        if not getattr(backend, "supports_mla", False):
            with pytest.raises(NotImplementedError):
                backend.forward_mla(
                    step.layer,
                    step.q_nope,
                    step.q_pe,
                    step.latent,
                    step.cache,
                    step.w_uk,
                    step.w_uv,
                    step.meta,
                )
            return
        check_mla_step(step, backend)
        decode = random_mla_step(
            query_lens=[1] * 4,
            context_lens=[0, 3, bs, 5 * bs + 2],
            num_heads=20,
            block_size=bs,
            dtype=dtype,
            device=device,
            padding_rows=1,
            seed=zlib.crc32(f"mla-decode/{dtype}".encode()),
        )
        check_mla_step(decode, backend)

    def test_kv_codec(self, backend: AttentionBackend, device: str, codec_name: str) -> None:
        """Each declared codec is accepted for its layout, stores a step as the codec's
        reference ``encode`` does (bit for bit, or within :attr:`kv_codec_store_tolerance`),
        and attends over what it stored as the torch reference does over the same cache."""
        name = codec_name
        codec = kv_codec(name)
        dtype = self.dtypes[-1]
        layout = kv_cache.layer_layout(
            codec,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=self.block_size,
            model_dtype=dtype,
        )
        reasons = backend.supports_kv_codec(codec, layout)
        assert reasons == [], f"declared kv codec {name!r} is refused: {reasons}"
        bs = self.block_size
        step = random_paged_step(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=bs,
            dtype=dtype,
            device=device,
            codec=codec,
            query_lens=[1, bs + 2, 1],
            context_lens=[bs + 1, 3, 0],
            seed=zlib.crc32(f"{type(self).__name__}/codec-{name}".encode()),
        )
        check_step(
            step,
            backend,
            store_tolerance=self.kv_codec_store_tolerance.get(name),
            output_scale=self.kv_codec_output_scale.get(name, 1.0),
        )


def _refused(backend: AttentionBackend, layer: Any) -> bool:
    """Whether ``backend`` refuses ``layer`` through ``supports_layer`` (its reasons must be
    text), so that a case the engine would never give it is not run."""
    supports = getattr(backend, "supports_layer", None)
    reasons = supports(layer) if supports is not None else []
    assert all(isinstance(r, str) and r for r in reasons), reasons
    return bool(reasons)


def kv_codec(name: str) -> KVCodec:
    """An instance of the KV codec registered as ``name`` by any installed plugin (or the
    core)."""
    pm = load_plugins(None, env={})
    if name not in pm.registries.kv_codecs:
        installed = ", ".join(e.name for e in pm.registries.kv_codecs)
        raise AssertionError(
            f"no installed plugin registers kv codec {name!r} (installed: {installed})"
        )
    codec = load_target(pm.registries.kv_codecs.entry(name))()
    assert isinstance(codec, KVCodec), f"kv codec {name!r} is not a KVCodec: {codec!r}"
    return codec

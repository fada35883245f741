"""Which KV codec and which attention backend serve a model: the codec ``cache.kv_codec``
names, and the backend by priority (or ``runner.attention_backend``) among those that accept
the model's attention layers and that codec, with each refusal's reasons."""

from __future__ import annotations

from tallow.config import TallowConfig
from tallow.kernels import kv_cache
from tallow.layers import MLAAttention, shared_kv_layers
from tallow.plugin import Entry, Registries, SelectionError, select
from tallow.types import AttentionBackend, AttentionLayer, KVCodec, KVTensor

from .cache_groups import find_cache_groups
from .loader import LoadedModel
from .model_runner import kv_layers

__all__ = ["backend_refusals", "describe_layout", "select_attention_backend", "select_kv_codec"]


def select_kv_codec(registries: Registries, config: TallowConfig) -> Entry:
    """The entry of the KV codec ``cache.kv_codec`` asks for; errors name that field."""
    try:
        return select(registries.kv_codecs, config, config.cache.kv_codec)
    except SelectionError as exc:
        raise SelectionError(
            f"cache.kv_codec {config.cache.kv_codec!r}: {exc} (codecs other "
            "than auto come from kv-codec plugins)"
        ) from None


def backend_refusals(
    backend: AttentionBackend,
    layers: list[AttentionLayer],
    codec_name: str,
    codec: KVCodec,
    layout: list[KVTensor],
    num_paged_groups: int = 1,
    latent_layers: int = 0,
) -> list[str]:
    """Why ``backend`` (an instance) cannot run the attention ``layers`` of the model or keep
    K/V as ``codec`` does (``layout``: one layer's cache tensors); empty when it can. A model
    of several paged cache groups (sliding-window layers beside full ones) needs a backend
    that reads each layer's group view of the step (``supports_cache_groups``); one with
    ``latent_layers`` (MLA) a backend that has a latent path (``supports_mla``); KV-sharing
    layers among ``layers`` (``kv_shared_from``) a backend with ``supports_kv_sharing``;
    chunked layers (``attention_chunk_size``) one with ``supports_chunked_attention``."""
    reasons = []
    if latent_layers and not getattr(backend, "supports_mla", False):
        reasons.append(
            f"has no latent attention (MLA) path, which {latent_layers} layers of this model need"
        )
    sharing = [layer.layer_index for layer in layers if layer.kv_shared_from is not None]
    if sharing and not getattr(backend, "supports_kv_sharing", False):
        reasons.append(
            f"cannot run KV-sharing layers (attention over an earlier layer's cache), which "
            f"layers {sharing} of this model are"
        )
    chunked = [layer.layer_index for layer in layers if layer.attention_chunk_size]
    if chunked and not getattr(backend, "supports_chunked_attention", False):
        reasons.append(
            f"cannot run chunked local attention (each query over its own chunk), which "
            f"layers {chunked} of this model have"
        )
    if num_paged_groups > 1 and not getattr(backend, "supports_cache_groups", False):
        reasons.append(
            f"cannot run a model of {num_paged_groups} paged cache groups "
            "(layers with sliding windows beside full attention)"
        )
    check_layer = getattr(backend, "supports_layer", None)
    if check_layer is not None:
        problems = sorted({r for layer in layers for r in check_layer(layer)})
        if problems:
            reasons.append("cannot run this model: " + "; ".join(problems))
    check_codec = getattr(backend, "supports_kv_codec", None)
    # a model of latent layers only keeps no K/V: the codec matters through latent_dtype
    problems = check_codec(codec, layout) if check_codec is not None and layers else []
    if problems:
        reasons.append(
            f"cannot use kv codec {codec_name!r} (cache.kv_codec; "
            f"{describe_layout(layout)}): " + "; ".join(problems)
        )
    return reasons


def describe_layout(layout: list[KVTensor]) -> str:
    """``k, v: float8_e4m3fn`` — a layer's cache tensors by dtype, for messages."""
    by_dtype: dict[str, list[str]] = {}
    for spec in layout:
        by_dtype.setdefault(str(spec.dtype).removeprefix("torch."), []).append(spec.name)
    return "; ".join(f"{', '.join(names)}: {dtype}" for dtype, names in by_dtype.items())


def select_attention_backend(
    registries: Registries,
    config: TallowConfig,
    loaded: LoadedModel,
    codec_name: str,
    codec: KVCodec,
    block_size: int,
    sliding_groups: bool = True,
) -> tuple[Entry, AttentionBackend]:
    """(entry, instance) of the attention backend that serves ``config``, the loaded model and
    the chosen KV codec. Automatically, a backend that refuses the model or the codec is passed
    over for the next by priority; one named in ``runner.attention_backend`` that refuses stops
    start-up with its reasons (:class:`SelectionError`)."""
    # the layers that keep a cache, then those that read another layer's (KV sharing)
    layers = [a.layer for a in kv_layers(loaded.model)]
    layers += [s.layer for s in shared_kv_layers(loaded.model)]
    num_paged = sum(
        1 for g in find_cache_groups(loaded.model, sliding_groups=sliding_groups) if g.paged
    )
    # one cache layout per distinct layer shape: layers of two head sizes (Gemma 4's sliding
    # and full layers) keep caches the codec lays out differently, and each must be accepted
    shapes = sorted({(layer.num_kv_heads, layer.head_dim) for layer in layers}) or [(1, 64)]
    layouts = [
        kv_cache.layer_layout(
            codec,
            num_kv_heads=heads,
            head_dim=head_dim,
            block_size=block_size,
            model_dtype=loaded.dtype,
        )
        for heads, head_dim in shapes
    ]
    made: dict[str, AttentionBackend] = {}
    latent = sum(1 for m in loaded.model.modules() if isinstance(m, MLAAttention))

    def refusals(entry: Entry) -> list[str]:
        # Refusals are answered by an instance (it may depend on the backend's settings); the
        # chosen one is kept so that the backend is built only once.
        made[entry.name] = backend = entry.load()(config)
        reasons: list[str] = []
        for layout in layouts:
            for reason in backend_refusals(
                backend, layers, codec_name, codec, layout, num_paged, latent
            ):
                if reason not in reasons:
                    reasons.append(reason)
        return reasons

    entry = select(
        registries.attention_backends, config, config.runner.attention_backend, check=refusals
    )
    return entry, made[entry.name]

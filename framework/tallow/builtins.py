"""Components that ship inside the core, registered through the same hooks as any plugin."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_attention_backends(registry) -> None:
    # The reference backend: lowest priority, so any faster compatible backend wins.
    registry.register("torch", "tallow.layers.torch_attention:TorchAttentionBackend", priority=-100)


@hookimpl
def tallow_register_kv_codecs(registry) -> None:
    registry.register("auto", "tallow.kernels.kv_cast:AutoKVCodec", bits=None)


@hookimpl
def tallow_register_weight_formats(registry) -> None:
    # Random weights of real shapes, for benchmarks: speed does not depend on weight values.
    registry.register("random", "tallow.engine.random_model:RandomWeights", priority=100)


@hookimpl
def tallow_register_speculators(registry) -> None:
    # A draft model run by the engine itself (speculative.method: draft).
    registry.register("draft", "tallow.engine.draft_model:DraftSpeculator")
    registry.register("mtp", "tallow.engine.mtp:MTPSpeculator")

"""Registration of the fp8 KV codecs (imports nothing heavy) and the check of the plugin's
settings at start-up."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_kv_codecs(registry) -> None:
    registry.register("fp8", "tallow_kvcache_fp8.codec:FP8E4M3KVCodec", bits=8)
    registry.register("fp8_e4m3", "tallow_kvcache_fp8.codec:FP8E4M3KVCodec", bits=8)
    registry.register("fp8_e5m2", "tallow_kvcache_fp8.codec:FP8E5M2KVCodec", bits=8)


@hookimpl
def tallow_configure(config) -> None:
    from .settings import fp8_settings

    fp8_settings(config)  # a bad setting stops start-up, naming its key

"""Registration of the turbo KV codecs (imports nothing heavy) and the check of the plugin's
settings at start-up."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_kv_codecs(registry) -> None:
    registry.register("turbo8", "tallow_kvcache_turboquant.codec:Turbo8KVCodec", bits=8)
    registry.register("turbo4", "tallow_kvcache_turboquant.codec:Turbo4KVCodec", bits=4)
    registry.register("turbo3", "tallow_kvcache_turboquant.codec:Turbo3KVCodec", bits=3)


@hookimpl
def tallow_configure(config) -> None:
    from .settings import turbo_settings

    turbo_settings(config)  # a bad setting stops start-up, naming its key

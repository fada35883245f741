"""Run the offline engine (:class:`tallow.LLM`) in-process with an explicit set of plugins."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..manager import load_plugins


def offline_llm(model: str, *, plugins: Sequence[str], config: Mapping[str, Any] | None = None
                ) -> Any:
    """A :class:`tallow.LLM` over ``model`` whose plugins are exactly the core and the installed
    distributions ``plugins``, each loaded through its entry point as ``tallow serve`` loads
    it (a failure stops here, naming the plugin). ``config`` holds further settings as nested
    mappings (``{"cache": {"num_blocks": 64}}``); the model runs on the CPU unless it names
    another device."""
    from tallow.engine.llm import LLM

    from . import make_config

    data: dict[str, Any] = {key: dict(value) for key, value in (config or {}).items()}
    data.setdefault("model", {}).setdefault("device", "cpu")
    data["model"]["source"] = model
    data["plugins"] = {**data.get("plugins", {}), "autoload": False, "enable": list(plugins)}
    settings = make_config(data)
    pm = load_plugins(settings.plugins, env={})
    pm.hook.tallow_configure(config=settings)
    # An explicit manager: LLM() would also read TALLOW_* and TALLOW_CONFIG from the caller.
    return LLM.from_config(settings, pm)

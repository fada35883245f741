"""The naming rule of plugin distributions, and the first-party ones renamed to follow it.

Every first-party plugin is distribution ``tallow-<kind>-<name>`` with module
``tallow_<kind>_<name>`` in folder ``plugins/<kind>/<name>``; :func:`kind_of` reads the kind
back from a name (``tallow plugins list`` groups by it).

A configuration that still names an old distribution (``plugins.enable``, ``disable``,
``require``, a ``plugins.settings`` key, ``TALLOW_PLUGINS``) is refused with the new name,
because plugins look their settings up by their current name and the old key would otherwise
be ignored without a word. An old distribution still installed beside its successor would
register the same components twice, so discovery leaves it out and says to uninstall it.
"""

from __future__ import annotations

from packaging.utils import canonicalize_name

#: the kinds of plugin, in the order ``tallow plugins list`` shows them
KINDS: tuple[str, ...] = (
    "model",
    "format",
    "quant",
    "kvcache",
    "attention",
    "grammar",
    "reasoning",
    "speculator",
    "tool",
    "mcp",
    "ui",
)
CORE_KIND = "core"
OTHER_KIND = "other"

#: old distribution name → the name it has now
RENAMED: dict[str, str] = {
    "tallow-gguf": "tallow-format-gguf",
    "tallow-hfhub": "tallow-format-hfhub",
    "tallow-safetensors": "tallow-format-safetensors",
    "tallow-mcp": "tallow-mcp-client",
    "tallow-glm4": "tallow-model-glm4",
    "tallow-granite": "tallow-model-granite",
    "tallow-llama": "tallow-model-llama",
    "tallow-olmo2": "tallow-model-olmo2",
    "tallow-phi3": "tallow-model-phi3",
}


def new_name(name: str) -> str | None:
    """The current name of the renamed distribution ``name`` (any spelling), else None."""
    return RENAMED.get(canonicalize_name(name))


def renamed_problems(where: str, names: list[str]) -> list[str]:
    """One message per old distribution name in ``names`` (read from the setting ``where``)."""
    return [
        f"{where} names {n}, which is now {new_name(n)}: use the new name"
        for n in names
        if new_name(n) is not None
    ]


def kind_of(name: str) -> str:
    """The kind of the distribution ``name``: ``core`` for tallow itself, the ``<kind>`` of
    ``tallow-<kind>-<name>``, else ``other`` (a plugin that does not follow the rule)."""
    parts = canonicalize_name(name).split("-")
    if parts == ["tallow"]:
        return CORE_KIND
    if len(parts) >= 3 and parts[0] == "tallow" and parts[1] in KINDS:
        return parts[1]
    return OTHER_KIND


def kind_order(kind: str) -> int:
    """Where ``kind`` comes in a listing grouped by kind: the core, the kinds, then others."""
    order = (CORE_KIND, *KINDS, OTHER_KIND)
    return order.index(kind) if kind in order else len(order)

"""Which plugin distributions are installed and which of them load: the first two steps of
loading plugins (:mod:`tallow.plugin.manager` does the third, and its docstring tells all
three).

1. *Discover* the entry points of the group ``tallow``, reading metadata only (nothing is
   imported): :func:`discover`.
2. *Plan*: decide from ``plugins: {autoload, enable, disable, require}`` and ``TALLOW_PLUGINS``
   which distributions load and whether their failure is fatal (:func:`plan_plugins`). A
   required distribution that is missing, of the wrong version, or excluded stops start-up
   here, before any import.
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .errors import PluginError
from .naming import new_name, renamed_problems

__all__ = [
    "CORE_DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "ENV_PLUGINS",
    "Candidate",
    "Plan",
    "canonical",
    "discover",
    "plan_plugins",
]

log = logging.getLogger("tallow.plugin")

ENTRY_POINT_GROUP = "tallow"
CORE_DISTRIBUTION = "tallow"
ENV_PLUGINS = "TALLOW_PLUGINS"


@dataclass(frozen=True)
class Candidate:
    """A discovered plugin distribution (not imported yet)."""

    name: str
    version: str
    entry_point: metadata.EntryPoint

    @property
    def label(self) -> str:
        return f"{self.entry_point.name} = {self.entry_point.value}"


def canonical(name: str) -> str:
    """PEP 503 form of a distribution name: ``Tallow_Llama`` and ``tallow-model-llama`` are one."""
    return canonicalize_name(name)


def discover(entry_points: Iterable[metadata.EntryPoint] | None = None) -> list[Candidate]:
    """The plugin distributions installed (or those of ``entry_points``), sorted by name.

    Reads metadata only. The core's own ``tallow`` entry, if any, is skipped (the core loads
    itself); a second entry point for a distribution already found is ignored with a warning.
    """
    if entry_points is None:
        entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    found: dict[str, Candidate] = {}
    for ep in entry_points:
        dist = getattr(ep, "dist", None)
        name = (dist.metadata["Name"] if dist is not None else None) or ep.name
        version = dist.version if dist is not None else ""
        if canonical(name) == CORE_DISTRIBUTION:
            continue
        if canonical(ep.name) != canonical(name):
            log.warning(
                "plugin entry point %r of distribution %s should be named %r", ep.name, name, name
            )
        if canonical(name) in found:
            log.warning("plugin %s: ignoring a second entry point %s = %s", name, ep.name, ep.value)
            continue
        found[canonical(name)] = Candidate(name, version, ep)
    for old in [n for n in found if new_name(n) in found]:
        # the same plugin under its old name: both would register the same components
        log.warning(
            "plugin %s is the old name of %s, which is installed too; ignoring %s "
            "(pip uninstall %s)",
            old,
            new_name(old),
            old,
            old,
        )
        del found[old]
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class Plan:
    """For each candidate: the mode it loads in (None: not loaded) and why; ``advice`` says,
    per canonical name of one left out, how to load it."""

    items: list[tuple[Candidate, str | None, str]]
    advice: dict[str, str] = field(default_factory=dict)


def plan_plugins(
    candidates: list[Candidate], plugins_config: object, env: Mapping[str, str]
) -> Plan:
    """Decide which candidates load, fatally or not; raise :class:`PluginError` for a
    requirement that cannot be met. Warns about names that match nothing installed."""
    autoload = bool(getattr(plugins_config, "autoload", True))
    enable = {canonical(n) for n in getattr(plugins_config, "enable", []) or []}
    disable = {canonical(n) for n in getattr(plugins_config, "disable", []) or []}
    settings = getattr(plugins_config, "settings", {}) or {}
    by_name = {canonical(c.name): c for c in candidates}
    known = set(by_name) | {CORE_DISTRIBUTION}

    requirements: dict[str, Requirement] = {}
    for text in getattr(plugins_config, "require", []) or []:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise PluginError(
                f"plugins.require: {text!r} is not a distribution name with "
                f"optional version specifiers: {exc}"
            ) from None
        if req.marker is None or req.marker.evaluate():
            requirements[canonical(req.name)] = req

    env_list = env.get(ENV_PLUGINS)
    renamed = (
        renamed_problems("plugins.enable", list(getattr(plugins_config, "enable", []) or []))
        + renamed_problems("plugins.disable", list(getattr(plugins_config, "disable", []) or []))
        + renamed_problems("plugins.require", [r.name for r in requirements.values()])
        + renamed_problems("plugins.settings", list(settings))
        + renamed_problems(
            ENV_PLUGINS, [n.strip() for n in (env_list or "").split(",") if n.strip()]
        )
    )
    if renamed:
        raise PluginError(
            "the plugins configuration names renamed distributions:\n  - " + "\n  - ".join(renamed)
        )
    listed: set[str] = set()
    if env_list is not None:
        listed = {canonical(n) for n in env_list.split(",") if n.strip()}
        for n in sorted(listed - known):
            log.warning("%s names %s, which is not an installed tallow plugin", ENV_PLUGINS, n)
    for what, names in (
        ("plugins.enable", enable),
        ("plugins.disable", disable),
        ("plugins.settings", {canonical(n) for n in settings}),
    ):
        for n in sorted(names - known):
            log.warning(
                "%s names %s, which is not an installed tallow plugin (installed: %s)",
                what,
                n,
                ", ".join(c.name for c in candidates) or "none",
            )
    for key in settings:
        cand = by_name.get(canonical(key))
        if cand is not None and key != cand.name:
            log.warning(
                "plugins.settings key %r should be spelled %r: plugins look their "
                "settings up by their distribution's name",
                key,
                cand.name,
            )
    if CORE_DISTRIBUTION in disable:
        log.warning("plugins.disable names tallow: the core cannot be disabled")

    problems: list[str] = []
    for n, req in requirements.items():
        if n == CORE_DISTRIBUTION:
            continue
        cand = by_name.get(n)
        if cand is None:
            problems.append(
                f"{req} is required (plugins.require) but not installed (no "
                f"'{ENTRY_POINT_GROUP}' entry point named {req.name})"
            )
        elif not _satisfies(cand.version, req):
            problems.append(
                f"{req} is required (plugins.require) but {cand.name} "
                f"{cand.version or '(unknown version)'} is installed"
            )
        elif env_list is not None and n not in listed:
            problems.append(
                f"{cand.name} is required (plugins.require) but "
                f"{ENV_PLUGINS}={env_list!r} leaves it out"
            )
        elif env_list is None and n in disable:
            problems.append(
                f"{cand.name} is both required (plugins.require) and disabled (plugins.disable)"
            )
    if problems:
        raise PluginError(
            "the plugins cannot be set up as configured:\n  - " + "\n  - ".join(problems)
        )

    items: list[tuple[Candidate, str | None, str]] = []
    advice: dict[str, str] = {}
    for cand in candidates:
        n = canonical(cand.name)
        if n in requirements:
            items.append((cand, "required", ""))
        elif env_list is not None:
            if n in listed:
                items.append((cand, "enabled", ""))
            else:
                items.append((cand, None, f"not listed in {ENV_PLUGINS}={env_list!r}"))
                advice[n] = f"add it to {ENV_PLUGINS}, or unset {ENV_PLUGINS}, to load it"
        elif n in disable:
            items.append(
                (cand, None, "disabled by plugins.disable" + _origin(plugins_config, "disable"))
            )
            advice[n] = "take it out of plugins.disable to load it"
        elif n in enable:
            items.append((cand, "enabled", ""))
        elif autoload:
            items.append((cand, "autoload", ""))
        else:
            items.append(
                (
                    cand,
                    None,
                    "plugins.autoload is off"
                    + _origin(plugins_config, "autoload")
                    + " and it is not in plugins.enable",
                )
            )
            advice[n] = "add it to plugins.enable (or turn plugins.autoload on) to load it"
    return Plan(items, advice)


def _origin(plugins_config: object, name: str) -> str:
    """`` (from env TALLOW_PLUGINS__DISABLE)``: where the setting ``name`` came from, when the
    configuration recorded it (:meth:`tallow.config.models.Section.setting_origin`)."""
    origin_of = getattr(plugins_config, "setting_origin", None)
    origin = origin_of(name) if callable(origin_of) else ""
    return f" (from {origin})" if origin else ""


def _satisfies(version: str, req: Requirement) -> bool:
    if not req.specifier:
        return True
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False

"""What every conformance suite checks first: the component is registered by its distribution
through the ``tallow`` entry point, lazily, without heavy imports, and its target loads.

A suite is a base class whose test methods run against the component named by class
attributes; a plugin's test module subclasses it (the subclass's name starts with ``Test`` so
pytest collects it)::

    from tallow.plugin.testing import ToolParserConformance

    class TestMyParser(ToolParserConformance):
        distribution = "tallow-myparser"
        component = "myparser"

Suites take the component through the distribution's installed entry point, exactly as
``tallow serve`` does, so a typo in the entry point or in a ``"module:attr"`` target fails
here, naming the distribution, its version, the entry point and the target. Install the
plugin first (``pip install -e .``). ``distribution = "tallow"`` names the core's own
components (``tallow.builtins``).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any, ClassVar

import pytest

from tallow import __version__

from ..discovery import CORE_DISTRIBUTION, ENTRY_POINT_GROUP, Candidate, canonical
from ..manager import CORE_MODULE, PluginManager
from ..registry import Entry, Registries, Registry
from . import modules_imported_by_registration


def find_entry_point(distribution: str) -> Candidate:
    """The installed ``tallow`` entry point of ``distribution``; AssertionError naming what is
    installed when there is none."""
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        name = (dist.metadata["Name"] if dist is not None else None) or ep.name
        if canonical(name) == canonical(distribution):
            return Candidate(name, dist.version if dist is not None else "", ep)
        found.append(name)
    raise AssertionError(
        f"no installed distribution {distribution!r} declares an entry point in the group "
        f"{ENTRY_POINT_GROUP!r} (installed plugins: {', '.join(sorted(found)) or 'none'}); "
        "install it (pip install -e .) and check [project.entry-points.tallow] in its "
        "pyproject.toml"
    )


def registration_module(distribution: str) -> str:
    """The module holding ``distribution``'s hook implementations (its entry point's value)."""
    if canonical(distribution) == CORE_DISTRIBUTION:
        return CORE_MODULE
    return find_entry_point(distribution).entry_point.value.split(":")[0]


def load_distribution(distribution: str) -> PluginManager:
    """A plugin manager holding the core's components and ``distribution``, loaded through its
    installed entry point (for ``"tallow"``: the core alone). A failing plugin raises
    :class:`~tallow.plugin.manager.PluginLoadError` naming distribution, version and entry
    point."""
    pm = PluginManager(env={})
    pm.add_plugin(
        importlib.import_module(CORE_MODULE),
        CORE_DISTRIBUTION,
        __version__,
        entry_point=CORE_MODULE,
        mode="builtin",
    )
    if canonical(distribution) != CORE_DISTRIBUTION:
        pm.load_candidate(find_entry_point(distribution), mode="enabled", fatal=True)
    return pm


def load_target(entry: Entry) -> Any:  # Any: a component of any kind
    """``entry.load()``; a target that fails to import or resolve is an AssertionError naming
    the distribution, its version, the component and the target."""
    try:
        return entry.load()
    except Exception as exc:
        raise AssertionError(
            f"{entry.kind} {entry.name!r} registered by {entry.distribution} "
            f"{entry.version or '(unknown version)'}: its target {entry.target!r} cannot be "
            f"loaded: {type(exc).__name__}: {exc}"
        ) from exc


def registry_class_name(kind: str) -> str:
    """``"attention_backends"`` → ``"AttentionBackendRegistry"``."""
    return type(getattr(Registries(), kind)).__name__


class ComponentConformance:
    """The checks every component passes; each kind's suite extends it.

    Set :attr:`distribution` and :attr:`component` in the subclass. Each suite sets
    :attr:`registry_kind` and :attr:`base_class`.
    """

    #: the distribution registering the component (``"tallow"``: the core)
    distribution: ClassVar[str] = ""
    #: the name it is registered under
    component: ClassVar[str] = ""
    #: the :class:`~tallow.plugin.Registries` attribute of the kind (set by each suite)
    registry_kind: ClassVar[str] = ""
    #: what the loaded target must be a subclass of (set by each suite; None: not checked)
    base_class: ClassVar[type | None] = None
    #: modules registration must not import (``tallow plugins list`` registers every plugin)
    light_modules: ClassVar[tuple[str, ...]] = ("torch",)

    @pytest.fixture(scope="class")
    def plugin_manager(self) -> PluginManager:
        """The core plus :attr:`distribution`, loaded through its entry point."""
        if not self.distribution or not self.component:
            raise AssertionError(
                f"{type(self).__name__}: set the class attributes 'distribution' and 'component'"
            )
        return load_distribution(self.distribution)

    @pytest.fixture(scope="class")
    def entry(self, plugin_manager: PluginManager) -> Entry:
        registry: Registry = getattr(plugin_manager.registries, self.registry_kind)
        if self.component not in registry:
            raise AssertionError(
                f"{self.distribution} registers no {registry.kind} {self.component!r} "
                f"(registered: {', '.join(e.name for e in registry) or 'none'})"
            )
        return registry.entry(self.component)

    @pytest.fixture(scope="class")
    def component_class(self, entry: Entry) -> Any:  # Any: each suite's kind of component
        return load_target(entry)

    def test_registered_by_its_distribution(
        self, plugin_manager: PluginManager, entry: Entry
    ) -> None:
        assert canonical(entry.distribution) == canonical(self.distribution), (
            f"{entry.kind} {entry.name!r} is registered by {entry.distribution}, "
            f"not {self.distribution}"
        )
        status = plugin_manager.status(entry.distribution)
        assert status.status == "ok", status.reason
        assert self.component in status.components.get(entry.kind, [])

    def test_registered_lazily(self, entry: Entry) -> None:
        assert entry.lazy, (
            f"{entry.kind} {entry.name!r} is registered as an object; register the string "
            "'module:attr' so that listing plugins imports nothing of it"
        )

    def test_target_loads(self, component_class: object) -> None:
        if self.base_class is not None:
            assert isinstance(component_class, type) and issubclass(
                component_class, self.base_class
            ), (
                f"{self.component!r} loads {component_class!r}, expected a subclass of "
                f"{self.base_class.__module__}.{self.base_class.__qualname__}"
            )

    def test_registration_imports_nothing_heavy(self) -> None:
        imported = modules_imported_by_registration(
            registration_module(self.distribution),
            f"tallow_register_{self.registry_kind}",
            registry_class_name(self.registry_kind),
            watch=self.light_modules,
        )
        assert imported == [], (
            f"registering {self.distribution} imported {imported}; "
            "import them in the component modules, which load lazily"
        )

"""Meta-tests over the hook specifications: documented, mapped to registries, exercised."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from tallow.plugin import hookimpl, hookspecs
from tallow.plugin.manager import HOOK_NAMES, REGISTRATION_PREFIX
from tallow.plugin.registry import Registries, Registry
from tallow.plugin.testing import HookRecorder, isolated_plugin_manager

pytest_plugins = ["tallow.plugin.testing"]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _specs() -> dict[str, Any]:
    """Every function of the hookspecs module carrying pluggy's spec marker."""
    return {
        name: fn
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT}_spec")
    }


def test_hook_names_are_the_hookspecs() -> None:
    assert set(HOOK_NAMES) == set(_specs())
    assert all(name.startswith("tallow_") for name in HOOK_NAMES)


def test_every_hookspec_has_a_real_docstring() -> None:
    for name, fn in _specs().items():
        doc = inspect.getdoc(fn) or ""
        assert len(doc.split()) >= 8, f"{name} needs a docstring stating its contract"


def test_every_hookspec_is_documented_in_the_plugin_guide() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [name for name in HOOK_NAMES if f"`{name}" not in text]
    assert not missing, f"docs/plugins.md does not describe: {missing}"


def test_every_registration_hook_has_its_registry() -> None:
    registries = Registries()
    for name in HOOK_NAMES:
        if name.startswith(REGISTRATION_PREFIX):
            registry = getattr(registries, name[len(REGISTRATION_PREFIX) :], None)
            assert isinstance(registry, Registry), f"{name} has no Registries attribute"
            assert list(inspect.signature(_specs()[name]).parameters) == ["registry"]


class AllHooks:
    """A plugin implementing every hook tallow declares, recording what it was given."""

    def __init__(self) -> None:
        self.got: dict[str, Any] = {}

    def _register(self, hook: str, registry: Registry) -> None:
        self.got[hook] = registry
        target = "tallow_dummy.module:Thing"
        if hook == "tallow_register_routes":
            registry.register("/dummy", target)
        else:
            registry.register("dummy", target)

    @hookimpl
    def tallow_register_architectures(self, registry: Any) -> None:
        self._register("tallow_register_architectures", registry)

    @hookimpl
    def tallow_register_weight_formats(self, registry: Any) -> None:
        self._register("tallow_register_weight_formats", registry)

    @hookimpl
    def tallow_register_quant_schemes(self, registry: Any) -> None:
        self._register("tallow_register_quant_schemes", registry)

    @hookimpl
    def tallow_register_kv_codecs(self, registry: Any) -> None:
        self._register("tallow_register_kv_codecs", registry)

    @hookimpl
    def tallow_register_attention_backends(self, registry: Any) -> None:
        self._register("tallow_register_attention_backends", registry)

    @hookimpl
    def tallow_register_tool_parsers(self, registry: Any) -> None:
        self._register("tallow_register_tool_parsers", registry)

    @hookimpl
    def tallow_register_reasoning_parsers(self, registry: Any) -> None:
        self._register("tallow_register_reasoning_parsers", registry)

    @hookimpl
    def tallow_register_tool_providers(self, registry: Any) -> None:
        self._register("tallow_register_tool_providers", registry)

    @hookimpl
    def tallow_register_grammar_backends(self, registry: Any) -> None:
        self._register("tallow_register_grammar_backends", registry)

    @hookimpl
    def tallow_register_speculators(self, registry: Any) -> None:
        self._register("tallow_register_speculators", registry)

    @hookimpl
    def tallow_register_routes(self, registry: Any) -> None:
        self._register("tallow_register_routes", registry)

    @hookimpl
    def tallow_configure(self, config: Any) -> None:
        self.got["tallow_configure"] = config


def test_every_hookspec_is_exercised_through_a_manager() -> None:
    pm = isolated_plugin_manager()
    plugin = AllHooks()
    with HookRecorder(pm) as recorder:
        status = pm.add_plugin(plugin, "tallow-dummy", "9.9")
        config = object()
        pm.configure(config)
    exercised = {call.name for call in recorder.calls if "tallow-dummy" in call.plugins}
    assert exercised == set(HOOK_NAMES), "a new hookspec needs a case in AllHooks"
    assert set(plugin.got) == set(HOOK_NAMES)
    # each registration hook got the registry of its own kind, and its entry is attributed
    for name in HOOK_NAMES:
        if name.startswith(REGISTRATION_PREFIX):
            registry = getattr(pm.registries, name[len(REGISTRATION_PREFIX) :])
            assert plugin.got[name] is registry
            entry = next(iter(registry))
            assert (entry.distribution, entry.version) == ("tallow-dummy", "9.9")
    assert plugin.got["tallow_configure"] is config
    assert sum(len(names) for names in status.components.values()) == sum(
        1 for n in HOOK_NAMES if n.startswith(REGISTRATION_PREFIX)
    )


def test_pytest_fixtures_record_hooks(
    tallow_plugin_manager: Any, tallow_hook_recorder: HookRecorder
) -> None:
    plugin = AllHooks()
    tallow_plugin_manager.add_plugin(plugin, "tallow-dummy")
    calls = tallow_hook_recorder.assert_called("tallow_register_kv_codecs", times=1)
    assert calls[0].kwargs["registry"] is tallow_plugin_manager.registries.kv_codecs
    assert calls[0].plugins == ["tallow-dummy"] and calls[0].exception is None
    assert not tallow_hook_recorder.called("tallow_configure")
    try:
        tallow_hook_recorder.assert_called("tallow_configure")
    except AssertionError as exc:
        assert "called 0 time(s)" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("assert_called accepted a hook that was never called")

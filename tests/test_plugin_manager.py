"""The plugin manager's rules, on plugins defined in the test (no discovery), and the
selection rule (``select``) on components defined in the test."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from tallow.plugin import (
    AttentionBackendRegistry,
    Component,
    Entry,
    RegistryError,
    SelectionError,
    hookimpl,
    registering_as,
    select,
)
from tallow.plugin.manager import (
    HOOK_NAMES,
    HookNameError,
    PluginLoadError,
    PluginManager,
    load_plugins,
)
from tallow.plugin.testing import isolated_plugin_manager


def _module(name: str, **functions: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for attr, fn in functions.items():
        setattr(mod, attr, fn)
    return mod


class Registers:
    """A plugin registering one attention backend under ``name``."""

    def __init__(self, name: str, *, override: bool = False, priority: int = 0) -> None:
        self.name, self.override, self.priority = name, override, priority

    @hookimpl
    def tallow_register_attention_backends(self, registry: Any) -> None:
        registry.register(
            self.name, "somewhere.module:Backend", priority=self.priority, override=self.override
        )


def test_registrations_record_their_distribution() -> None:
    pm = isolated_plugin_manager(builtins=True)
    status = pm.add_plugin(Registers("fast"), "tallow-fast", "1.2.3")
    entry = pm.registries.attention_backends.entry("fast")
    assert (entry.distribution, entry.version) == ("tallow-fast", "1.2.3")
    assert entry.lazy and entry.target == "somewhere.module:Backend"
    assert status.components == {"attention_backend": ["fast"]}
    builtin = pm.registries.attention_backends.entry("torch")
    assert builtin.distribution == "tallow"
    assert [s.name for s in pm.statuses()] == ["tallow", "tallow-fast"]


def test_duplicate_is_refused_and_override_is_accepted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = isolated_plugin_manager(("tallow-first", Registers("shared")))
    with pytest.raises(PluginLoadError) as info:
        pm.add_plugin(Registers("shared"), "tallow-second", "0.1")
    assert isinstance(info.value.cause, RegistryError)
    assert "'shared' is already registered by tallow-first" in str(info.value)
    assert pm.registries.attention_backends.entry("shared").distribution == "tallow-first"
    with caplog.at_level(logging.WARNING, logger="tallow.plugin"):
        pm.add_plugin(Registers("shared", override=True), "tallow-third", "0.2")
    assert pm.registries.attention_backends.entry("shared").distribution == "tallow-third"
    assert "'shared' registered by tallow-first is overridden by tallow-third" in caplog.text


def test_failed_plugin_is_rolled_back_everywhere() -> None:
    class Halfway:
        @hookimpl
        def tallow_register_kv_codecs(self, registry: Any) -> None:
            registry.register("half-kv", "x.y:Z")

        @hookimpl
        def tallow_register_tool_parsers(self, registry: Any) -> None:
            raise KeyError("boom")

        @hookimpl
        def tallow_configure(self, config: Any) -> None:
            raise AssertionError("must not be called")

    pm = isolated_plugin_manager(builtins=True)
    before = {r.kind: r.names() for r in pm.registries.all()}
    plugin = Halfway()
    status = pm.add_plugin(plugin, "tallow-halfway", "1.0", fatal=False)
    assert status.status == "failed" and "KeyError: 'boom'" in status.reason
    assert "test_plugin_manager.py" in status.reason  # points at the plugin's code
    assert {r.kind: r.names() for r in pm.registries.all()} == before
    assert not pm.pluggy.is_registered(plugin)
    pm.configure(object())  # the failed plugin's hook is gone


def test_rollback_restores_what_an_override_replaced() -> None:
    class OverrideThenFail:
        @hookimpl
        def tallow_register_attention_backends(self, registry: Any) -> None:
            registry.register("torch", "x.y:Z", override=True)

        @hookimpl
        def tallow_register_routes(self, registry: Any) -> None:
            raise RuntimeError("late failure")

    pm = isolated_plugin_manager(builtins=True)
    original = pm.registries.attention_backends.entry("torch")
    pm.add_plugin(OverrideThenFail(), "tallow-bad", fatal=False)
    assert pm.registries.attention_backends.entry("torch") is original


def test_hook_without_hookimpl_marker_is_caught() -> None:
    def tallow_register_tool_parsers(registry: Any) -> None:  # not marked
        registry.register("x", "a.b:C")

    pm = PluginManager(env={})
    with pytest.raises(PluginLoadError) as info:
        pm.add_plugin(
            _module("unmarked", tallow_register_tool_parsers=tallow_register_tool_parsers),
            "tallow-unmarked",
        )
    assert isinstance(info.value.cause, HookNameError)
    assert "not marked with @hookimpl" in str(info.value)


def test_misspelled_hooks_are_caught_marked_or_not() -> None:
    def tallow_register_tool_parser(registry: Any) -> None:  # singular, unmarked
        pass

    pm = PluginManager(env={})
    status = pm.add_plugin(
        _module("typo1", tallow_register_tool_parser=tallow_register_tool_parser),
        "tallow-typo1",
        fatal=False,
    )
    assert "did you mean tallow_register_tool_parsers" in status.reason

    @hookimpl
    def tallow_configur(config: Any) -> None:
        pass

    status = pm.add_plugin(
        _module("typo2", tallow_configur=tallow_configur), "tallow-typo2", fatal=False
    )
    assert "unknown hook 'tallow_configur'; did you mean tallow_configure" in status.reason
    pm.check_pending()  # nothing unknown is left registered

    @hookimpl(optionalhook=True)
    def tallow_future_hook() -> None:
        pass

    status = pm.add_plugin(_module("opt", tallow_future_hook=tallow_future_hook), "tallow-opt")
    assert status.status == "ok"


def test_configure_is_historic() -> None:
    seen: list[tuple[str, Any]] = []

    class Configurable:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        @hookimpl
        def tallow_configure(self, config: Any) -> None:
            seen.append((self.tag, config))

    pm = isolated_plugin_manager(("tallow-early", Configurable("early")))
    config = object()
    assert pm.hook.tallow_configure(config=config) == []
    pm.add_plugin(Configurable("late"), "tallow-late")
    assert seen == [("early", config), ("late", config)]


def test_trace_env_switch_writes_hook_calls(capsys: pytest.CaptureFixture[str]) -> None:
    pm = PluginManager(env={"TALLOW_TRACE_HOOKS": "1"})
    pm.add_plugin(Registers("traced"), "tallow-traced")
    err = capsys.readouterr().err
    assert "[tallow hooks]" in err and "tallow_register_attention_backends" in err
    quiet = PluginManager(env={"TALLOW_TRACE_HOOKS": "0"})
    quiet.add_plugin(Registers("quiet"), "tallow-quiet")
    assert "tallow_register_attention_backends" not in capsys.readouterr().err


def test_unknown_hook_attribute_is_a_clear_error() -> None:
    pm = PluginManager(env={})
    with pytest.raises(AttributeError, match="tallow declares no hook 'tallow_nope'"):
        pm.hook.tallow_nope
    assert set(dir(pm.hook)) == set(HOOK_NAMES)


def test_core_loads_as_distribution_tallow_even_without_external_plugins() -> None:
    pm = load_plugins(None, env={"TALLOW_PLUGINS": ""})
    core = pm.status("tallow")
    from tallow import __version__

    assert (core.status, core.version, core.mode) == ("ok", __version__, "builtin")
    assert "torch" in core.components["attention_backend"]
    assert all(s.status == "disabled" for s in pm.statuses() if s.name != "tallow")


# -- selection ---------------------------------------------------------------------------------
class Serves(Component):
    pass


class NeedsGpu(Component):
    @classmethod
    def validate(cls, config: Any) -> list[str]:
        return ["no GPU"]


def ranked_registry() -> AttentionBackendRegistry:
    """invalid (priority 20, validate refuses) > fast (10) > slow (0)."""
    reg = AttentionBackendRegistry()
    with registering_as("tallow-test"):
        reg.register("invalid", NeedsGpu, priority=20)
        reg.register("fast", Serves, priority=10)
        reg.register("slow", Serves, priority=0)
    return reg


class RefusesByName:
    """A ``check`` refusing the entries named in ``refused``; records whom it was asked about."""

    def __init__(self, *refused: str) -> None:
        self.refused, self.asked = refused, []

    def __call__(self, entry: Entry) -> list[str]:
        self.asked.append(entry.name)
        return ["refuses the codec"] if entry.name in self.refused else []


def test_auto_passes_over_an_entry_whose_check_gives_reasons(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = ranked_registry()
    assert select(reg, None).name == "fast"
    check = RefusesByName("fast")
    with caplog.at_level(logging.INFO, logger="tallow.plugin"):
        assert select(reg, None, "auto", check=check).name == "slow"
    assert check.asked == ["fast", "slow"]  # never about one whose validate already refused
    assert "chose 'slow'" in caplog.text
    assert "passed over: invalid: no GPU; fast: refuses the codec" in caplog.text


def test_auto_with_every_entry_refused_lists_the_check_reasons() -> None:
    with pytest.raises(SelectionError) as info:
        select(ranked_registry(), None, check=RefusesByName("fast", "slow"))
    assert str(info.value) == (
        "no attention_backend can serve this configuration:\n  - invalid: no GPU\n"
        "  - fast: refuses the codec\n  - slow: refuses the codec"
    )


def test_named_entry_whose_check_gives_reasons_is_refused() -> None:
    reg = ranked_registry()
    with pytest.raises(SelectionError) as info:
        select(reg, None, "slow", check=RefusesByName("slow"))
    assert str(info.value) == (
        "attention_backend 'slow' (from tallow-test) cannot serve this "
        "configuration:\n  - refuses the codec"
    )
    check = RefusesByName("fast")
    assert select(reg, None, "slow", check=check).name == "slow"
    assert check.asked == ["slow"]
    check = RefusesByName()
    with pytest.raises(SelectionError, match="'invalid' .* configuration:\n  - no GPU$"):
        select(reg, None, "invalid", check=check)
    assert check.asked == []


def test_a_plugin_implementing_a_removed_lifecycle_hook_is_refused_by_name() -> None:
    # tallow_engine_ready and tallow_shutdown were declared and never used; a plugin that
    # still implements one must fail loudly rather than wait for a call that never comes.
    @hookimpl
    def tallow_shutdown() -> None:
        pass

    pm = PluginManager(env={})
    status = pm.add_plugin(
        _module("old", tallow_shutdown=tallow_shutdown), "tallow-old", fatal=False
    )
    assert status.status == "failed"
    assert "unknown hook 'tallow_shutdown'" in status.reason

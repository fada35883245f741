"""Registration and settings of {{ cookiecutter.project_slug }}, with tallow's plugin-testing
fixtures (the component itself: test_conformance.py)."""

from __future__ import annotations

import {{ cookiecutter.package_name }}.plugin as plugin

pytest_plugins = ["tallow.plugin.testing"]


def test_registers_its_component(tallow_plugin_manager, tallow_hook_recorder) -> None:
    status = tallow_plugin_manager.add_plugin(plugin, plugin.DISTRIBUTION, "{{ cookiecutter.version }}")
    assert status.status == "ok", status.reason
    (kind, names), = status.components.items()
    assert names == [plugin.COMPONENT]
    entry = getattr(tallow_plugin_manager.registries, kind + "s").entry(plugin.COMPONENT)
    assert entry.distribution == plugin.DISTRIBUTION and entry.lazy
    entry.load()  # the "module:attr" target resolves
    tallow_hook_recorder.assert_called(f"tallow_register_{kind}s", times=1)


def test_reads_its_settings(tallow_plugin_manager) -> None:
    from tallow.plugin.testing import make_config

    tallow_plugin_manager.add_plugin(plugin, plugin.DISTRIBUTION)
    config = make_config({"plugins": {"settings": {plugin.DISTRIBUTION: {"strict": True}}}})
    tallow_plugin_manager.hook.tallow_configure(config=config)
    assert plugin.settings == {"strict": True}

"""Tests of {{ cookiecutter.project_slug }}, using tallow's plugin-testing fixtures."""

from __future__ import annotations

import json

import {{ cookiecutter.package_name }}.plugin as plugin

pytest_plugins = ["tallow.plugin.testing"]


def test_registers_its_parser(tallow_plugin_manager, tallow_hook_recorder) -> None:
    status = tallow_plugin_manager.add_plugin(plugin, plugin.DISTRIBUTION, "{{ cookiecutter.version }}")
    assert status.status == "ok", status.reason
    assert status.components == {"tool_parser": [plugin.PARSER_NAME]}
    entry = tallow_plugin_manager.registries.tool_parsers.entry(plugin.PARSER_NAME)
    assert entry.distribution == plugin.DISTRIBUTION and entry.lazy
    tallow_hook_recorder.assert_called("tallow_register_tool_parsers", times=1)


def test_registration_imports_nothing_heavy() -> None:
    # `tallow plugins` and start-up register every installed plugin; components load lazily
    from tallow.plugin.testing import modules_imported_by_registration

    assert modules_imported_by_registration("{{ cookiecutter.package_name }}.plugin",
                                            "tallow_register_tool_parsers",
                                            "ToolParserRegistry") == []


def test_reads_its_settings(tallow_plugin_manager) -> None:
    from tallow.plugin.testing import make_config

    tallow_plugin_manager.add_plugin(plugin, plugin.DISTRIBUTION)
    config = make_config({"plugins": {"settings": {plugin.DISTRIBUTION: {"strict": True}}}})
    tallow_plugin_manager.hook.tallow_configure(config=config)
    assert plugin.settings == {"strict": True}


def test_parser_whole_and_streamed_agree(tallow_plugin_manager) -> None:
    tallow_plugin_manager.add_plugin(plugin, plugin.DISTRIBUTION)
    parser = tallow_plugin_manager.registries.tool_parsers.get(plugin.PARSER_NAME)()
    text = 'Let me look.\nCALL get_weather {"city": "Paris"}\nCALL broken {not json\n'
    result = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert result.content == "Let me look.\nCALL broken {not json\n"

    stream = parser.stream()
    deltas = [stream.feed(text[i:i + 5]) for i in range(0, len(text), 5)] + [stream.finish()]
    content = "".join(d.content for d in deltas)
    calls = [c for d in deltas for c in d.tool_calls]
    assert content == result.content
    assert [(c.name, c.arguments) for c in calls] == [
        (c.name, c.arguments) for c in result.tool_calls]

"""Registration of {{ cookiecutter.project_slug }}'s components.

tallow imports this module at start-up (it is named by the entry point), so it stays cheap:
components are registered as lazy "module:attr" strings and imported only when used.
"""

from __future__ import annotations

from typing import Any

from tallow.plugin import hookimpl

DISTRIBUTION = "{{ cookiecutter.project_slug }}"
PARSER_NAME = "{{ cookiecutter.plugin_name }}-calls"

#: settings read from the config's plugins.settings["{{ cookiecutter.project_slug }}"]
settings: dict[str, Any] = {}


@hookimpl
def tallow_register_tool_parsers(registry: Any) -> None:
    registry.register(PARSER_NAME, "{{ cookiecutter.package_name }}.parser:CallLineParser")


@hookimpl
def tallow_configure(config: Any) -> None:
    settings.clear()
    settings.update(config.plugins.settings.get(DISTRIBUTION, {}))

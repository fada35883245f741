"""``tallow.plugin.plugin_settings``: a plugin's settings validated with every problem named by
its full key path."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tallow.plugin import PluginSettingsError, plugin_settings
from tallow.plugin.manager import PluginError
from tallow.plugin.testing import make_config


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(1, gt=0)


class Mine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "x"
    items: list[Inner] = []


def config(settings: object) -> object:
    return make_config({"plugins": {"settings": {"tallow-mine": settings}}})


def test_absent_settings_are_the_defaults() -> None:
    assert plugin_settings(Mine, make_config({}), "tallow-mine") == Mine()
    assert plugin_settings(Mine, None, "tallow-mine") == Mine()
    got = plugin_settings(Mine, config({"items": [{"size": 3}]}), "tallow-mine")
    assert got.items == [Inner(size=3)]


def test_every_problem_is_named_by_its_key_path() -> None:
    with pytest.raises(PluginSettingsError) as info:
        plugin_settings(
            Mine, config({"nmae": "y", "items": [{"size": 2}, {"size": -1}]}), "tallow-mine"
        )
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid plugin settings:"
    assert "  - plugins.settings.tallow-mine.nmae: unknown key" in lines
    assert any(
        line.startswith(
            "  - plugins.settings.tallow-mine.items[1].size: Input should "
            "be greater than 0 (got -1)"
        )
        for line in lines
    )
    assert isinstance(info.value, PluginError)  # `tallow` prints it and stops


def test_settings_must_be_a_mapping() -> None:
    # TallowConfig refuses it already; a config built another way gets the same answer
    from types import SimpleNamespace

    built = SimpleNamespace(plugins=SimpleNamespace(settings={"tallow-mine": [1, 2]}))
    with pytest.raises(PluginSettingsError, match=r"tallow-mine: expected a mapping"):
        plugin_settings(Mine, built, "tallow-mine")

"""One naming rule for every first-party plugin, and the renamed distributions.

Every plugin under plugins/ is folder ``plugins/<kind>/<name>``, distribution
``tallow-<kind>-<name>``, module ``tallow_<kind>_<name>``, entry point named as the
distribution. A configuration naming an old distribution fails with the new name; an old
distribution installed beside its successor is left out of discovery.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tallow.plugin.manager import PluginError, discover, load_plugins
from tallow.plugin.naming import KINDS as RULE_KINDS, RENAMED, kind_of, new_name

ROOT = Path(__file__).resolve().parents[1]
KINDS = {
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
}
assert set(RULE_KINDS) == KINDS
PLUGINS = sorted(ROOT.glob("plugins/*/*/pyproject.toml"))


def _project(pyproject: Path) -> dict[str, Any]:
    return tomllib.loads(pyproject.read_text())["project"]


def test_the_tree_has_the_plugins() -> None:
    assert len(PLUGINS) >= 27


@pytest.mark.parametrize("pyproject", PLUGINS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_plugin_follows_the_naming_rule(pyproject: Path) -> None:
    kind, name = pyproject.parent.parent.name, pyproject.parent.name
    assert kind in KINDS, f"plugins/{kind}: not one of the kinds {sorted(KINDS)}"
    project = _project(pyproject)
    dist = f"tallow-{kind}-{name.replace('_', '-')}"
    module = f"tallow_{kind}_{name}"
    assert project["name"] == dist
    assert project["entry-points"]["tallow"] == {dist: f"{module}.plugin"}
    assert (pyproject.parent / module / "plugin.py").is_file()
    assert kind_of(dist) == kind
    assert tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"] == {
        "include": [f"{module}*"]
    }


def test_the_renamed_table_points_at_plugins_of_the_tree() -> None:
    names = {_project(p)["name"] for p in PLUGINS}
    assert set(RENAMED.values()) <= names
    assert not set(RENAMED) & names
    assert new_name("Tallow_GGUF") == "tallow-format-gguf"
    assert new_name("tallow-format-gguf") is None


def test_kind_of_reads_the_kind_from_the_name() -> None:
    assert kind_of("tallow") == "core" and kind_of("Tallow_Model_Llama") == "model"
    assert kind_of("tallow-fastattn") == "other" and kind_of("vllm-model-x") == "other"
    assert kind_of("tallow-model") == "other"


def _ep(dist: str, module: str) -> Any:
    """An entry point as importlib.metadata gives it (name, value, its distribution)."""
    return SimpleNamespace(
        name=dist,
        value=f"{module}.plugin",
        group="tallow",
        dist=SimpleNamespace(metadata={"Name": dist}, version="0.1.0"),
    )


def test_an_old_distribution_beside_its_successor_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eps = [
        _ep("tallow-gguf", "tallow_gguf"),
        _ep("tallow-format-gguf", "tallow_format_gguf"),
        _ep("tallow-llama", "tallow_llama"),
    ]
    with caplog.at_level(logging.WARNING, logger="tallow.plugin"):
        found = [c.name for c in discover(eps)]
    # tallow-llama alone (no tallow-model-llama installed) still loads under its old name
    assert found == ["tallow-format-gguf", "tallow-llama"]
    assert "tallow-gguf is the old name of tallow-format-gguf" in caplog.text
    assert "pip uninstall tallow-gguf" in caplog.text


@pytest.mark.parametrize(
    "config, env, where",
    [
        ({"settings": {"tallow-mcp": {"servers": {}}}}, {}, "plugins.settings"),
        ({"enable": ["tallow-llama"]}, {}, "plugins.enable"),
        ({"disable": ["tallow_safetensors"]}, {}, "plugins.disable"),
        ({"require": ["tallow-phi3>=0.1"]}, {}, "plugins.require"),
        ({}, {"TALLOW_PLUGINS": "tallow-quant-fp8, tallow-gguf"}, "TALLOW_PLUGINS"),
    ],
)
def test_a_configuration_naming_an_old_distribution_fails_with_the_new_name(
    config: dict[str, Any], env: dict[str, str], where: str
) -> None:
    with pytest.raises(PluginError) as info:
        load_plugins(config, env=env, entry_points=[])
    message = str(info.value)
    assert where in message and "which is now tallow-" in message
    old = message.split(f"{where} names ")[1].split(",")[0]
    assert f"{old}, which is now {new_name(old)}: use the new name" in message


def test_the_cookiecutter_names_by_the_rule(tmp_path: Path) -> None:
    """Each kind of the template renders distribution tallow-<kind>-<name>, module
    tallow_<kind>_<name>, entry point named as the distribution."""
    import json

    main = pytest.importorskip("cookiecutter.main", reason="cookiecutter renders the template")
    template = ROOT / "cookiecutter"
    for component_kind in json.loads((template / "cookiecutter.json").read_text())["kind"]:
        project = Path(
            main.cookiecutter(
                str(template),
                no_input=True,
                output_dir=str(tmp_path / component_kind),
                extra_context={"kind": component_kind, "plugin_name": "My_Thing"},
            )
        )
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        kind = kind_of(meta["name"])
        assert kind in RULE_KINDS, (component_kind, meta["name"])
        assert meta["name"] == project.name == f"tallow-{kind}-my-thing"
        assert meta["entry-points"]["tallow"] == {meta["name"]: f"tallow_{kind}_my_thing.plugin"}
        assert (project / f"tallow_{kind}_my_thing" / "plugin.py").is_file()

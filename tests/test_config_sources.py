"""``tallow`` (the CLI), ``LLM()`` and ``AsyncEngine.create()`` resolve the same configuration
from every source — a YAML file (``--config`` / ``config=``), ``$TALLOW_CONFIG``, ``TALLOW_*``
variables, flags / keyword arguments — with the same precedence; and a plugin that any source
leaves out is not used by ``LLM()`` or ``AsyncEngine``, as ``tallow plugins list`` says.

The CLI runs in this process (``tallow.cli.main``). For the configuration matrix the engines'
``from_config`` is replaced by a recorder of the configuration they are given; where plugins
matter a real engine is built on the few-MB ``random:tiny-llama`` model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tallow import cli
from tallow.config import (
    KEYWORDS,
    PluginsConfig,
    config_from_mapping,
    dump_config,
    env_var_name,
    setting_flags,
)
from tallow.config.keywords import FLAT_SECTIONS
from tallow.engine.async_engine import AsyncEngine
from tallow.engine.llm import LLM
from tallow.engine.llm_engine import LLMEngine
from tallow.plugin import SelectionError

FRONTENDS = ("cli", "LLM", "AsyncEngine")
FLAGS = {(section, name): flag for section, name, flag, _ in setting_flags()}
FP8, HERMES, LLAMA = "tallow-kvcache-fp8", "tallow-tool-hermes", "tallow-model-llama"


pytestmark = pytest.mark.usefixtures("no_tallow_env")


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The configurations given to LLMEngine/AsyncEngine.from_config (which build nothing)."""
    seen: list[Any] = []

    def record(cls: type, config: Any, plugin_manager: Any = None) -> object:
        seen.append(config)
        return object()

    monkeypatch.setattr(LLMEngine, "from_config", classmethod(record))
    monkeypatch.setattr(AsyncEngine, "from_config", classmethod(record))
    return seen


# ---------------------------------------------------------------------------------------------
# one setting through every source
# ---------------------------------------------------------------------------------------------
def keyword_for(section: str, name: str, value: Any) -> dict[str, Any]:
    """The keyword argument that gives ``section.name = value``, found in KEYWORDS."""
    for keyword in KEYWORDS.values():
        if (keyword.section, keyword.field) == (section, name):
            return {keyword.name: value}
    assert section not in FLAT_SECTIONS, f"{section}.{name} has no keyword"
    return {section: {name: value}}


def flags_for(keywords: dict[str, Any]) -> list[str]:
    """The command-line flags that give the same settings as ``keywords``."""
    args: list[str] = []
    for key, value in keywords.items():
        keyword = KEYWORDS[key]
        fields = value.items() if keyword.field is None else [(keyword.field, value)]
        for name, item in fields:
            flag = FLAGS[(keyword.section, name)]
            if isinstance(item, bool):
                args.append(flag if item else "--no-" + flag[2:])
            elif isinstance(item, list):
                for element in item:
                    args += [flag, str(element)]
            else:
                args += [flag, str(item)]
    return args


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def write_yaml(path: Path, settings: dict[str, dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def resolve(
    frontend: str,
    recorded: list[Any],
    capsys: pytest.CaptureFixture[str],
    *,
    config: Path | None = None,
    keywords: dict[str, Any] | None = None,
) -> dict:
    """The effective configuration (as dumped data) that ``frontend`` resolves."""
    keywords = keywords or {}
    if frontend == "cli":
        capsys.readouterr()
        argv = ["config", "show", "--json", *flags_for(keywords)]
        assert cli.main(argv + (["--config", str(config)] if config else [])) == 0
        return json.loads(capsys.readouterr().out)
    recorded.clear()
    if frontend == "LLM":
        LLM(config=config, **keywords)
    else:
        AsyncEngine.create(config=config, **keywords)
    (resolved,) = recorded
    return dump_config(resolved)


SETTINGS = [
    ("model", "source", "random:tiny-llama"),
    ("model", "tokenizer", "/srv/tokenizers/tiny"),
    ("scheduler", "max_waiting", 7),
    ("cache", "block_size", 32),
    ("server", "port", 8123),
    ("plugins", "disable", [FP8, HERMES]),
    ("plugins", "autoload", False),
    ("logging", "level", "DEBUG"),
]
SOURCES = ("config file", "TALLOW_CONFIG", "env", "keywords")


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0]}.{s[1]}")
def test_each_source_gives_the_same_configuration_everywhere(
    setting: tuple[str, str, Any],
    source: str,
    frontend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    section, name, value = setting
    expected = dump_config(config_from_mapping({section: {name: value}}))
    assert expected != dump_config(config_from_mapping({}))  # the setting is not a default
    config = None
    keywords: dict[str, Any] = {}
    if source in ("config file", "TALLOW_CONFIG"):
        path = write_yaml(tmp_path / "tallow.yaml", {section: {name: value}})
        if source == "TALLOW_CONFIG":
            monkeypatch.setenv("TALLOW_CONFIG", str(path))
        else:
            config = path
    elif source == "env":
        monkeypatch.setenv(env_var_name(section, name), env_text(value))
    else:
        keywords = keyword_for(section, name, value)
    assert resolve(frontend, recorded, capsys, config=config, keywords=keywords) == expected


# ---------------------------------------------------------------------------------------------
# precedence: defaults < TALLOW_CONFIG file, replaced by config= < env < keywords
# ---------------------------------------------------------------------------------------------
PRECEDENCE = [
    ("TALLOW_CONFIG", "env"),
    ("config file", "env"),
    ("config file", "keywords"),
    ("env", "keywords"),
    ("TALLOW_CONFIG", "config file"),
    ("TALLOW_CONFIG", "config file", "env", "keywords"),
]
VALUE_FROM = {"TALLOW_CONFIG": 10, "config file": 11, "env": 12, "keywords": 13}


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("given", PRECEDENCE, ids=" < ".join)
def test_precedence_is_the_same_everywhere(
    given: tuple[str, ...],
    frontend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = None
    keywords: dict[str, Any] = {}
    if "TALLOW_CONFIG" in given:  # also holds a setting no other source gives
        env_file = write_yaml(
            tmp_path / "env.yaml", {"scheduler": {"max_waiting": 10}, "cache": {"block_size": 64}}
        )
        monkeypatch.setenv("TALLOW_CONFIG", str(env_file))
    if "config file" in given:
        config = write_yaml(tmp_path / "given.yaml", {"scheduler": {"max_waiting": 11}})
    if "env" in given:
        monkeypatch.setenv("TALLOW_SCHEDULER__MAX_WAITING", "12")
    if "keywords" in given:
        keywords = {"max_waiting": 13}
    data = resolve(frontend, recorded, capsys, config=config, keywords=keywords)
    assert data["scheduler"]["max_waiting"] == VALUE_FROM[given[-1]]
    # a config file given explicitly replaces $TALLOW_CONFIG's file whole
    file_read = "TALLOW_CONFIG" in given and "config file" not in given
    assert data["cache"]["block_size"] == (64 if file_read else 16)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_higher_source_replaces_a_plugin_list_whole(
    frontend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_yaml(tmp_path / "tallow.yaml", {"plugins": {"disable": [FP8]}})
    monkeypatch.setenv("TALLOW_PLUGINS__DISABLE", HERMES)
    data = resolve(frontend, recorded, capsys, config=config)
    assert data["plugins"]["disable"] == [HERMES]
    if frontend != "cli":  # a repeated flag cannot say "the empty list"; a keyword can
        again = resolve(
            frontend, recorded, capsys, config=config, keywords={"plugins": {"disable": []}}
        )
        assert again["plugins"]["disable"] == []


# ---------------------------------------------------------------------------------------------
# a plugin left out by any source is not used (real engines)
# ---------------------------------------------------------------------------------------------
# source → (YAML of the config file, env, keywords, text the refusal must contain)
LEAVE_OUT: dict[str, tuple[dict, dict[str, str], dict[str, Any], str]] = {
    "config file": (
        {"plugins": {"disable": [FP8, HERMES]}},
        {},
        {},
        "disabled by plugins.disable (from file ",
    ),
    "TALLOW_CONFIG": (
        {"plugins": {"disable": [FP8, HERMES]}},
        {"TALLOW_CONFIG": "<file>"},
        {},
        "disabled by plugins.disable (from file ",
    ),
    "TALLOW_PLUGINS__DISABLE": (
        {},
        {"TALLOW_PLUGINS__DISABLE": f"{FP8},{HERMES}"},
        {},
        "disabled by plugins.disable (from env "
        "TALLOW_PLUGINS__DISABLE); take it out of plugins.disable",
    ),
    "TALLOW_PLUGINS__AUTOLOAD": (
        {},
        {"TALLOW_PLUGINS__AUTOLOAD": "false", "TALLOW_PLUGINS__ENABLE": LLAMA},
        {},
        "plugins.autoload is off (from env TALLOW_PLUGINS__AUTOLOAD) "
        "and it is not in plugins.enable; add it to plugins.enable",
    ),
    "TALLOW_PLUGINS": (
        {},
        {"TALLOW_PLUGINS": LLAMA},
        {},
        f"not listed in TALLOW_PLUGINS='{LLAMA}'; add it to TALLOW_PLUGINS",
    ),
    "plugins= mapping": (
        {},
        {},
        {"plugins": {"disable": [FP8, HERMES]}},
        "disabled by plugins.disable (from ",
    ),
    "plugins= model": (
        {},
        {},
        {"plugins": PluginsConfig(autoload=False, enable=[LLAMA])},
        "plugins.autoload is off (from ",
    ),
}


@pytest.mark.parametrize("frontend", ["LLM", "AsyncEngine"])
@pytest.mark.parametrize("source", list(LEAVE_OUT))
def test_a_plugin_left_out_by_any_source_is_not_used(
    source: str,
    frontend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tiny: dict,
) -> None:
    file_settings, env, keywords, refusal = LEAVE_OUT[source]
    config = write_yaml(tmp_path / "tallow.yaml", file_settings) if file_settings else None
    for var, value in env.items():
        monkeypatch.setenv(var, str(config) if value == "<file>" else value)
    if "TALLOW_CONFIG" in env:
        config = None

    # what `tallow plugins list` says, given the same sources (keywords as flags)
    capsys.readouterr()
    plugin_keywords = {
        k: v.model_dump(exclude_unset=True) if isinstance(v, PluginsConfig) else v
        for k, v in keywords.items()
    }
    argv = ["plugins", "list", "--json", *flags_for(plugin_keywords)]
    assert cli.main(argv + (["--config", str(config)] if config else [])) == 0
    listed = {p["name"]: p["status"] for p in json.loads(capsys.readouterr().out)}
    assert listed[FP8] == listed[HERMES] == "disabled"

    def build(**more: Any) -> Any:
        if frontend == "LLM":
            return LLM(config=config, **tiny, **keywords, **more).engine
        return AsyncEngine.create(config=config, **tiny, **keywords, **more)

    engine = build()
    pm = engine.plugin_manager
    assert {s.name: s.status for s in pm.statuses()} == listed
    assert "fp8" not in pm.registries.kv_codecs and "hermes" not in pm.registries.tool_parsers
    # the core's codec and the other KV-codec plugins' (turboquant) stay
    assert "auto" in pm.registries.kv_codecs.names()
    assert not {"fp8", "fp8_e4m3", "fp8_e5m2"} & set(pm.registries.kv_codecs.names())

    with pytest.raises(SelectionError) as refused:
        build(kv_codec="fp8")
    text = str(refused.value)
    registered = ", ".join(sorted(pm.registries.kv_codecs.names()))
    assert text.startswith(
        f"cache.kv_codec 'fp8': unknown kv_codec 'fp8' (registered: {registered})"
    ), text
    assert f"plugin {FP8} " in text and "provides kv_codec 'fp8'" in text
    assert "installed and not loaded" in text and refusal in text, text


def test_the_same_sources_load_the_plugin_when_nothing_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch, tiny: dict
) -> None:
    # the control of the test above: fp8 is used when no source leaves it out
    monkeypatch.setenv("TALLOW_PLUGINS__DISABLE", HERMES)
    engine = LLM(**tiny, kv_codec="fp8").engine
    assert "fp8" in engine.plugin_manager.registries.kv_codecs
    assert engine.parts.core.runner.kv_caches[0]["k"].dtype != engine.parts.loaded.dtype
    assert "hermes" not in engine.plugin_manager.registries.tool_parsers

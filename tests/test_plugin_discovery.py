"""Discovery and loading of real installed plugin distributions.

The distributions under tests/plugin_fixtures/ are built and installed (pip, into a temporary
directory) once per module; the tests then find them through their ``tallow`` entry points, in
fresh processes (``python -m tallow plugins list``) and in this one.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tallow.plugin.manager import (
    PluginError,
    PluginLoadError,
    load_pinned_plugins,
    load_plugins,
)

FIXTURES = Path(__file__).parent / "plugin_fixtures"


def _fixture_meta() -> dict[str, dict[str, str]]:
    """name → {version, entry_point} read from each fixture's pyproject.toml."""
    out = {}
    for pyproject in sorted(FIXTURES.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        ((ep_name, ep_value),) = project["entry-points"]["tallow"].items()
        out[project["name"]] = {
            "version": project["version"],
            "entry_point": f"{ep_name} = {ep_value}",
        }
    return out


META = _fixture_meta()
GOOD, BROKEN, HALFWAY = "tallow-fixture-good", "tallow-fixture-broken", "tallow-fixture-halfway"
DUP, OVERRIDE, TYPO = "tallow-fixture-dup", "tallow-fixture-override", "tallow-fixture-typo"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the fixture distributions are pip-installed into (sources copied first so
    the build leaves nothing in the tree)."""
    src = tmp_path_factory.mktemp("fixture-src")
    target = tmp_path_factory.mktemp("fixture-site")
    dirs = []
    for pyproject in sorted(FIXTURES.glob("*/pyproject.toml")):
        dest = src / pyproject.parent.name
        shutil.copytree(
            pyproject.parent,
            dest,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
        )
        dirs.append(str(dest))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *dirs,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return target


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _tallow(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tallow", *args],
        capture_output=True,
        text=True,
        env=_env(site, **env),
        timeout=120,
    )


def _by_name(stdout: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in json.loads(stdout)}


class _RecordingEntryPoint:
    """A real entry point whose ``load`` calls are counted (to prove filtering precedes import)."""

    loads: list[str] = []

    def __init__(self, ep: metadata.EntryPoint) -> None:
        self._ep = ep
        self.name, self.value, self.dist = ep.name, ep.value, ep.dist

    def load(self) -> Any:
        _RecordingEntryPoint.loads.append(self.name)
        return self._ep.load()


@pytest.fixture
def eps(site: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The fixture distributions' entry points, importable, with load() recorded."""
    monkeypatch.syspath_prepend(str(site))
    _RecordingEntryPoint.loads = []
    found = [
        _RecordingEntryPoint(ep)
        for dist in metadata.distributions(path=[str(site)])
        for ep in dist.entry_points
        if ep.group == "tallow"
    ]
    assert sorted(ep.name for ep in found) == sorted(META)
    return found


# ---------------------------------------------------------------------------------------------
# fresh processes
# ---------------------------------------------------------------------------------------------
def test_autoload_in_a_fresh_process_isolates_each_failure(site: Path) -> None:
    proc = _tallow(site, "plugins", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    plugins = _by_name(proc.stdout)
    for name, meta in META.items():
        assert plugins[name]["version"] == meta["version"]
        assert plugins[name]["entry_point"] == meta["entry_point"]
        assert plugins[name]["mode"] == "autoload"

    assert plugins[GOOD]["status"] == "ok"
    assert plugins[GOOD]["components"] == {
        "attention_backend": ["fixture-attn"],
        "tool_parser": ["fixture-parser"],
    }
    broken = plugins[BROKEN]
    assert broken["status"] == "failed" and broken["components"] == {}
    assert "RuntimeError: tallow-fixture-broken fails on import on purpose" in broken["reason"]
    assert "tallow_fixture_broken" in broken["reason"]  # where it was raised
    halfway = plugins[HALFWAY]
    assert halfway["status"] == "failed"
    assert "second registration hook" in halfway["reason"]
    # what it registered before failing was rolled back
    every_component = [
        n for p in plugins.values() for names in p["components"].values() for n in names
    ]
    assert "fixture-halfway-kv" not in every_component
    assert plugins[DUP]["status"] == "failed"
    assert "'torch' is already registered by tallow" in plugins[DUP]["reason"]
    assert "override=True" in plugins[DUP]["reason"]
    assert plugins[OVERRIDE]["status"] == "ok"
    assert plugins[OVERRIDE]["components"] == {"attention_backend": ["torch"]}
    assert "torch" not in plugins["tallow"]["components"].get("attention_backend", [])
    assert plugins[TYPO]["status"] == "failed"
    assert "did you mean tallow_register_attention_backends" in plugins[TYPO]["reason"]
    # failures are reported on stderr too, and the override is logged
    assert "tallow-fixture-broken" in proc.stderr and "skipped" in proc.stderr
    assert "overridden by tallow-fixture-override" in proc.stderr


def test_empty_tallow_plugins_loads_no_external_plugin(site: Path) -> None:
    proc = _tallow(site, "plugins", "list", "--json", TALLOW_PLUGINS="")
    assert proc.returncode == 0, proc.stderr
    plugins = _by_name(proc.stdout)
    assert plugins["tallow"]["status"] == "ok"
    for name, status in plugins.items():
        if name != "tallow":
            assert status["status"] == "disabled", name
            assert "TALLOW_PLUGINS" in status["reason"]
    assert set(META) <= set(plugins)


def test_tallow_plugins_names_exactly_what_loads(site: Path) -> None:
    proc = _tallow(site, "plugins", "list", "--json", TALLOW_PLUGINS=GOOD)
    assert proc.returncode == 0, proc.stderr
    plugins = _by_name(proc.stdout)
    loaded = {n for n, p in plugins.items() if p["status"] == "ok"}
    assert loaded == {"tallow", GOOD}
    assert plugins[GOOD]["mode"] == "enabled"


def test_required_plugin_failure_stops_start_up_naming_everything(site: Path) -> None:
    proc = _tallow(site, "plugins", "list", "--require-plugin", BROKEN)
    assert proc.returncode == 1
    meta = META[BROKEN]
    for fact in (
        BROKEN,
        meta["version"],
        meta["entry_point"],
        "RuntimeError: tallow-fixture-broken fails on import on purpose",
        "required",
    ):
        assert fact in proc.stderr, (fact, proc.stderr)
    assert proc.stdout == ""


# ---------------------------------------------------------------------------------------------
# this process, same installed distributions
# ---------------------------------------------------------------------------------------------
def test_enabled_plugin_failure_is_fatal_with_the_original_error(eps: list[Any]) -> None:
    with pytest.raises(PluginLoadError) as info:
        load_plugins({"autoload": False, "enable": [HALFWAY]}, env={}, entry_points=eps)
    err = info.value
    assert (err.distribution, err.version, err.entry_point) == (
        HALFWAY,
        META[HALFWAY]["version"],
        META[HALFWAY]["entry_point"],
    )
    assert isinstance(err.cause, ValueError) and err.__cause__ is err.cause
    assert "fails in its second registration hook" in str(err)


def test_autoload_failures_are_skipped_and_rolled_back(eps: list[Any]) -> None:
    pm = load_plugins({"autoload": True}, env={}, entry_points=eps)
    status = {s.name: s for s in pm.statuses()}
    assert status[GOOD].status == "ok" and status[BROKEN].status == "failed"
    assert status[HALFWAY].status == "failed"
    assert "fixture-halfway-kv" not in pm.registries.kv_codecs
    # the failed plugin is not left registered with pluggy: it never sees the configuration
    assert pm.pluggy.get_plugin(HALFWAY) is None
    impls = [i.plugin_name for i in pm.pluggy.hook.tallow_configure.get_hookimpls()]
    assert HALFWAY not in impls
    # the good plugin reads its settings; the failed one's implementation would raise
    pm.configure(SimpleNamespace(plugins=SimpleNamespace(settings={})))
    entry = pm.registries.attention_backends.entry("fixture-attn")
    assert (entry.distribution, entry.version) == (GOOD, META[GOOD]["version"])


def test_disable_filters_before_importing(eps: list[Any]) -> None:
    pm = load_plugins({"disable": [BROKEN, HALFWAY, DUP, TYPO, OVERRIDE]}, env={}, entry_points=eps)
    assert _RecordingEntryPoint.loads == [GOOD]
    status = {s.name: s for s in pm.statuses()}
    assert status[BROKEN].status == "disabled" and "plugins.disable" in status[BROKEN].reason
    assert status[GOOD].status == "ok"


def test_autoload_off_loads_only_enabled(eps: list[Any]) -> None:
    pm = load_plugins({"autoload": False, "enable": [GOOD]}, env={}, entry_points=eps)
    assert _RecordingEntryPoint.loads == [GOOD]
    assert {s.name for s in pm.statuses() if s.status == "ok"} == {"tallow", GOOD}
    assert "autoload is off" in pm.status(BROKEN).reason


def test_require_with_satisfied_version(eps: list[Any]) -> None:
    version = META[GOOD]["version"]
    pm = load_plugins(
        {"autoload": False, "require": [f"{GOOD}>={version},<99"]}, env={}, entry_points=eps
    )
    assert pm.status(GOOD).status == "ok" and pm.status(GOOD).mode == "required"


def test_require_with_unsatisfied_version_fails_before_any_import(eps: list[Any]) -> None:
    version = META[GOOD]["version"]
    with pytest.raises(PluginError) as info:
        load_plugins({"require": [f"{GOOD}>99"]}, env={}, entry_points=eps)
    assert f"{GOOD}>99 is required" in str(info.value)
    assert f"{GOOD} {version} is installed" in str(info.value)
    assert _RecordingEntryPoint.loads == []


def test_require_missing_and_conflicts(eps: list[Any]) -> None:
    with pytest.raises(PluginError, match="tallow-nowhere is required .* not installed"):
        load_plugins({"require": ["tallow-nowhere"]}, env={}, entry_points=eps)
    with pytest.raises(PluginError, match="both required .* and disabled"):
        load_plugins({"require": [GOOD], "disable": [GOOD]}, env={}, entry_points=eps)
    with pytest.raises(PluginError, match="TALLOW_PLUGINS='' leaves it out"):
        load_plugins({"require": [GOOD]}, env={"TALLOW_PLUGINS": ""}, entry_points=eps)
    assert _RecordingEntryPoint.loads == []


def test_names_that_match_nothing_installed_warn(
    eps: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tallow.plugin"):
        load_plugins(
            {
                "autoload": False,
                "enable": ["tallow-nope"],
                "disable": ["tallow-nix"],
                "settings": {"tallow-nada": {"a": 1}},
            },
            env={"TALLOW_PLUGINS": f"{GOOD},tallow-zilch"},
            entry_points=eps,
        )
    text = caplog.text
    for name in ("tallow-nope", "tallow-nix", "tallow-nada", "tallow-zilch"):
        assert f"names {name}, which is not an installed tallow plugin" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tallow.plugin"):
        load_plugins(
            {"autoload": False, "settings": {"Tallow_Fixture_Good": {}}}, env={}, entry_points=eps
        )
    assert f"key 'Tallow_Fixture_Good' should be spelled '{GOOD}'" in caplog.text


def test_configure_reaches_plugin_settings(eps: list[Any]) -> None:
    from tallow.config import config_from_mapping

    pm = load_plugins({"autoload": False, "enable": [GOOD]}, env={}, entry_points=eps)
    config = config_from_mapping({"plugins": {"settings": {GOOD: {"answer": 42}}}})
    import tallow_fixture_good.plugin as good

    good.received_settings.clear()
    pm.hook.tallow_configure(config=config)
    assert good.received_settings == [{"answer": 42}]


def test_pinned_plugins_match_the_driver(eps: list[Any]) -> None:
    driver = load_plugins({"autoload": False, "enable": [GOOD]}, env={}, entry_points=eps)
    worker = load_pinned_plugins(driver.loaded(), entry_points=eps)
    assert worker.loaded() == driver.loaded()
    assert (
        worker.registries.attention_backends.names() == driver.registries.attention_backends.names()
    )
    with pytest.raises(PluginError, match=f"{GOOD}==0.0.1 is required"):
        load_pinned_plugins({**driver.loaded(), GOOD: "0.0.1"}, entry_points=eps)
    with pytest.raises(PluginError, match="driver runs tallow 0.0.0"):
        load_pinned_plugins({"tallow": "0.0.0"}, entry_points=eps)

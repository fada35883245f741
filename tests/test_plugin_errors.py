"""Plugin errors that say which plugin: a lazy target that does not import or resolve
(ComponentLoadError, ``tallow plugins list`` showing the plugin ``broken``), and lookups of a
component that an installed but left-out plugin provides ("installed but not loaded")."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from tallow import cli
from tallow.engine.llm import LLM
from tallow.engine.loader import choose_weight_format
from tallow.plugin import (
    ComponentLoadError,
    PluginLoadError,
    RegistryError,
    SelectionError,
    choose_tool_parser,
    hookimpl,
    select,
)
from tallow.plugin.manager import load_plugins
from tallow.plugin.target_check import target_problem
from tallow.plugin.testing import isolated_plugin_manager, make_config


pytestmark = pytest.mark.usefixtures("no_tallow_env")


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def forget_modules() -> Iterator[None]:
    """Modules the test imports from its temporary directories are dropped afterwards."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("tgt_", "tallow_fixture_badtarget")):
            del sys.modules[name]


# ---------------------------------------------------------------------------------------------
# a target that fails when it is first used
# ---------------------------------------------------------------------------------------------
class RegistersCodec:
    def __init__(self, target: str) -> None:
        self.target = target

    @hookimpl
    def tallow_register_kv_codecs(self, registry: Any) -> None:
        registry.register("typo", self.target)


def entry_of(target: str, pm: Any = None) -> Any:
    pm = pm or isolated_plugin_manager()
    pm.add_plugin(
        RegistersCodec(target),
        "tallow-typo",
        "1.2.3",
        entry_point="tallow-typo = tallow_typo.plugin",
    )
    return pm.registries.kv_codecs.entry("typo")


@pytest.mark.parametrize(
    "target, detail, cause",
    [
        (
            "tallow.config.models:TallowConfg",
            "module tallow.config.models has no attribute 'TallowConfg' (did you mean 'TallowConfig'?)",
            AttributeError,
        ),
        (
            "tallow.config.models:TallowConfig.Nested",
            "tallow.config.models:TallowConfig has no attribute 'Nested'",
            AttributeError,
        ),
        (
            "tallow.config.modls:TallowConfig",
            "ModuleNotFoundError: No module named 'tallow.config.modls'",
            ModuleNotFoundError,
        ),
    ],
)
def test_a_target_that_does_not_resolve_names_plugin_target_and_problem(
    target: str, detail: str, cause: type
) -> None:
    entry = entry_of(target)
    with pytest.raises(ComponentLoadError) as info:
        entry.load()
    err = info.value
    assert str(err) == (
        f"kv_codec 'typo' of plugin tallow-typo 1.2.3 (entry point tallow-typo "
        f"= tallow_typo.plugin) cannot be loaded: its target {target!r} fails: "
        f"{detail}"
    )
    assert isinstance(err, PluginLoadError) and isinstance(err.cause, cause)
    assert (err.distribution, err.version, err.entry_point) == (
        "tallow-typo",
        "1.2.3",
        "tallow-typo = tallow_typo.plugin",
    )
    assert (err.kind, err.component, err.target, err.detail) == ("kv_codec", "typo", target, detail)
    assert err.__cause__ is err.cause


def test_a_target_whose_module_raises_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_modules: None
) -> None:
    write_tree(tmp_path, {"tgt_boom.py": "x = 1\nraise RuntimeError('no CUDA toolkit')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ComponentLoadError) as info:
        entry_of("tgt_boom:Codec").load()
    assert info.value.detail == (
        f"RuntimeError: no CUDA toolkit (raised at {tmp_path / 'tgt_boom.py'}:2)"
    )


def test_selection_and_the_engine_report_the_broken_target(tiny: dict) -> None:
    isolated = isolated_plugin_manager()
    entry_of("tallow.config.models:TallowConfg", isolated)
    with pytest.raises(SelectionError) as info:
        select(isolated.registries.kv_codecs, make_config({}), "typo")
    assert (
        "kv_codec 'typo' (from tallow-typo) cannot serve this configuration:\n  - kv_codec "
        "'typo' of plugin tallow-typo 1.2.3 (entry point tallow-typo = tallow_typo.plugin) "
        "cannot be loaded" in str(info.value)
    )
    pm = load_plugins(None, env={})
    entry_of("tallow.config.models:TallowConfg", pm)
    with pytest.raises(
        SelectionError,
        match=r"(?s)cache.kv_codec 'typo': .*of plugin "
        r"tallow-typo 1.2.3 .* has no attribute",
    ):
        LLM(**tiny, kv_codec="typo", plugin_manager=pm)


# ---------------------------------------------------------------------------------------------
# finding targets without importing them
# ---------------------------------------------------------------------------------------------
MODULES = {
    "tgt_pkg/__init__.py": "",
    "tgt_pkg/mod.py": """
        import json as _json
        from os import path as ospath

        class Good:
            pass

        def factory():
            return Good

        CONSTANT, (OTHER, THIRD) = 1, (2, 3)
        try:
            from json import dumps as fast_dumps
        except ImportError:
            fast_dumps = None
        if CONSTANT:
            class Conditional:
                pass
        """,
    "tgt_pkg/lazy.py": "def __getattr__(name):\n    return name\n",
    "tgt_pkg/star.py": "from os.path import *\n",
    "tgt_pkg/bad.py": "class Broken(:\n    pass\n",
    "tgt_guard/__init__.py": "raise RuntimeError('a parent package was imported')\n",
    "tgt_guard/mod.py": "class Good:\n    pass\n",
}


@pytest.mark.parametrize(
    "target, problem",
    [
        ("tgt_pkg.mod:Good", None),
        ("tgt_pkg.mod:factory", None),
        ("tgt_pkg.mod:THIRD", None),
        ("tgt_pkg.mod:fast_dumps", None),
        ("tgt_pkg.mod:ospath", None),
        ("tgt_pkg.mod:Conditional", None),
        ("tgt_pkg.lazy:Anything", None),
        ("tgt_pkg.star:Anything", None),
        ("tgt_guard.mod:Good", None),
        ("tgt_pkg.mod:Goood", "module tgt_pkg.mod has no attribute 'Goood' (did you mean 'Good'?)"),
        ("tgt_guard.mod:Bad", "module tgt_guard.mod has no attribute 'Bad'"),
        ("tgt_pkg.mood:Good", "no module named 'tgt_pkg.mood'"),
        ("tgt_nowhere.mod:Good", "no module named 'tgt_nowhere.mod'"),
        ("tgt_pkg.bad:Broken", "module tgt_pkg.bad does not compile: invalid syntax ("),
        ("tgt_pkg.mod", "'tgt_pkg.mod' is not of the form 'module:attr'"),
    ],
)
def test_target_problem_reads_the_source_and_imports_nothing(
    target: str,
    problem: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    forget_modules: None,
) -> None:
    write_tree(tmp_path, MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = target_problem(target)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found
    assert not [m for m in sys.modules if m.startswith("tgt_")]


def test_target_problem_agrees_with_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_modules: None
) -> None:
    write_tree(tmp_path, MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    for target in (
        "tgt_pkg.mod:Good",
        "tgt_pkg.mod:Goood",
        "tgt_pkg.mood:Good",
        "tgt_pkg.bad:Broken",
        "tgt_pkg.mod:Conditional",
    ):
        static = target_problem(target)
        try:
            entry_of(target).load()
        except ComponentLoadError:
            imports = False
        else:
            imports = True
        assert (static is None) == imports, target


# ---------------------------------------------------------------------------------------------
# `tallow plugins list` resolves the targets
# ---------------------------------------------------------------------------------------------
BAD_DIST = "tallow-fixture-badtarget"
BAD_PLUGIN = {
    "tallow_fixture_badtarget/__init__.py": "",
    "tallow_fixture_badtarget/plugin.py": """
        from tallow.plugin import hookimpl

        @hookimpl
        def tallow_register_tool_parsers(registry):
            registry.register("badtarget", "tallow_fixture_badtarget.parser:BadTargetParsr")
            registry.register("deptarget", "tallow_fixture_badtarget.needs_dep:Parser")
        """,
    "tallow_fixture_badtarget/parser.py": "class BadTargetParser:\n    pass\n",
    "tallow_fixture_badtarget/needs_dep.py": "import tallow_not_installed_dependency\n\n\n"
    "class Parser:\n    pass\n",
    "tallow_fixture_badtarget-0.3.0.dist-info/METADATA": f"Metadata-Version: 2.1\n"
    f"Name: {BAD_DIST}\nVersion: 0.3.0\n",
    "tallow_fixture_badtarget-0.3.0.dist-info/entry_points.txt": f"[tallow]\n{BAD_DIST} = tallow_fixture_badtarget.plugin\n",
}
BAD_EP = f"{BAD_DIST} = tallow_fixture_badtarget.plugin"
TYPO_REASON = (
    "tool_parser 'badtarget': target 'tallow_fixture_badtarget.parser:BadTargetParsr'"
    ": module tallow_fixture_badtarget.parser has no attribute 'BadTargetParsr' (did "
    "you mean 'BadTargetParser'?)"
)
DEP_REASON = (
    "tool_parser 'deptarget': target 'tallow_fixture_badtarget.needs_dep:Parser': "
    "ModuleNotFoundError: No module named 'tallow_not_installed_dependency'"
)


@pytest.fixture
def bad_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_modules: None) -> Path:
    """An installed distribution (a dist-info on sys.path) whose targets do not resolve."""
    site = write_tree(tmp_path / "site", BAD_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TALLOW_PLUGINS", BAD_DIST)  # only it loads: fast
    assert metadata.version(BAD_DIST) == "0.3.0"
    return site


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    capsys.readouterr()
    assert cli.main(["plugins", "list", "--json", *args]) == 0
    return {p["name"]: p for p in json.loads(capsys.readouterr().out)}


def test_plugins_list_shows_a_plugin_with_a_typo_in_a_target_as_broken(
    bad_site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = listed(capsys)[BAD_DIST]
    assert (row["status"], row["version"], row["entry_point"]) == ("broken", "0.3.0", BAD_EP)
    assert row["reason"] == TYPO_REASON  # the missing dependency needs an import to be seen
    assert row["components"] == {"tool_parser": ["badtarget", "deptarget"]}
    assert "tallow_fixture_badtarget.parser" not in sys.modules
    assert cli.main(["plugins", "list"]) == 0
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if line.startswith(BAD_DIST))
    assert line.split()[:4] == [BAD_DIST, "0.3.0", "broken", "enabled"]
    assert line.endswith(TYPO_REASON)


def test_plugins_list_import_components_also_catches_a_missing_dependency(
    bad_site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = listed(capsys, "--import-components")[BAD_DIST]
    assert row["status"] == "broken"
    assert row["reason"] == (
        f"{TYPO_REASON}; {DEP_REASON} (raised at "
        f"{bad_site / 'tallow_fixture_badtarget' / 'needs_dep.py'}:1)"
    )
    assert listed(capsys, "--import-components")["tallow"]["status"] == "ok"


def test_using_the_broken_component_names_the_installed_plugin(bad_site: Path) -> None:
    pm = load_plugins(None)
    with pytest.raises(ComponentLoadError) as info:
        pm.registries.tool_parsers.entry("badtarget").load()
    err = info.value
    assert (err.distribution, err.version, err.entry_point) == (BAD_DIST, "0.3.0", BAD_EP)
    assert str(err).startswith(
        f"tool_parser 'badtarget' of plugin {BAD_DIST} 0.3.0 (entry point "
        f"{BAD_EP}) cannot be loaded: its target "
        "'tallow_fixture_badtarget.parser:BadTargetParsr' fails: "
    )


# ---------------------------------------------------------------------------------------------
# installed, but not loaded
# ---------------------------------------------------------------------------------------------
def provided(dist: str, kind: str, names: str) -> str:
    return (
        f"plugin {dist} {metadata.version(dist)} provides {kind} {names} but is installed "
        "and not loaded: "
    )


DISABLED = "disabled by plugins.disable; take it out of plugins.disable to load it"


def test_an_architecture_of_a_disabled_plugin(tiny: dict) -> None:
    with pytest.raises(SelectionError) as info:
        LLM(**tiny, plugins={"disable": ["tallow-model-llama"]})
    # other installed model plugins' architectures are listed as loaded; Llama's is not
    head, _, rest = str(info.value).partition("; ")
    loaded = re.fullmatch(
        r"no model plugin implements architecture 'LlamaForCausalLM' "
        r"\(loaded: ([^)]*)\)",
        head,
    )
    assert loaded is not None, head
    assert "LlamaForCausalLM" not in loaded.group(1)
    assert rest == (
        provided("tallow-model-llama", "architecture", "'LlamaForCausalLM'")
        + "disabled by plugins.disable (from LLM() keyword plugins); take it out "
        "of plugins.disable to load it"
    )


def test_a_gguf_architecture_of_a_disabled_plugin() -> None:
    pm = load_plugins({"disable": ["tallow-model-llama"]}, env={})
    with pytest.raises(RegistryError) as info:
        pm.registries.architectures.for_gguf("qwen2")
    assert str(info.value).endswith(
        "; " + provided("tallow-model-llama", "architecture", "'Qwen2ForCausalLM'") + DISABLED
    )


def test_a_weight_format_of_a_disabled_plugin(tmp_path: Path) -> None:
    pm = load_plugins({"disable": ["tallow-format-gguf"]}, env={})
    with pytest.raises(RegistryError) as named:
        choose_weight_format(pm.registries, str(tmp_path / "m.gguf"), "gguf")
    assert str(named.value).startswith("unknown weight_format 'gguf' (registered: ")
    assert str(named.value).endswith(
        "; " + provided("tallow-format-gguf", "weight_format", "'gguf'") + DISABLED
    )
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(SelectionError) as auto:
        choose_weight_format(pm.registries, str(tmp_path / "m.gguf"), None)
    assert str(auto.value).startswith("no weight format recognises the model source")
    assert str(auto.value).endswith(
        "; " + provided("tallow-format-gguf", "weight_format", "'gguf'") + DISABLED
    )


def test_a_quant_scheme_of_a_disabled_plugin(tiny: dict) -> None:
    with pytest.raises(SelectionError) as info:
        LLM(**tiny, isq="q4_k", plugins={"disable": ["tallow-quant-gguf"]})
    assert str(info.value).startswith("model.isq 'q4_k': no installed quant scheme can quantize")
    assert str(info.value).endswith(
        "; " + provided("tallow-quant-gguf", "quant_scheme", "'gguf'") + "disabled by "
        "plugins.disable (from LLM() keyword plugins); take it out of plugins.disable to load "
        "it"
    )


def test_an_attention_backend_of_a_disabled_plugin(tiny: dict) -> None:
    with pytest.raises(SelectionError) as info:
        LLM(**tiny, attention_backend="triton", plugins={"disable": ["tallow-attention-triton"]})
    text = str(info.value)
    registered = re.match(r"unknown attention_backend 'triton' \(registered: ([^)]*)\); ", text)
    assert registered and "torch" in registered.group(1).split(", "), text
    assert "triton" not in registered.group(1)
    assert provided("tallow-attention-triton", "attention_backend", "'triton'") in text


def test_a_kv_codec_left_out_by_tallow_plugins() -> None:
    pm = load_plugins(None, env={"TALLOW_PLUGINS": "tallow-model-llama"})
    with pytest.raises(RegistryError) as info:
        pm.registries.kv_codecs.entry("fp8_e5m2")
    assert str(info.value) == (
        "unknown kv_codec 'fp8_e5m2' (registered: auto); "
        + provided("tallow-kvcache-fp8", "kv_codec", "'fp8_e5m2'")
        + "not listed in TALLOW_PLUGINS='tallow-model-llama'; add it to TALLOW_PLUGINS, or unset "
        "TALLOW_PLUGINS, to load it"
    )


def test_a_tool_parser_of_a_plugin_left_out_by_autoload() -> None:
    pm = load_plugins({"autoload": False}, env={})
    with pytest.raises(SelectionError) as info:
        choose_tool_parser(pm.registries.tool_parsers, "m", None, name="hermes")
    assert str(info.value) == (
        "server.tool_parser: unknown tool_parser 'hermes' (registered: none); "
        + provided("tallow-tool-hermes", "tool_parser", "'hermes'")
        + "plugins.autoload is off and it is not in plugins.enable; add it to plugins.enable "
        "(or turn plugins.autoload on) to load it"
    )


def test_a_plugin_that_failed_to_load_is_named_as_a_possible_provider() -> None:
    class FailsToRegister:
        @hookimpl
        def tallow_register_kv_codecs(self, registry: Any) -> None:
            raise ValueError("bad registration")

    pm = isolated_plugin_manager()
    assert pm.add_plugin(FailsToRegister(), "tallow-flaky", "0.2", fatal=False).status == "failed"
    with pytest.raises(RegistryError) as info:
        pm.registries.kv_codecs.entry("fp4")
    assert str(info.value).startswith(
        "unknown kv_codec 'fp4' (registered: none); did you mean 'fp8'?; installed plugins that "
        "failed to load, and may provide it: tallow-flaky 0.2 (ValueError: bad registration"
    )


def test_no_hint_when_nothing_is_left_out() -> None:
    pm = load_plugins(None, env={})
    with pytest.raises(RegistryError) as info:
        pm.registries.kv_codecs.entry("fp4")
    assert str(info.value).startswith(
        "unknown kv_codec 'fp4' (registered: auto, fp8, "
        "fp8_e4m3, fp8_e5m2, turbo3, turbo4, turbo8); did you "
        "mean 'fp8'?"
    )

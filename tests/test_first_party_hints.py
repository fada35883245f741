"""Errors name the fix (issue 46): an unknown component that a first-party plugin provides
names the distribution and its pip command; an unknown name close to a known one gets "did you
mean"; ``tallow serve`` checks its named parsers before the model loads."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tallow.plugin import RegistryError
from tallow.plugin.first_party import FIRST_PARTY
from tallow.plugin.registry import ReasoningParserRegistry, ToolParserRegistry
from tallow.plugin.selection import SelectionError


def test_a_first_party_parser_that_is_not_installed_names_its_package() -> None:
    registry = ToolParserRegistry()
    with pytest.raises(RegistryError) as caught:
        registry.entry("hermes")
    message = str(caught.value)
    assert "unknown tool_parser 'hermes' (registered: none)" in message
    assert "first-party plugin tallow-tool-hermes: pip install tallow-tool-hermes" in message


def test_a_typo_gets_did_you_mean() -> None:
    registry = ReasoningParserRegistry()
    registry.register("think", "tallow_reasoning_think.parser:ThinkReasoningParser")
    with pytest.raises(RegistryError, match=r"did you mean 'think'\?"):
        registry.entry("thinkk")


def test_the_table_names_real_first_party_distributions() -> None:
    from pathlib import Path

    plugins = Path(__file__).parents[1] / "plugins"
    names = {
        line.split('"')[1]
        for toml in plugins.glob("*/*/pyproject.toml")
        for line in toml.read_text().splitlines()
        if line.startswith("name = ")
    }
    for kind, table in FIRST_PARTY.items():
        for component, dist in table.items():
            assert dist in names, (kind, component, dist)


@pytest.mark.parametrize(
    "flag, name, expected",
    [
        ("--tool-parser", "hermse", "did you mean 'hermes'"),
        ("--reasoning-parser", "thnk", "did you mean 'think'"),
    ],
)
def test_serve_refuses_an_unknown_parser_before_loading_the_model(flag, name, expected) -> None:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "tallow", "serve", "--device", "cpu", "--port", "0", flag, name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{flag} {name!r}" in out.stderr and expected in out.stderr, out.stderr[-2000:]
    assert "loaded in" not in out.stderr  # the default model was never loaded
    assert time.monotonic() - started < 60


# -- the tool-provider status() contract ----------------------------------------------------
def test_the_status_contract_is_checked() -> None:
    from tallow.plugin import check_tool_provider_status

    good = {
        "sources": [
            {
                "name": "time",
                "state": "up",
                "tool_names": ["now"],
                "tools": 1,
                "error": "",
                "extra": {"free": "form"},
            }
        ]
    }
    assert check_tool_provider_status(good) == []
    assert check_tool_provider_status({}) == []
    bad = {"sources": [{"state": "running", "tool_names": "now", "tools": True}, 3]}
    problems = check_tool_provider_status(bad)
    assert any("'state'] is 'running'" in p for p in problems)
    assert any("'tool_names'] is str" in p for p in problems)
    assert any("'tools'] is bool" in p for p in problems)
    assert any("[1] is int" in p for p in problems)
    assert check_tool_provider_status([]) == ["status() returned list, not a dict"]


# -- models: architectures, GGUF architectures, weight formats, quant schemes -----------------


def _bare_plugins() -> object:
    """A plugin manager with the core's built-ins only (no plugin distribution loaded)."""
    from tallow.plugin.manager import load_plugins

    return load_plugins(None, env={}, entry_points=[])


def test_an_architecture_not_installed_names_its_model_plugin() -> None:
    from tallow import LLM

    with pytest.raises(SelectionError) as caught:
        LLM(
            model="random:tiny-llama",
            device="cpu",
            dtype="float32",
            max_model_len=64,
            plugin_manager=_bare_plugins(),
        )
    message = str(caught.value)
    assert "no model plugin implements architecture 'LlamaForCausalLM'" in message
    assert message.endswith(
        "it is provided by the first-party plugin tallow-model-llama: "
        "pip install tallow-model-llama"
    ), message


def test_a_gguf_architecture_not_installed_names_its_model_plugin() -> None:
    from tallow.plugin.registry import ArchitectureRegistry

    with pytest.raises(RegistryError) as caught:
        ArchitectureRegistry().for_gguf("qwen3moe")
    assert str(caught.value).endswith(
        "first-party plugin tallow-model-qwen-moe: pip install tallow-model-qwen-moe"
    ), str(caught.value)
    with pytest.raises(RegistryError, match=r"did you mean 'qwen3moe'"):
        ArchitectureRegistry().for_gguf("qwen3mo")


def test_a_gguf_file_without_the_gguf_format_names_its_plugin(tmp_path) -> None:
    from tallow import LLM

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(SelectionError) as caught:
        LLM(model=str(path), device="cpu", plugin_manager=_bare_plugins())
    message = str(caught.value)
    assert "no weight format recognises the model source" in message
    assert message.endswith(
        "first-party plugin tallow-format-gguf: pip install tallow-format-gguf"
    ), message


def test_a_named_quant_scheme_not_installed_names_its_plugin() -> None:
    from tallow.plugin.registry import QuantSchemeRegistry

    with pytest.raises(RegistryError) as caught:
        QuantSchemeRegistry().entry("int4")
    assert str(caught.value).endswith(
        "first-party plugin tallow-quant-int4: pip install tallow-quant-int4"
    )


def test_a_checkpoint_quant_method_names_its_plugin() -> None:
    from tallow.plugin.first_party import install_hint

    assert install_hint("quant_method", "gptq", []) == (
        "; it is provided by the first-party plugin tallow-quant-int4: "
        "pip install tallow-quant-int4"
    )


def test_the_table_lists_what_the_first_party_plugins_register() -> None:
    """Every component an installed first-party plugin registers is in the table under that
    plugin (architectures with their GGUF names, quant schemes with their checkpoint methods),
    so the table cannot fall behind the plugins."""
    from pathlib import Path

    from tallow.plugin.manager import load_plugins

    plugins = Path(__file__).parents[1] / "plugins"
    ours = {
        line.split('"')[1]
        for toml in plugins.glob("*/*/pyproject.toml")
        for line in toml.read_text().splitlines()
        if line.startswith("name = ")
    }
    registries = load_plugins(None, env={}).registries
    missing = []
    for registry in registries.all():
        for entry in registry:
            if entry.distribution not in ours or registry.kind == "route":
                continue
            if FIRST_PARTY.get(registry.kind, {}).get(entry.name) != entry.distribution:
                missing.append((registry.kind, entry.name, entry.distribution))
            for gguf in entry.meta.get("gguf", ()):
                if FIRST_PARTY["gguf_architecture"].get(gguf) != entry.distribution:
                    missing.append(("gguf_architecture", gguf, entry.distribution))
            for method in entry.meta.get("quant_methods", ()):
                if (
                    method != "compressed-tensors"
                    and FIRST_PARTY["quant_method"].get(method) != entry.distribution
                ):
                    missing.append(("quant_method", method, entry.distribution))
    assert not missing
    assert len(registries.architectures.names()) >= 20  # the plugins did load

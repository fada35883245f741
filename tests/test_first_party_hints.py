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
    names = {line.split('"')[1] for toml in plugins.glob("*/*/pyproject.toml")
             for line in toml.read_text().splitlines() if line.startswith("name = ")}
    for kind, table in FIRST_PARTY.items():
        for component, dist in table.items():
            assert dist in names, (kind, component, dist)


@pytest.mark.parametrize("flag, name, expected", [
    ("--tool-parser", "hermse", "did you mean 'hermes'"),
    ("--reasoning-parser", "thnk", "did you mean 'think'"),
])
def test_serve_refuses_an_unknown_parser_before_loading_the_model(flag, name, expected) -> None:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "tallow", "serve", "--device", "cpu",
                          "--port", "0", flag, name], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{flag} {name!r}" in out.stderr and expected in out.stderr, out.stderr[-2000:]
    assert "loaded in" not in out.stderr  # the default model was never loaded
    assert time.monotonic() - started < 60


# -- the tool-provider status() contract ----------------------------------------------------
def test_the_status_contract_is_checked() -> None:
    from tallow.plugin import check_tool_provider_status

    good = {"sources": [{"name": "time", "state": "up", "tool_names": ["now"], "tools": 1,
                         "error": "", "extra": {"free": "form"}}]}
    assert check_tool_provider_status(good) == []
    assert check_tool_provider_status({}) == []
    bad = {"sources": [{"state": "running", "tool_names": "now", "tools": True}, 3]}
    problems = check_tool_provider_status(bad)
    assert any("'state'] is 'running'" in p for p in problems)
    assert any("'tool_names'] is str" in p for p in problems)
    assert any("'tools'] is bool" in p for p in problems)
    assert any("[1] is int" in p for p in problems)
    assert check_tool_provider_status([]) == ["status() returned list, not a dict"]

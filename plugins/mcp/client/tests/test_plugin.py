"""Registration, settings, and the provider inside ``tallow serve``'s app (fake engine, the real
``mcp-server-time``)."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from mcp_fixtures import SDK_STDIO, TIME, settings_config

import tallow_mcp_client.plugin as plugin
from tallow.plugin import PluginSettingsError

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "servers, expected",
    [
        ({"t": {"command": "x", "colour": "red"}}, r"servers\.t\.colour: unknown key"),
        ({"t": {"command": "x", "url": "http://h/mcp"}}, r"servers\.t: .*exactly one of"),
        ({"t": {}}, r"servers\.t: .*exactly one of"),
        ({"t": {"url": "ftp://h/mcp"}}, r"servers\.t\.url: .*http:// or https://"),
        ({"t": {"url": "http://h/mcp", "args": ["-v"]}}, r"servers\.t: .*'args', 'env' and 'cwd'"),
        ({"t": {"command": "x", "headers": {"A": "b"}}}, r"servers\.t: .*'headers' belong"),
        (
            {"t": {"command": "x", "call_timeout": -1}},
            r"servers\.t\.call_timeout: .*greater than 0",
        ),
        ({"t": {"command": "x", "max_result_chars": "lots"}}, r"servers\.t\.max_result_chars: "),
        ({"bad name": {"command": "x"}}, r"servers: .*server name 'bad name'"),
    ],
)
def test_bad_settings_name_the_key(servers: dict[str, Any], expected: str) -> None:
    with pytest.raises(PluginSettingsError) as info:
        plugin.tallow_configure(settings_config(servers))
    assert re.search(r"plugins\.settings\.tallow-mcp-client\." + expected, str(info.value)), str(
        info.value
    )


def test_nothing_configured_means_no_provider() -> None:
    from tallow.plugin.testing import make_config
    from tallow_mcp_client.provider import MCPToolProvider

    assert MCPToolProvider.from_config(make_config({})) is None
    assert MCPToolProvider.from_config(settings_config({"t": {**TIME, "enabled": False}})) is None
    with pytest.raises(PluginSettingsError, match=r"tallow-mcp-client\.server: unknown key"):
        MCPToolProvider.from_config(
            make_config({"plugins": {"settings": {"tallow-mcp-client": {"server": {}}}}})
        )


def test_the_server_runs_mcp_tools_in_its_loop(plugin_manager_with_mcp: Any) -> None:
    """``tallow serve``'s app built from the plugin manager and a config naming
    mcp-server-time: the scripted model asks for the time in Tokyo and answers with what the
    tool returned."""
    sys.path.insert(0, str(_server_tests()))
    from server_fakes import FakeEngine
    from starlette.testclient import TestClient

    from tallow.server.app import build_app

    def script(prompt: str, params: Any, index: int) -> str:
        found = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
        if not found:
            return (
                '<tool_call>\n{"name": "get_current_time", "arguments": '
                '{"timezone": "Asia/Tokyo"}}\n</tool_call>'
            )
        return "In Tokyo it is " + json.loads(found[0])["datetime"]

    config = settings_config({"time": TIME})
    engine = FakeEngine(script, plugin_manager=plugin_manager_with_mcp)
    with TestClient(build_app(engine, config)) as client:
        tools = client.get("/v1/tools").json()
        (provider,) = tools["providers"]
        assert provider["name"] == "mcp" and provider["distribution"] == "tallow-mcp-client"
        assert [t["function"]["name"] for t in provider["tools"]] == [
            "get_current_time",
            "convert_time",
        ]
        (source,) = provider["status"]["sources"]
        assert source["state"] == "up" and source["transport"] == "stdio"
        statuses = client.get("/v1/plugins").json()["tool_providers"]
        assert statuses[0]["status"]["sources"][0]["name"] == "time"
        reply = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
                "server_tools": True,
            },
        ).json()
        message = reply["choices"][0]["message"]
        (entry,) = message["server_tool_calls"]
        result = json.loads(entry["result"]["content"])
        assert entry["provider"] == "mcp" and result["timezone"] == "Asia/Tokyo"
        assert message["content"] == "In Tokyo it is " + result["datetime"]


def test_a_server_killed_mid_call_still_completes_the_request(plugin_manager_with_mcp: Any) -> None:
    """The scripted model calls a tool that sleeps; its server process is killed meanwhile:
    the request completes, the model sees the error, and the server is restarted."""
    import os
    import signal
    import threading
    import time

    sys.path.insert(0, str(_server_tests()))
    from server_fakes import FakeEngine
    from starlette.testclient import TestClient

    from tallow.server.app import build_app

    def script(prompt: str, params: Any, index: int) -> str:
        found = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
        if found:
            return "The tool said: " + found[0]
        call = (
            {"name": "sleep", "arguments": {"seconds": 60}}
            if "Sleep a minute" in prompt
            else {"name": "pid", "arguments": {}}
        )
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    def ask(client: Any, question: str) -> dict[str, Any]:
        resp = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": question}], "server_tools": True},
        )
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["message"]

    config = settings_config({"sdk": {**SDK_STDIO, "retry_interval": 0.2}})
    engine = FakeEngine(script, plugin_manager=plugin_manager_with_mcp)
    with TestClient(build_app(engine, config)) as client:
        pid = int(
            ask(client, "What is your process id?")["server_tool_calls"][0]["result"]["content"]
        )
        killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
        killer.start()
        begun = time.monotonic()
        message = ask(client, "Sleep a minute.")
        killer.join()
        assert time.monotonic() - begun < 30
        (entry,) = message["server_tool_calls"]
        assert entry["result"]["is_error"] and "went away" in entry["result"]["content"]
        assert message["content"].startswith("The tool said: Error: ")
        deadline = time.monotonic() + 30
        while True:
            (source,) = client.get("/v1/tools").json()["providers"][0]["status"]["sources"]
            if source["state"] == "up" and source["connects"] == 2:
                break
            assert time.monotonic() < deadline, source
            time.sleep(0.1)
        again = ask(client, "What is your process id?")["server_tool_calls"][0]["result"]
        assert int(again["content"]) != pid


def _server_tests() -> Any:
    import pathlib

    return pathlib.Path(__file__).resolve().parents[4] / "tests" / "server"


@pytest.fixture
def plugin_manager_with_mcp() -> Any:
    """The installed plugins (tool parsers, tallow-mcp-client), as ``tallow serve`` loads them."""
    from tallow.plugin.manager import load_plugins

    pm = load_plugins(None)
    assert "mcp" in pm.registries.tool_providers
    return pm


def test_plugins_list_checks_the_servers(tmp_path) -> None:
    import subprocess

    config = tmp_path / "tallow.yaml"
    config.write_text(
        json.dumps(
            {
                "plugins": {
                    "settings": {
                        "tallow-mcp-client": {
                            "servers": {
                                "time": TIME,
                                "ghost": {"command": "/nonexistent/mcp-server"},
                            }
                        }
                    }
                }
            }
        )
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "plugins",
            "list",
            "--check-tools",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    rows = {
        line.split()[1]: line.split(None, 3)[2:]
        for line in run.stdout.splitlines()
        if line.startswith("mcp ")
    }
    assert rows["time"] == ["up", "get_current_time, convert_time"]
    assert rows["ghost"][0] == "down" and "/nonexistent/mcp-server" in rows["ghost"][1]
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "plugins",
            "list",
            "--json",
            "--check-tools",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    (mine,) = [p for p in json.loads(listed.stdout) if p["name"] == "tallow-mcp-client"]
    (provider,) = mine["tool_providers"]
    assert [s["state"] for s in provider["status"]["sources"]] == ["up", "down"]
    # bad settings stop the command with the key path
    config.write_text(
        json.dumps(
            {
                "plugins": {
                    "settings": {"tallow-mcp-client": {"servers": {"time": {**TIME, "timeout": 3}}}}
                }
            }
        )
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "plugins",
            "list",
            "--check-tools",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert bad.returncode == 1
    assert "plugins.settings.tallow-mcp-client.servers.time.timeout: unknown key" in bad.stderr

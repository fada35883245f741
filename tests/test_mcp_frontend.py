"""``tallow mcp`` (the model as an MCP server on stdio), driven by the official SDK's own client,
and the promise that ``tallow serve`` does not load the SDK when no MCP server is configured."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--model",
    "random:tiny-llama",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--num-blocks",
    "64",
    "--max-model-len",
    "256",
]


async def _session_calls(
    args: list[str], calls: list[tuple[str, dict[str, Any]]]
) -> tuple[list[Any], list[Any]]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "tallow", "mcp", *args])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            results = [await session.call_tool(name, arguments) for name, arguments in calls]
    return tools, results


@pytest.mark.timeout(300)
def test_tools_list_and_call_from_the_sdk_client() -> None:
    from tallow import LLM, SamplingParams

    tools, (text, bad, chat) = asyncio.run(
        _session_calls(
            TINY,
            [
                ("generate", {"prompt": "<1> <2> <3>", "max_tokens": 8}),
                ("generate", {"prompt": "<1>", "temperature": 5}),
                ("chat", {"messages": [{"role": "user", "content": "hi"}]}),
            ],
        )
    )
    by_name = {t.name: t for t in tools}
    assert sorted(by_name) == ["chat", "generate"]
    assert by_name["generate"].input_schema["required"] == ["prompt"]
    message = by_name["chat"].input_schema["$defs"]["Message"]
    assert message["properties"]["role"]["enum"] == ["system", "user", "assistant"]
    # the oracle: the offline engine, same model and settings, greedy
    llm = LLM(
        model="random:tiny-llama", device="cpu", dtype="float32", num_blocks=64, max_model_len=256
    )
    (expected,) = llm.generate("<1> <2> <3>", SamplingParams(max_tokens=8, temperature=0))
    assert not text.is_error and text.content[0].text == expected.outputs[0].text
    assert len(expected.outputs[0].token_ids) == 8
    # bad arguments and a model without a chat template: error results that say why
    assert bad.is_error and "temperature" in bad.content[0].text
    assert chat.is_error and "chat template" in chat.content[0].text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_default_model_answers_over_mcp() -> None:
    question = [{"role": "user", "content": "What is 2 + 2? Answer with the number only."}]
    tools, (chat, text) = asyncio.run(
        _session_calls(
            ["--device", "cpu", "--dtype", "float32", "--max-model-len", "1024"],
            [
                ("chat", {"messages": question, "max_tokens": 8}),
                ("generate", {"prompt": "def add(a, b):\n", "max_tokens": 12}),
            ],
        )
    )
    assert not chat.is_error and "4" in chat.content[0].text
    assert not text.is_error and "return" in text.content[0].text


def test_serving_without_mcp_servers_loads_no_sdk() -> None:
    code = (
        "import sys, json\n"
        f"sys.path.insert(0, {str(ROOT / 'tests' / 'server')!r})\n"
        "from server_fakes import FakeEngine\n"
        "from starlette.testclient import TestClient\n"
        "from tallow.plugin.manager import load_plugins\n"
        "from tallow.server.app import build_app\n"
        "engine = FakeEngine(plugin_manager=load_plugins(None))\n"
        "with TestClient(build_app(engine)) as client:\n"
        "    client.post('/v1/chat/completions', json={'messages': [{'role': 'user',"
        " 'content': 'hi'}]})\n"
        "    tools = client.get('/v1/tools').json()\n"
        "print(json.dumps([tools['providers'], sorted(m for m in sys.modules"
        " if m == 'mcp' or m.startswith('mcp.'))]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    providers, loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert providers == [] and loaded == []

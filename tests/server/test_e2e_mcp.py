"""The official ``openai`` SDK against a live ``tallow serve`` on the embedded default model
(Qwen2.5-Coder-0.5B-Instruct, CPU, greedy) with the real ``mcp-server-time`` configured: a
question that needs the current time gets an answer holding what the tool returned.

The 0.5B model follows a pattern better than an instruction: the conversation shows it one
exchange (a call, its result, an answer built from it) before asking about another zone. The
zone's time is only known to the tool, so an answer holding it shows the loop ran end to end.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterator

import openai
import pytest
from server_helpers import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "Qwen2.5-Coder-0.5B-Instruct"
EXAMPLE_RESULT = {
    "timezone": "Europe/Paris",
    "datetime": "2020-01-01T09:00:00+01:00",
    "day_of_week": "Wednesday",
    "is_dst": False,
}
QUESTION = [
    {"role": "user", "content": "What is the current time in Europe/Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_current_time",
                    "arguments": '{"timezone": "Europe/Paris"}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(EXAMPLE_RESULT, indent=2)},
    {
        "role": "assistant",
        "content": "The current time in Europe/Paris is 2020-01-01T09:00:00+01:00.",
    },
    {"role": "user", "content": "Now use the tool for Asia/Tokyo."},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    config = tmp_path_factory.mktemp("mcp") / "tallow.yaml"
    config.write_text(
        json.dumps(
            {
                "plugins": {
                    "settings": {
                        "tallow-mcp-client": {
                            "servers": {
                                "time": {
                                    "command": sys.executable,
                                    "args": ["-m", "mcp_server_time"],
                                    "allow": ["get_current_time"],
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    srv = ServeProcess(
        [
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-model-len",
            "2048",
            "--config",
            str(config),
            "--server-tools",
            "always",
        ]
    ).start()
    yield srv
    assert srv.stop() == 0, srv.log_text()[-3000:]


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _tool_time(entries: list[dict[str, Any]]) -> str:
    (entry,) = entries
    assert entry["function"]["name"] == "get_current_time" and entry["provider"] == "mcp"
    assert json.loads(entry["function"]["arguments"]) == {"timezone": "Asia/Tokyo"}
    assert not entry["result"]["is_error"]
    result = json.loads(entry["result"]["content"])
    assert result["timezone"] == "Asia/Tokyo"
    return result["datetime"]


def test_the_tools_are_listed(client: openai.OpenAI) -> None:
    listing = client.get("/tools", cast_to=object)
    (provider,) = listing["providers"]
    assert [t["function"]["name"] for t in provider["tools"]] == ["get_current_time"]
    assert provider["status"]["sources"][0]["state"] == "up"


def test_a_question_answered_with_the_time_servers_answer(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=120
    )
    (choice,) = reply.choices
    when = _tool_time(choice.message.server_tool_calls)
    assert when in choice.message.content
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    # both rounds are counted: the second prompt alone is longer than the first
    assert reply.usage.prompt_tokens > 2 * 300 and reply.usage.completion_tokens > 20


def test_the_stream_reports_the_call_and_streams_the_answer(client: openai.OpenAI) -> None:
    content, entries, finish = "", [], None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=120, stream=True
    ):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in (choice.delta.model_extra or {}).get("server_tool_calls", []):
                if "result" in part:
                    entries[part["index"]]["result"] = part["result"]
                else:
                    entries.append(dict(part))
            finish = choice.finish_reason or finish
    when = _tool_time(entries)
    assert when in content and finish == "stop"


def test_a_plain_question_ends_in_prose_with_the_tools_time(client: openai.OpenAI) -> None:
    """The issue-46 agent path: no example to follow. The 0.5B model answers with bare JSON
    calls and repeats its call; the repeat is not run, the next round has no tools and asks
    for the answer, and the reply is prose holding the time the tool returned."""
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the current time in Tokyo?"}],
        temperature=0,
        max_tokens=200,
    )
    (choice,) = reply.choices
    entries = choice.message.server_tool_calls
    assert entries and entries[0]["function"]["name"] == "get_current_time"
    when = json.loads(entries[0]["result"]["content"])["datetime"]
    assert choice.finish_reason == "stop"
    assert when in choice.message.content
    assert "{" not in choice.message.content  # prose, not JSON calls

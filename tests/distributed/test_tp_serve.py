"""``tallow serve --tensor-parallel-size 2`` with the official ``openai`` client: the tokens of
TP=1, then a worker killed in the middle of a generation: 503s, and every process gone within
the watchdog's bound.

One server serves the module; the last test kills it."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Iterator

import openai
import pytest
from server_helpers import ServeProcess
from tp_processes import SERVE_FLAGS, child_pids, complete_all, kill_group, wait_group_gone

pytestmark = pytest.mark.slow

#: the watchdog sees a spawned worker's death within 0.1 s and the driver exits 2 s later
#: (tallow.distributed.watchdog: POLL_S + EXIT_GRACE_S); slack for a loaded machine
EXIT_BOUND_S = 8.0


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, str]) -> Iterator[ServeProcess]:
    srv = ServeProcess(
        ["--model", checkpoints["llama"], *SERVE_FLAGS, "--tensor-parallel-size", "2"],
        new_session=True,
        timeout=180,
    ).start()
    yield srv
    srv.stop()
    kill_group(srv.proc.pid)


def test_openai_client_gets_the_tokens_of_tp1(
    server, checkpoints, served_prompts, served_reference
) -> None:
    texts = complete_all(server.url, checkpoints["llama"], served_prompts)
    assert texts == served_reference
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model=checkpoints["llama"],
        prompt=served_prompts[0],
        max_tokens=32,
        temperature=0.0,
        stream=True,
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == served_reference[0]


def test_a_killed_worker_gives_503_and_every_process_exits(server, checkpoints) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    (worker,) = child_pids(server.proc.pid)
    outcome: dict[str, Any] = {}

    def long_generation() -> None:
        try:
            client.completions.create(
                model=checkpoints["llama"],
                prompt="The quick brown fox",
                max_tokens=100,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
            outcome["finished"] = True
        except openai.APIStatusError as exc:
            outcome["status"], outcome["message"] = exc.status_code, exc.message

    request = threading.Thread(target=long_generation)
    request.start()
    time.sleep(0.5)  # the request is in the engine
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    request.join(30)
    assert outcome.get("status") == 503, outcome
    assert f"tensor-parallel rank 1 (pid {worker}) was killed by SIGKILL" in outcome["message"]
    try:  # a new request: refused the same way, or the server has already gone
        client.completions.create(model=checkpoints["llama"], prompt="x", max_tokens=2)
        raise AssertionError("a request succeeded after a worker was lost")
    except openai.APIStatusError as exc:
        assert exc.status_code == 503
    except openai.APIConnectionError:
        pass
    wait_group_gone(server.proc.pid, EXIT_BOUND_S - (time.monotonic() - killed))
    assert server.proc.wait(1) == 1
    # whichever notices first ends the process: the group's watchdog or the server's
    # dead-engine stop
    log = server.log_text()
    assert (
        "the tensor-parallel group cannot continue, exiting" in log
        or "the engine has failed; exiting with status 1" in log
    ), log[-2000:]

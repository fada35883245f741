"""Two "nodes" on loopback: two ``tallow serve`` launches with ``--nnodes 2``, two ranks each
(TP=4), meet at one rendezvous; node 0 serves HTTP and gives the tokens of TP=1, node 1 serves
none; Ctrl-C on node 0 (SIGINT to its whole process group, as a terminal sends it: its
spawned worker too) ends every rank of both, each with status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from server_helpers import ServeProcess, free_port
from tp_processes import SERVE_FLAGS, complete_all, wait_group_gone

pytestmark = pytest.mark.slow


def test_two_launches_with_nnodes_2_give_the_tokens_of_tp1(
    checkpoints, served_prompts, served_reference, sessions, tmp_path
) -> None:
    port = free_port()
    common = [
        "--model",
        checkpoints["llama"],
        *SERVE_FLAGS,
        "--tensor-parallel-size",
        "4",
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    node1_log = tmp_path / "node1.log"
    with open(node1_log, "w") as log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "tallow", "serve", *common, "--node-rank", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sessions.append(node1.pid)
    node0 = ServeProcess([*common, "--node-rank", "0"], new_session=True, timeout=180)
    try:
        node0.start()
        sessions.append(node0.proc.pid)
        texts = complete_all(node0.url, checkpoints["llama"], served_prompts)
        assert texts == served_reference
        os.killpg(node0.proc.pid, signal.SIGINT)
        assert node0.proc.wait(30) == 0, node0.log_text()[-3000:]
        assert node1.wait(30) == 0, node1_log.read_text()[-3000:]
        for pgid in sessions:
            wait_group_gone(pgid, 15)
    finally:
        if node0.proc is not None:
            sessions.append(node0.proc.pid)
    assert "tallow: serving" not in node1_log.read_text()  # HTTP on node 0 only

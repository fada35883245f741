"""Processes of the tensor-parallel tests: each started as the leader of a session of its
own, so that it and every process it starts (spawned workers) form one process group that
the tests can watch and kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def group_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` still alive (zombies aside)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_group_gone(pgid: int, timeout: float) -> float:
    """Seconds until no process of ``pgid`` is left; fails after ``timeout``."""
    started = time.monotonic()
    while group_members(pgid):
        if time.monotonic() - started > timeout:
            raise AssertionError(
                f"processes {group_members(pgid)} of group {pgid} still run {timeout:.0f}s later"
            )
        time.sleep(0.05)
    return time.monotonic() - started


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def run_driver(
    cases: list[dict[str, Any]],
    tensor_parallel_size: int,
    tmp_path: Path,
    sessions: list[int],
    timeout: float = 240,
) -> dict[str, dict[str, Any]]:
    """Run ``cases`` through ``LLM(tensor_parallel_size=...)`` in a driver process of its own
    (one group of workers for all of them); results by case name."""
    spec = tmp_path / f"tp{tensor_parallel_size}.json"
    spec.write_text(json.dumps({"tensor_parallel_size": tensor_parallel_size, "cases": cases}))
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "tp_cases.py"), str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    sessions.append(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(
            f"the TP={tensor_parallel_size} driver ran over {timeout}s:\n{err[-4000:]}"
        )
    results = {}
    for line in out.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            results[item["name"]] = item
    missing = [c["name"] for c in cases if c["name"] not in results]
    assert not missing, f"no result for {missing} (exit status {proc.returncode}):\n{err[-4000:]}"
    wait_group_gone(proc.pid, 15)
    return results


#: ``tallow serve`` flags of the tiny Llama with the budgets of ``tp_cases.TIGHT``
SERVE_FLAGS = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--block-size",
    "4",
    "--num-blocks",
    "40",
    "--max-model-len",
    "128",
    "--max-num-batched-tokens",
    "32",
    "--prefill-chunk-size",
    "8",
    "--max-num-seqs",
    "8",
    "--no-autoload-plugins",
    "--enable-plugin",
    "tallow-model-llama",
    "--enable-plugin",
    "tallow-format-safetensors",
]


def complete_all(base_url: str, model: str, prompts: list[str]) -> list[str]:
    """Greedy completions of ``prompts`` (32 tokens each) through the official client, all
    in flight at once."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def one(prompt: str) -> str:
        r = client.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0.0)
        return r.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))

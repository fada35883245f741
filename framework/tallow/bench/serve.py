"""`tallow bench serve`: requests with Poisson arrivals through the HTTP API of a running (or
started here) `tallow serve` → TTFT, TPOT and ITL percentiles."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from .common import lengths, mean, percentile, random_prompts

if TYPE_CHECKING:
    import httpx

    from tallow.config import TallowConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra_args: list[str], port: int, timeout: float = 900.0) -> subprocess.Popen:
    import httpx

    cmd = [
        sys.executable,
        "-m",
        "tallow",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tallow serve exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.terminate()
    raise TimeoutError("tallow serve did not become healthy in time")


async def _one(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    delay: float,
) -> dict[str, Any]:
    await asyncio.sleep(delay)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    start = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    if not stamps:
        return {"ttft": end - start, "itl": [], "tpot": float("nan"), "e2e": end - start}
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    tpot = (end - stamps[0]) / max(1, max_tokens - 1)
    return {"ttft": stamps[0] - start, "itl": itl, "tpot": tpot, "e2e": end - start}


async def _drive(
    base: str, model: str, prompts: list[list[int]], out_lens: list[int], rate: float, seed: int
) -> tuple[list[dict[str, Any]], float]:
    import httpx

    rng = random.Random(seed)
    t, delays = 0.0, []
    for _ in prompts:
        delays.append(t)
        t += rng.expovariate(rate) if rate > 0 else 0.0
    limits = httpx.Limits(max_connections=len(prompts) + 8)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *[
                _one(client, f"{base}/v1/completions", model, p, n, d)
                for p, n, d in zip(prompts, out_lens, delays)
            ]
        )
        return list(results), time.perf_counter() - start


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    import httpx

    proc = None
    base = args.url
    if not base:
        port = _free_port()
        extra = list(args.server_args or [])
        if config.model.source:
            extra += ["--model", config.model.source]
        if config.model.dtype and config.model.dtype != "auto":
            extra += ["--dtype", config.model.dtype]
        if config.model.device and config.model.device != "auto":
            extra += ["--device", config.model.device]
        if config.model.max_model_len:
            extra += ["--max-model-len", str(config.model.max_model_len)]
        extra += ["--max-num-seqs", str(config.scheduler.max_num_seqs)]
        proc = start_server(extra, port)
        base = f"http://127.0.0.1:{port}"
    try:
        models = httpx.get(f"{base}/v1/models", timeout=30).json()["data"]
        model = models[0]["id"]
        vocab = 1000 if not config.model.source else 32000
        if config.model.source and config.model.source.startswith("random:"):
            from tallow.engine.random_model import shape_config

            vocab = shape_config(config.model.source)["vocab_size"]
        n = args.num_prompts
        in_lens = lengths(n, args.input_len, args.min_input_len, args.max_input_len, 20)
        out_lens = lengths(n, args.output_len, args.min_output_len, args.max_output_len, 21)
        prompts = random_prompts(n, in_lens, vocab, seed=22)
        results, elapsed = asyncio.run(_drive(base, model, prompts, out_lens, args.rate, 23))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    ttft = [r["ttft"] for r in results]
    tpot = [r["tpot"] for r in results if r["tpot"] == r["tpot"]]
    itl = [x for r in results for x in r["itl"]]
    return {
        "model": model,
        "num_prompts": len(results),
        "rate_req_s": args.rate,
        "elapsed_s": elapsed,
        "req_s": len(results) / elapsed,
        "output_tok_s": sum(out_lens) / elapsed,
        "ttft_mean_ms": mean(ttft) * 1e3,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "tpot_mean_ms": mean(tpot) * 1e3,
        "tpot_p50_ms": percentile(tpot, 50) * 1e3,
        "tpot_p99_ms": percentile(tpot, 99) * 1e3,
        "itl_p50_ms": percentile(itl, 50) * 1e3,
        "itl_p99_ms": percentile(itl, 99) * 1e3,
    }


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k.replace("_", " "), v) for k, v in r.items()]

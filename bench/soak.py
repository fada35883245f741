"""Soak test: ``tallow serve`` on a small random-weight model over loopback, driven for a given
time by mixed traffic with random client disconnects, then checked for leaks.

Traffic (each request drawn at random): completions and chat, streamed or whole; chat
constrained by a JSON schema (``response_format``); chat running the server-side tool loop
against a real MCP server built with the official ``mcp`` SDK (``sdk_server.py`` of tallow-mcp-client's
tests). A quarter of the requests are abandoned by their client: a stream after a few chunks,
a whole response by a client timeout shorter than the generation.

After a warm-up (a tenth of the run, at most 60 s) the server is left to go idle and its
process is measured (resident memory, open file descriptors, threads, child processes); at the
end the same again, and the run passes when:

- ``/metrics``: no request running or waiting, every KV-cache block free;
- ``/health``: no request in the server;
- no grammar worker process beyond the one the engine keeps, threads back near the start;
- the MCP connection has no call in flight;
- open file descriptors back near the start, resident memory within 10 % of the start.

    python bench/soak.py --duration 600 --concurrency 4 --json report.json

The exit status is 0 when every check passed. :func:`run_soak` is the same as a function
(the CI test calls it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

try:  # the HTTP client the official openai SDK (3.x) uses
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
SDK_SERVER = ROOT / "plugins" / "mcp" / "client" / "tests" / "sdk_server.py"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}
#: the whole text of a tool call, one token each of the soak's tokenizer: a tool-loop request
#: biases them (``logit_bias``), so the random-weight model writes real calls
CALLS = {
    "echo": '<tool_call>\n{"name": "echo", "arguments": {"text": "soak"}}\n</tool_call>',
    "sleep": '<tool_call>\n{"name": "sleep", "arguments": {"seconds": 0.3}}\n</tool_call>',
}
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %} call {{ c.function.name }}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KINDS = (
    "completion",
    "completion_stream",
    "chat",
    "chat_stream",
    "schema",
    "schema_stream",
    "tools",
    "tools_stream",
)
#: slack for the descriptor and thread checks (a keep-alive socket, a pool thread started late)
FD_SLACK = 8
THREAD_SLACK = 4
RSS_TOLERANCE = 0.10


@dataclass
class Snapshot:
    """What the server process holds at one moment, with the engine idle."""

    rss: int
    fds: int
    threads: int
    grammar_workers: int
    children: list[str]

    @classmethod
    def of(cls, pid: int) -> "Snapshot":
        proc = psutil.Process(pid)
        kids = proc.children(recursive=True)
        names = [" ".join(k.cmdline()[1:3]) for k in kids if k.is_running()]
        return cls(
            rss=proc.memory_info().rss,
            fds=proc.num_fds(),
            threads=proc.num_threads(),
            grammar_workers=sum("grammar_worker" in n for n in names),
            children=names,
        )


@dataclass
class Report:
    duration_s: float
    concurrency: int
    model: str
    counts: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    disconnects: int = 0
    tool_calls_run: int = 0
    errors: list[str] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values()) and not self.errors

    def text(self) -> str:
        lines = [
            f"soak: {self.model}, {self.duration_s:.0f} s at concurrency {self.concurrency}",
            f"requests: {sum(self.counts.values())} "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())),
            "statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items())),
            f"client disconnects: {self.disconnects}; server tool calls answered: "
            f"{self.tool_calls_run}",
            f"start (after warm-up): {self.start}",
            f"end: {self.end}",
        ]
        lines += [
            f"  {'ok  ' if ok else 'FAIL'} {name}: {self.details.get(name, '')}"
            for name, ok in self.checks.items()
        ]
        lines += [f"  error: {e}" for e in self.errors[:20]]
        lines.append("PASS" if self.passed else "FAIL")
        return "\n".join(lines)


def write_tokenizer(path: Path, vocab_size: int = 512) -> dict[str, int]:
    """A tokenizer for the random-weight model in ``path``: one token per printable character
    (so JSON can be spelled and constrained), the chat markers, one token per tool call of
    :data:`CALLS`, filler words up to ``vocab_size``; and a chat template. Returns the ids of
    the call tokens."""
    from tokenizers import Tokenizer, decoders, models

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    specials = ["<|im_start|>", "<|im_end|>"]
    calls = list(CALLS.values())
    fill = [f"w{i}" for i in range(vocab_size - len(chars) - len(specials) - len(calls))]
    vocab = {t: i for i, t in enumerate(chars + fill)}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="?"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    tok.add_tokens(calls)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHAT_TEMPLATE})
    )
    return {name: tok.token_to_id(text) for name, text in CALLS.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+) ([0-9.eE+-]+|NaN)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


class Traffic:
    """One client loop drawing requests at random until the deadline."""

    def __init__(
        self,
        url: str,
        model: str,
        report: Report,
        rng: random.Random,
        tools: bool,
        call_ids: dict[str, int],
    ) -> None:
        self.url, self.model, self.report, self.rng = url, model, report, rng
        self.call_ids = call_ids
        self.kinds = KINDS if tools else tuple(k for k in KINDS if not k.startswith("tools"))

    def _body(self, kind: str) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        words = " ".join(
            rng.choice(["alpha", "beta", "gamma", "delta", "soak", "tallow"])
            for _ in range(rng.randint(2, 40))
        )
        stream = kind.endswith("_stream")
        base: dict[str, Any] = {
            "model": self.model,
            "max_tokens": rng.randint(4, 48),
            "temperature": rng.choice([0.0, 0.8]),
            "stream": stream,
        }
        if kind.startswith("completion"):
            return "/v1/completions", {**base, "prompt": words}
        body = {**base, "messages": [{"role": "user", "content": words}]}
        if kind.startswith("schema"):
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "soak", "schema": SCHEMA},
            }
            body["max_tokens"] = 96
        elif kind.startswith("tools"):
            # the model writes one of the calls (most rounds), then whatever it draws
            call = self.call_ids[rng.choice(sorted(self.call_ids))]
            body.update(server_tools=True, logit_bias={str(call): rng.choice([8, 100])})
        return "/v1/chat/completions", body

    async def run(self, client: httpx.AsyncClient, deadline: float) -> None:
        while time.monotonic() < deadline:
            kind = self.rng.choice(self.kinds)
            path, body = self._body(kind)
            leave = self.rng.random() < 0.25
            self.report.counts[kind] = self.report.counts.get(kind, 0) + 1
            try:
                await (self._stream if body["stream"] else self._whole)(client, path, body, leave)
            except Exception as exc:  # a failure of the server shows here, with its request
                self.report.errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])

    def _status(self, code: int) -> None:
        key = str(code)
        self.report.statuses[key] = self.report.statuses.get(key, 0) + 1
        if code >= 500:
            self.report.errors.append(f"HTTP {code}")

    def _tool_calls(self, payload: dict[str, Any]) -> None:
        for choice in payload.get("choices", []):
            part = choice.get("message") or choice.get("delta") or {}
            self.report.tool_calls_run += sum(
                1 for entry in part.get("server_tool_calls") or [] if "result" in entry
            )

    async def _whole(
        self, client: httpx.AsyncClient, path: str, body: dict[str, Any], leave: bool
    ) -> None:
        if leave:  # a timeout shorter than the generation: the client goes away mid-request
            try:
                resp = await client.post(path, json=body, timeout=self.rng.uniform(0.02, 0.3))
            except httpx.TimeoutException:
                self.report.disconnects += 1
                return
        else:
            resp = await client.post(path, json=body)
        self._status(resp.status_code)
        if resp.status_code == 200:
            self._tool_calls(resp.json())

    async def _stream(
        self, client: httpx.AsyncClient, path: str, body: dict[str, Any], leave: bool
    ) -> None:
        stop_after = self.rng.randint(1, 6) if leave else None
        async with client.stream("POST", path, json=body) as resp:
            self._status(resp.status_code)
            if resp.status_code != 200:
                await resp.aread()
                return
            seen, done = 0, False
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                self._tool_calls(json.loads(line[6:]))
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    self.report.disconnects += 1
                    return  # leaving the block closes the connection mid-stream
            if not done:
                self.report.errors.append(f"a stream of {path} ended without [DONE]")


class Server:
    """``tallow serve`` in a subprocess, with the MCP server as its tool provider."""

    def __init__(self, model: str, max_model_len: int, tools: bool, workdir: Path) -> None:
        self.call_ids = write_tokenizer(workdir / "tokenizer")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "serve.log"
        args = [
            sys.executable,
            "-m",
            "tallow",
            "serve",
            "--model",
            model,
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-model-len",
            str(max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--tokenizer",
            str(workdir / "tokenizer"),
        ]
        if tools:
            config = workdir / "tallow.yaml"
            config.write_text(
                json.dumps(
                    {
                        "plugins": {
                            "settings": {
                                "tallow-mcp-client": {
                                    "servers": {
                                        "sdk": {
                                            "command": sys.executable,
                                            "args": [str(SDK_SERVER), "stdio"],
                                            "allow": sorted(CALLS),
                                        }
                                    }
                                }
                            }
                        }
                    }
                )
            )
            args += ["--config", str(config), "--tool-parser", "hermes"]
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300.0) -> None:
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tallow serve exited with {self.proc.returncode}:\n"
                    + self.log_path.read_text()[-3000:]
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "tallow serve was not ready in time:\n" + self.log_path.read_text()[-3000:]
                )
            time.sleep(0.5)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def _idle_state(url: str, tools: bool) -> dict[str, Any]:
    metrics = _metrics(httpx.get(url + "/metrics", timeout=10).text)
    health = httpx.get(url + "/health", timeout=10).json()
    state = {
        "running": metrics.get("tallow_num_requests_running"),
        "waiting": metrics.get("tallow_num_requests_waiting"),
        "free_blocks": metrics.get("tallow_kv_cache_free_blocks"),
        "total_blocks": metrics.get("tallow_kv_cache_total_blocks"),
        "server_inflight": health.get("server_inflight"),
    }
    if tools:
        listing = httpx.get(url + "/v1/tools", timeout=10).json()
        state["mcp_calls_in_flight"] = sum(
            source.get("calls_in_flight", 0)
            for provider in listing.get("providers", [])
            for source in provider.get("status", {}).get("sources", [])
        )
    return state


def _wait_idle(url: str, tools: bool, timeout: float = 60.0) -> dict[str, Any]:
    """The idle state once the engine and the server hold no request (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        state = _idle_state(url, tools)
        idle = (
            state["running"] == 0
            and state["waiting"] == 0
            and state["server_inflight"] == 0
            and state["free_blocks"] == state["total_blocks"]
            and not state.get("mcp_calls_in_flight")
        )
        if idle or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


async def _drive(
    url: str,
    model: str,
    report: Report,
    seconds: float,
    concurrency: int,
    seed: int,
    tools: bool,
    call_ids: dict[str, int],
) -> None:
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        loops = [
            Traffic(url, model, report, random.Random(seed * 1000 + i), tools, call_ids)
            for i in range(concurrency)
        ]
        await asyncio.gather(*(loop.run(client, deadline) for loop in loops))


def run_soak(
    duration: float,
    concurrency: int = 4,
    model: str = "random:tiny-llama",
    max_model_len: int = 512,
    seed: int = 0,
    tools: bool = True,
    warmup: float | None = None,
) -> Report:
    """Run the soak for ``duration`` seconds of traffic (warm-up included); the report's
    ``passed`` says whether every check held."""
    warm = warmup if warmup is not None else min(60.0, duration / 10)
    report = Report(duration_s=duration, concurrency=concurrency, model=model)
    with tempfile.TemporaryDirectory(prefix="tallow-soak-") as tmp:
        server = Server(model, max_model_len, tools, Path(tmp))
        server.start()
        try:
            assert server.proc is not None
            if tools:  # the MCP server's tools are listed once it is up
                limit = time.monotonic() + 60
                while "echo" not in httpx.get(server.url + "/v1/tools", timeout=10).text:
                    if time.monotonic() > limit:
                        raise RuntimeError("the MCP server did not come up")
                    time.sleep(0.2)
            asyncio.run(
                _drive(server.url, model, report, warm, concurrency, seed, tools, server.call_ids)
            )
            _wait_idle(server.url, tools)
            time.sleep(1.0)
            first = Snapshot.of(server.proc.pid)
            asyncio.run(
                _drive(
                    server.url,
                    model,
                    report,
                    duration - warm,
                    concurrency,
                    seed + 1,
                    tools,
                    server.call_ids,
                )
            )
            idle = _wait_idle(server.url, tools)
            time.sleep(1.0)
            last = Snapshot.of(server.proc.pid)
            _check(report, idle, first, last, tools)
        finally:
            code = server.stop()
            report.details["exit_code"] = code
            if code != 0:
                report.errors.append(
                    f"tallow serve exited with {code}: " + server.log_path.read_text()[-1500:]
                )
    return report


def _check(
    report: Report, idle: dict[str, Any], first: Snapshot, last: Snapshot, tools: bool
) -> None:
    mb = 1 << 20
    report.start = {
        "rss_mb": round(first.rss / mb, 1),
        "fds": first.fds,
        "threads": first.threads,
        "children": first.children,
    }
    report.end = {
        "rss_mb": round(last.rss / mb, 1),
        "fds": last.fds,
        "threads": last.threads,
        "children": last.children,
        **idle,
    }
    c, d = report.checks, report.details
    c["no requests running or waiting"] = idle["running"] == 0 and idle["waiting"] == 0
    d["no requests running or waiting"] = f"running {idle['running']}, waiting {idle['waiting']}"
    c["all KV blocks free"] = (
        idle["total_blocks"] is not None and idle["free_blocks"] == idle["total_blocks"]
    )
    d["all KV blocks free"] = f"{idle['free_blocks']} of {idle['total_blocks']}"
    c["no request in the server"] = idle["server_inflight"] == 0
    d["no request in the server"] = f"server_inflight {idle['server_inflight']}"
    c["no leaked grammar workers or threads"] = (
        last.grammar_workers <= 1 and last.threads <= first.threads + THREAD_SLACK
    )
    d["no leaked grammar workers or threads"] = (
        f"grammar workers {first.grammar_workers} -> {last.grammar_workers}, "
        f"threads {first.threads} -> {last.threads}"
    )
    if tools:
        c["no MCP call in flight"] = idle.get("mcp_calls_in_flight") == 0
        d["no MCP call in flight"] = f"calls_in_flight {idle.get('mcp_calls_in_flight')}"
    c["file descriptors back near the start"] = last.fds <= first.fds + FD_SLACK
    d["file descriptors back near the start"] = f"{first.fds} -> {last.fds}"
    change = (last.rss - first.rss) / first.rss
    c["RSS within 10 % of the start"] = abs(change) <= RSS_TOLERANCE
    d["RSS within 10 % of the start"] = (
        f"{first.rss / mb:.1f} MB -> {last.rss / mb:.1f} MB ({change:+.1%})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=max(2, 2 * (os.cpu_count() or 1)),
        help="client loops at once (default: two per CPU core)",
    )
    parser.add_argument("--model", default="random:tiny-llama")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tools", action="store_true", help="no MCP server, no tool loop")
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    report = run_soak(
        args.duration,
        args.concurrency,
        args.model,
        args.max_model_len,
        args.seed,
        not args.no_tools,
    )
    print(report.text())
    if args.json:
        data = {k: v for k, v in report.__dict__.items()}
        data["passed"] = report.passed
        args.json.write_text(json.dumps(data, indent=2, default=str))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())

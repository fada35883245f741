"""The short soak: ``bench/soak.py`` for about a minute of mixed traffic (completions, chat,
JSON-schema constrained, the server-side tool loop against a real MCP server built with the
official ``mcp`` SDK), a quarter of it abandoned by its clients, then the leak checks: nothing
running, waiting or held in the server, every KV block free, no extra grammar worker or
threads, no MCP call in flight, file descriptors and resident memory back near the start."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("tallow_mcp_client", reason="tallow-mcp-client provides the MCP client")

SOAK = Path(__file__).parents[2] / "bench" / "soak.py"


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tallow_bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_minute_of_mixed_traffic_leaks_nothing() -> None:
    soak = _soak()
    report = soak.run_soak(duration=60, concurrency=4, warmup=10)
    text = report.text()
    assert report.passed, text
    # every kind of traffic ran, answered without a server error, and some was abandoned
    assert set(report.counts) == set(soak.KINDS), text
    assert not any(code.startswith("5") for code in report.statuses), text
    assert report.statuses.get("200", 0) >= len(soak.KINDS), text
    assert report.disconnects > 0 and report.tool_calls_run > 0, text
    assert {
        "all KV blocks free",
        "no MCP call in flight",
        "RSS within 10 % of the start",
        "file descriptors back near the start",
    } <= set(report.checks), text


def test_the_checks_catch_a_leak() -> None:
    """The checks are not vacuous: a snapshot with more descriptors, threads and memory than
    the start, and a block still held, fails them."""
    soak = _soak()
    report = soak.Report(duration_s=1, concurrency=1, model="m")
    first = soak.Snapshot(rss=100 << 20, fds=10, threads=8, grammar_workers=1, children=[])
    leaky = soak.Snapshot(rss=120 << 20, fds=40, threads=30, grammar_workers=2, children=[])
    idle = {
        "running": 0.0,
        "waiting": 1.0,
        "free_blocks": 7.0,
        "total_blocks": 8.0,
        "server_inflight": 1,
        "mcp_calls_in_flight": 1,
    }
    soak._check(report, idle, first, leaky, tools=True)
    assert not report.passed
    assert not any(report.checks.values()), report.text()
    clean = soak.Report(duration_s=1, concurrency=1, model="m")
    soak._check(
        clean,
        {
            **idle,
            "waiting": 0.0,
            "free_blocks": 8.0,
            "server_inflight": 0,
            "mcp_calls_in_flight": 0,
        },
        first,
        first,
        tools=True,
    )
    assert clean.passed, clean.text()

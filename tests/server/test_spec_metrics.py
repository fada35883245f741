"""Speculative decoding's figures in ``GET /metrics``: read from the engine's stats at scrape
time, zero for an engine without a speculator."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tallow.server.metrics import ServerMetrics


def scrape(stats: dict) -> dict[str, float]:
    text = ServerMetrics(lambda: stats, "m").render()
    if isinstance(text, bytes):
        text = text.decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_acceptance_figures_are_exported() -> None:
    got = scrape(
        {
            "spec_num_proposals": 10,
            "spec_num_proposed_tokens": 40,
            "spec_num_accepted_tokens": 30,
            "spec_acceptance_rate": 0.75,
            "spec_mean_accepted_length": 4.0,
        }
    )
    assert got["tallow_spec_decode_acceptance_rate"] == 0.75
    assert got["tallow_spec_decode_mean_accepted_length"] == 4.0
    assert got["tallow_spec_decode_num_proposals_total"] == 10
    assert got["tallow_spec_decode_num_draft_tokens_total"] == 40
    assert got["tallow_spec_decode_num_accepted_tokens_total"] == 30
    assert scrape({})["tallow_spec_decode_acceptance_rate"] == 0.0

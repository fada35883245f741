"""The core's own components against the conformance suites of tallow.plugin.testing: the torch
attention backend (with the auto, fp8 and turbo4 codecs) and the auto KV codec. The suites
themselves are checked against broken components in tests/test_conformance_kit.py."""

from __future__ import annotations

from tallow.plugin.testing import AttentionBackendConformance, KVCodecConformance


class TestTorchBackendConformance(AttentionBackendConformance):
    distribution = "tallow"
    component = "torch"
    kv_codecs = ("auto", "fp8", "fp8_e5m2", "turbo4")


class TestAutoCodecConformance(KVCodecConformance):
    distribution = "tallow"
    component = "auto"

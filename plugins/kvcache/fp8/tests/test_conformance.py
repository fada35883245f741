"""The fp8 codecs against tallow's KV-codec conformance suite (the attention backends store
them in their own suites: tests/test_conformance_core.py, the triton plugin)."""

from __future__ import annotations

from tallow.plugin.testing import KVCodecConformance


class TestFP8E4M3Conformance(KVCodecConformance):
    distribution = "tallow-kvcache-fp8"
    component = "fp8"


class TestFP8E4M3AliasConformance(KVCodecConformance):
    distribution = "tallow-kvcache-fp8"
    component = "fp8_e4m3"


class TestFP8E5M2Conformance(KVCodecConformance):
    distribution = "tallow-kvcache-fp8"
    component = "fp8_e5m2"

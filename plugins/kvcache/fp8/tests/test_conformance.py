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


class TestFP8CentredKeysConformance(KVCodecConformance):
    """With ``center_keys`` the layout adds the per-layer key offset, which calibration
    fills (the suite's calibration check: keys with a large constant per channel)."""

    distribution = "tallow-kvcache-fp8"
    component = "fp8"
    settings = {"center_keys": True}

"""The conformance suites fail components that break their contract: each broken component
below is run through its suite in a fresh pytest process, and the tests that must catch it
fail (the rest of the suite still runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BROKEN = '''
import pytest
import torch
from tallow.kernels.kv_cast import CastKVCodec
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin import ParseResult, StreamDelta, ToolCall, ToolParser
from tallow.plugin.testing import (
    AttentionBackendConformance, KVCodecConformance, ToolParserConformance,
)


class OffByScale(TorchAttentionBackend):
    """Attends with twice the softmax scale."""

    def forward(self, layer, q, k, v, kv_cache, meta):
        return super().forward(layer, 2 * q, k, v, kv_cache, meta)


class TestBrokenBackend(AttentionBackendConformance):
    distribution = "tallow"
    component = "torch"

    @pytest.fixture(scope="class")
    def component_class(self):
        return OffByScale


class StoresSharedKV(TorchAttentionBackend):
    """Declares KV sharing but stores a sharing layer's placeholder K/V into its source's
    cache."""

    def forward(self, layer, q, k, v, kv_cache, meta):
        if layer.kv_shared_from is not None:
            kv_cache.codec.encode(kv_cache, k, v, meta.slot_mapping)
        return super().forward(layer, q, k, v, kv_cache, meta)


class TestBrokenSharing(AttentionBackendConformance):
    distribution = "tallow"
    component = "torch"
    dtypes = (torch.float32,)

    @pytest.fixture(scope="class")
    def component_class(self):
        return StoresSharedKV


class StoresPadding(CastKVCodec):
    """Casts into float16 whatever the model's dtype (too few bits for a float32 model's
    "model dtype" listing), and stores rows with slot -1 at the end of the last block."""

    name = "padding"
    storage = torch.float16

    def encode(self, cache, k, v, slot_mapping):
        blocks, offsets = slot_mapping // cache.block_size, slot_mapping % cache.block_size
        cache["k"][blocks, offsets] = k.to(torch.float16)
        cache["v"][blocks, offsets] = v.to(torch.float16)


class TestBrokenCodec(KVCodecConformance):
    distribution = "tallow"
    component = "auto"

    @pytest.fixture(scope="class")
    def component_class(self):
        return StoresPadding


class Greedy(ToolParser):
    """Takes any line starting with CALL for a call, and raises on a bare brace."""

    name = "greedy"

    @classmethod
    def matches(cls, model_name, chat_template):
        return False

    def parse(self, text, tools=None):
        if text.strip() == "{":
            raise ValueError("bare brace")
        if text.startswith("CALL "):
            return ParseResult(None, [ToolCall(text.split()[1], "{}")])
        return ParseResult(text)

    def stream(self, tools=None):
        parser = self

        class Stream:
            text = ""

            def feed(self, t):
                self.text += t
                return StreamDelta()

            def finish(self):
                return StreamDelta(content=self.text)

        return Stream()


class TestBrokenParser(ToolParserConformance):
    distribution = "tallow"
    component = "greedy"
    examples = [("CALL search {}", [("search", {})])]
    plain_texts = ["{", "plain"]

    @pytest.fixture(scope="class")
    def entry(self):
        pytest.skip("not registered")

    @pytest.fixture(scope="class")
    def component_class(self):
        return Greedy


class TestNotInstalled(ToolParserConformance):
    distribution = "tallow-no-such-plugin"
    component = "nothing"
    examples = [("x", [])]
'''


def test_suites_fail_broken_components(tmp_path: Path) -> None:
    from tallow.plugin.testing import suite_failures

    # a test that fails, or whose fixture (the component's loading) errors
    failed, stdout = suite_failures(BROKEN, tmp_path, timeout=300)
    report = stdout[-4000:]
    for test in (
        "TestBrokenBackend::test_prefill[torch.float32]",
        "TestBrokenBackend::test_decode[torch.bfloat16]",
        "TestBrokenBackend::test_prefix_hit",
        "TestBrokenSharing::test_kv_sharing_layer",
        "TestBrokenCodec::test_bytes_cover_the_stated_bits",
        "TestBrokenCodec::test_round_trip_through_scattered_partial_blocks",
        "TestBrokenParser::test_streaming_equals_whole_parse[example0]",
        "TestBrokenParser::test_plain_text_is_content[plain0]",
        "TestBrokenParser::test_unknown_tool_is_not_a_call[example0]",
        "TestBrokenParser::test_malformed_input_never_raises[example0]",
        "TestNotInstalled::test_registered_lazily",
    ):
        assert any(f.startswith(test) for f in failed), f"{test} did not fail:\n{report}"
    # what the broken components do right still passes
    assert "TestBrokenBackend::test_validate_gives_reasons_as_text" not in "".join(failed)
    assert "TestBrokenSharing::test_prefill" not in "".join(failed)
    assert "TestBrokenCodec::test_copied_block_reads_the_same" not in "".join(failed)
    assert "TestBrokenParser::test_examples_parse_to_their_calls" not in "".join(failed)
    assert "no installed distribution 'tallow-no-such-plugin'" in stdout


def test_tallow_imports_no_pytest_at_runtime() -> None:
    """The kit lives in tallow.plugin.testing; nothing that serves imports it (or pytest)."""
    code = (
        "import sys, tallow.plugin, tallow.layers, tallow.kernels, tallow.engine.llm, "
        "tallow.server.app, tallow.cli\n"
        "print([m for m in ('pytest', 'tallow.plugin.testing') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

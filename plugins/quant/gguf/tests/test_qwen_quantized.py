"""The real Qwen2.5-Coder-0.5B-Instruct GGUF (Q5_0/Q8_0/Q6_K/Q4_K) served with its weights kept
quantized, on the CPU in float32: the same greedy tokens as the dequantize-at-load path, and
resident weights the size of the file."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from quant_engine_runs import engine, greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n# a 3x3 identity matrix\n",
]
NEW_TOKENS = 12


def rss_anon() -> int:
    """Anonymous resident memory of this process (file-backed mappings, such as the memory
    map of the GGUF file, are not counted), after the C allocator returned its free pages:
    temporaries freed during loading must not count as held."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: measure as it is
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


@pytest.fixture(scope="module")
def model_path() -> str:
    from tallow.default_model import default_model_path

    return str(default_model_path())


def _engine(model_path: str, keep_quantized: bool):
    return engine(
        model_path,
        max_model_len=256,
        num_blocks=64,
        keep_quantized_on_cpu=True,
        disable=() if keep_quantized else ("tallow-quant-gguf",),
    )


def test_resident_weights_are_the_size_of_the_file(model_path):
    from tallow.layers import ArchConfig, BuildContext
    from tallow_format_gguf.format import GGUFFormat
    from tallow_model_llama.model import Qwen2ForCausalLM

    from tallow_quant_gguf.method import GGUFLinearMethod
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    checkpoint = GGUFFormat().load(model_path)  # metadata and tokenizer: not weights
    assert checkpoint.quantization == "gguf"
    config = Qwen2ForCausalLM.config_from_gguf(
        checkpoint.extra["gguf_metadata"], dict(checkpoint.config)
    )
    before = rss_anon()
    scheme = GGUFQuantScheme()
    model = Qwen2ForCausalLM(ArchConfig(config), BuildContext(dtype=torch.float32, quant=scheme))
    model.load_weights(checkpoint.tensors(), naming="gguf")
    grown = rss_anon() - before
    held = {}  # storage -> bytes: every parameter and buffer the model holds, shared ones once
    for t in [*model.parameters(), *model.buffers()]:
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    held_bytes = sum(held.values())
    file_bytes = os.path.getsize(model_path)
    assert abs(held_bytes - file_bytes) <= 0.10 * file_bytes, (held_bytes, file_bytes)
    # the process grew by the weights, not by a float copy of them (2 GB in float32)
    assert grown <= 1.10 * file_bytes, (grown, file_bytes)
    # every matrix is held by the scheme, in the file's own types
    layer = model.model.layers[0]
    qkv = layer.self_attn.qkv_proj.quant_method
    assert isinstance(qkv, GGUFLinearMethod)
    assert [p.type_name for p in qkv.parts] == ["Q5_0", "Q8_0"]  # q, k share Q5_0; v is Q8_0
    assert isinstance(model.model.embed_tokens.quant_method, GGUFLinearMethod)
    assert model.lm_head.quant_method.parts[0].type_name == "Q8_0"
    assert "Q4_K x12" in scheme.summary() and "Q6_K x12" in scheme.summary()


def test_greedy_tokens_equal_the_dequantize_at_load_path(model_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="tallow.engine")
    dense = _engine(model_path, keep_quantized=False)
    assert "no quant scheme serving 'gguf' is installed and enabled" in caplog.text
    assert "dequantizing them at load" in caplog.text
    prompts = [dense.tokenizer.encode(p) for p in PROMPTS]
    expected = greedy(dense, prompts, NEW_TOKENS)
    dense_weights = dense.parts.loaded.weight_bytes
    del dense
    gc.collect()
    quantized = _engine(model_path, keep_quantized=True)
    assert type(quantized.parts.loaded.quant).__name__ == "GGUFQuantScheme"
    assert quantized.parts.loaded.weight_bytes < 0.3 * dense_weights
    assert greedy(quantized, prompts, NEW_TOKENS) == expected

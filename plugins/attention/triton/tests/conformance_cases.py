"""tallow's attention-backend conformance suite for the triton backend, on a CUDA GPU or, with
``TRITON_INTERPRET=1`` set before triton is imported, on CPU tensors through Triton's
interpreter (test_conformance.py runs this module that way). Not collected on its own (no
``test_`` prefix): on a GPU run ``python -m pytest
plugins/attention/triton/tests/conformance_cases.py``."""

from __future__ import annotations

import pytest
import torch

from tallow.plugin.testing import AttentionBackendConformance
from tallow_attention_triton import ops
from tallow_attention_triton.testing import TURBO_CACHE_TOLERANCE


class TestTritonConformance(AttentionBackendConformance):
    distribution = "tallow-attention-triton"
    component = "triton"
    kv_codecs = ("auto", "fp8", "fp8_e5m2", "turbo8", "turbo4", "turbo3")
    # the fused turbo store rotates with another summation order than the codec's reference,
    # so a coordinate on a rounding boundary may take the neighbouring code
    # (testing.TURBO_CACHE_TOLERANCE); queries and outputs are rotated in the activations'
    # dtype, one more rounding each way
    kv_codec_store_tolerance = {
        name: TURBO_CACHE_TOLERANCE for name in ("turbo8", "turbo4", "turbo3")
    }
    kv_codec_output_scale = {"turbo8": 2.0, "turbo4": 2.0, "turbo3": 2.0}
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    light_modules = ("torch", "triton")

    @pytest.fixture(scope="class")
    def device(self, component_class):
        if ops.interpreting():
            return "cpu"
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU (or TRITON_INTERPRET=1 set before triton is imported)")
        return "cuda"

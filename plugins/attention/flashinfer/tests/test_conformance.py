"""tallow's attention-backend conformance suite for the flashinfer backend. Registration checks
run anywhere; the steps against the torch reference need a CUDA GPU and flashinfer (skipped
with that reason without them)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from flashinfer_cases import FA2_ONLY

from tallow.plugin.testing import AttentionBackendConformance

# selected by `pytest -m gpu`; the registration checks need neither and run everywhere
pytestmark = pytest.mark.gpu


class TestFlashInferConformance(AttentionBackendConformance):
    """tallow's attention-backend suite: FA2 kernels at head size 128 (bf16 and, through the
    codecs of tallow-kvcache-fp8, e4m3 and e5m2 caches)."""

    distribution = "tallow-attention-flashinfer"
    component = "flashinfer"
    dtypes = (torch.bfloat16,)
    head_dim = 128
    kv_codecs = ("auto", "fp8", "fp8_e5m2")
    settings = FA2_ONLY
    light_modules = ("torch", "flashinfer")

    @pytest.fixture(scope="class")
    def device(self, component_class, request):
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        if importlib.util.find_spec("flashinfer") is None:
            pytest.skip("needs flashinfer")
        request.getfixturevalue("flashinfer_modules")
        return "cuda"

"""GLM-4.5 MoE beyond the conformance suite: a config that leaves the rotary fraction to its
default (0.5), multi-token prediction layers skipped, and the GPU."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from glm_configs import CONFIG, PROMPT  # noqa: E402
from tallow_model_glm4_moe.model import Glm4MoeForCausalLM  # noqa: E402


def test_default_rotary_fraction_and_mtp_layers():
    """A config.json without ``partial_rotary_factor`` rotates half of each head, as
    transformers' config defaults to; ``model.layers.{num_hidden_layers}`` tensors are
    skipped."""
    config = transformers.Glm4MoeConfig(**CONFIG)
    hf = random_hf_model(config, seed=41)
    raw = config.to_dict()
    raw.pop("partial_rotary_factor", None)
    (raw.get("rope_parameters") or {}).pop("partial_rotary_factor", None)
    model = Glm4MoeForCausalLM(ArchConfig(raw), BuildContext())
    assert model.model.rotary_emb.rotary_dim == 16
    state = dict(hf.state_dict())
    state["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
    model.load_weights(iter(state.items()), naming="hf")
    assert_greedy_parity(model.eval(), hf, PROMPT, 32, what="glm4-moe default rotary")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    hf = random_hf_model(transformers.Glm4MoeConfig(**CONFIG), seed=42)
    from tallow_format_safetensors.format import SafetensorsFormat

    assert_cuda_parity(
        lambda **kw: load_saved(hf, tmp_path, Glm4MoeForCausalLM, SafetensorsFormat().load, **kw),
        hf,
        PROMPT,
        32,
        what="glm4-moe",
    )

"""The plugin's own layers against transformers' modules: the gated RMSNorm of the
linear-attention output, and the reordering of Qwen3-Next's interleaved projections (the
q/k/v/z and b/a that transformers splits per key head)."""

from __future__ import annotations

import pytest
import torch

hf = pytest.importorskip(
    "transformers.models.qwen3_next.modeling_qwen3_next", reason="transformers is the oracle"
)
transformers = pytest.importorskip("transformers")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402

from tallow_model_qwen3_next.gated_deltanet import GatedDeltaNet, GatedRMSNorm  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_rms_norm_matches_transformers(dtype):
    gen = torch.Generator().manual_seed(0)
    ref = hf.Qwen3NextRMSNormGated(24, eps=1e-6)
    ours = GatedRMSNorm(24, 1e-6, BuildContext(dtype=dtype))
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(24, generator=gen))
        ours.weight.copy_(ref.weight)
    ref = ref.to(dtype)
    x = (torch.randn(7, 3, 24, generator=gen) * 3).to(dtype)
    z = torch.randn(7, 3, 24, generator=gen).to(dtype)
    torch.testing.assert_close(ours(x, z), ref(x, z), rtol=0, atol=0)


def test_projection_rows_are_reordered_as_transformers_splits_them():
    """Rows of the checkpoint's ``in_proj_qkvz`` / ``in_proj_ba`` reordered at load give
    ``[q | k | v | z]`` and ``[b | a]`` exactly as transformers'
    ``fix_query_key_value_ordering`` splits the projections (3 value heads per key head)."""
    config = transformers.Qwen3NextConfig(
        hidden_size=32,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        linear_key_head_dim=4,
        linear_value_head_dim=5,
        num_experts=0,
        intermediate_size=16,
    )
    ref = hf.Qwen3NextGatedDeltaNet(config, 0)
    layer = GatedDeltaNet(ArchConfig(config.to_dict()), BuildContext(), "linear_attn")
    x = torch.randn(1, 3, 32)
    with torch.no_grad():
        q, k, v, z, b, a = ref.fix_query_key_value_ordering(ref.in_proj_qkvz(x), ref.in_proj_ba(x))
        qkvz = x[0] @ layer.qkvz_rows(ref.in_proj_qkvz.weight).T
        ba = x[0] @ layer.ba_rows(ref.in_proj_ba.weight).T
    expected = torch.cat(
        [q.reshape(3, -1), k.reshape(3, -1), v.reshape(3, -1), z.reshape(3, -1)], -1
    )
    torch.testing.assert_close(qkvz, expected)
    torch.testing.assert_close(ba, torch.cat([b[0], a[0]], -1))
    with pytest.raises(ValueError, match="in_proj_qkvz: expected"):
        layer.qkvz_rows(ref.in_proj_qkvz.weight[:-1])

"""Gemma 3's bidirectional attention inside an image (``tallow_model_gemma.image_attention``)
against a dense masked softmax built from transformers' rule (causal OR same image, AND the
window), and its refusals."""

from __future__ import annotations

import pytest
import torch

from tallow_model_gemma.image_attention import image_block_attention, image_runs


def test_image_runs_split_at_gaps_and_sequences() -> None:
    # sequence 0: rows 0..5, sequence 1: rows 6..11
    qsl = [0, 6, 12]
    assert image_runs([1, 2, 3, 5, 6, 7, 10], qsl) == [(0, 1, 4), (0, 5, 6), (1, 6, 8), (1, 10, 11)]
    assert image_runs([], qsl) == []


@pytest.mark.parametrize("window", [None, 3, 6])
def test_block_attention_equals_the_masked_reference(window) -> None:
    torch.manual_seed(0)
    seq, heads, kv_heads, dim = 12, 4, 2, 8
    image = range(4, 9)  # the image's tokens
    q_all = torch.randn(seq, heads, dim)
    k, v = torch.randn(seq, kv_heads, dim), torch.randn(seq, kv_heads, dim)
    # the reference: every query's mask as transformers composes it
    qp, kp = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    in_image = torch.zeros(seq, dtype=torch.bool)
    in_image[list(image)] = True
    same = in_image[:, None] & in_image[None, :]
    allowed = (kp <= qp) | same
    if window:
        allowed &= qp - kp < window
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q_all, kr) * 0.3
    ref = torch.einsum(
        "hqk,khd->qhd", torch.softmax(scores.masked_fill(~allowed, -torch.inf), -1), vr
    )
    end = image.stop
    got = image_block_attention(
        q_all[image.start : end],
        k[:end],
        v[:end],
        first=image.start,
        image_start=image.start,
        scale=0.3,
        sliding_window=window,
    )
    torch.testing.assert_close(got, ref[image.start : end], atol=1e-5, rtol=1e-5)
    # the first image token sees the image's last one: not a causal result
    causal = torch.softmax(scores.masked_fill(~(kp <= qp), -torch.inf), -1)
    assert not torch.allclose(
        got[0], torch.einsum("hk,khd->hd", causal[:, image.start], vr), atol=1e-4
    )


class _Backend:
    """A stand-in for a non-torch attention backend: computes nothing."""

    name = "triton"

    def forward(self, layer, q, k, v, kv_cache, meta):  # noqa: ANN001
        return torch.zeros_like(q)


class _Meta:
    def group(self, index: int) -> "_Meta":
        return self


def test_backends_without_the_mask_refuse_image_rows() -> None:
    from tallow.layers import Attention, MultimodalStep, forward_context, multimodal_step

    from tallow_model_gemma.image_attention import ImageBlockAttention

    attn = Attention(0, 2, 1, 8)
    attn.bind_cache(object(), 0)  # type: ignore[arg-type]  # the backend never reads it
    wrapped = ImageBlockAttention(attn)
    q, kv = torch.randn(4, 16), torch.randn(4, 8)
    with forward_context(_Meta(), _Backend()):  # type: ignore[arg-type]
        # a text-only step runs on any backend
        assert torch.equal(wrapped(q, kv, kv), torch.zeros(4, 16))
        step = MultimodalStep(embeds=torch.zeros(2, 4), rows=torch.tensor([1, 2]))
        with multimodal_step(step), pytest.raises(NotImplementedError, match="'triton'"):
            wrapped(q, kv, kv)

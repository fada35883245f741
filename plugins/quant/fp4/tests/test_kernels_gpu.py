"""The FP4 kernels on a CUDA GPU at llama-3-8b shapes against the float32 product of the
decoded weights (every decode batch size up to 16, larger batches through the workspace),
bfloat16 decoding bit for bit, CUDA-graph replay, and an engine serving ``--isq mxfp4`` with
and without graphs."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from kernel_cases import weight  # noqa: E402
from tallow_quant_fp4 import ops  # noqa: E402
from tallow_quant_fp4.kernels.dequant import dequantize_triton  # noqa: E402
from tallow_quant_fp4.layout import dequantize  # noqa: E402

SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336)]


def close(got, x, w, what):
    want = x.float() @ dequantize(w).T
    scale = float(want.abs().max())
    torch.testing.assert_close(
        got.float(), want, rtol=1e-2, atol=1e-2 * scale, msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_batch_size(kind, n, k):
    w = weight(kind, n, k, seed=n)
    for m in list(range(1, 17)) + [64, 300]:
        x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
        x = x.to(torch.bfloat16)
        close(ops.linear(x, [w]), x, w, f"{kind} [{n}, {k}] m={m}")


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_dequantization_is_the_reference_bit_for_bit(kind):
    w = weight(kind, 1024, 4096, seed=3)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert torch.equal(dequantize_triton(w, dtype), dequantize(w, dtype))


def test_graph_replay_equals_eager():
    parts = [weight("mxfp4", 1024, 4096, seed=4)]
    ops.warm_up(parts, torch.bfloat16)
    for m in (1, 4, 64):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ops.linear(static_x, parts)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.linear(static_x, parts)
        static_x.copy_(torch.randn_like(x))
        graph.replay()
        expected = ops.linear(static_x, parts)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"m={m}"


def test_isq_mxfp4_engine_graphs_equal_eager():
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow import SamplingParams
    from tallow.plugin.testing.engine import replay_own_graph_sizes

    def engine(graphs: bool):
        return LLMEngine.from_config(
            config_from_mapping(
                {
                    "model": {
                        "source": "random:llama-3.2-1b",
                        "device": "cuda",
                        "dtype": "bfloat16",
                        "max_model_len": 2048,
                        "isq": "mxfp4",
                    },
                    "cache": {"num_blocks": 2048},
                    "runner": {"disable_cuda_graph": not graphs, "max_cuda_graph_batch": 16},
                    "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
                }
            )
        )

    def greedy(eng, prompts):
        ids = []
        for p in prompts:
            ids.append(eng.next_request_id())
            eng.add_request(
                ids[-1], p, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
            )
        done = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = list(out.outputs[0].token_ids)
        return [done[i] for i in ids]

    graphs, eager = engine(True), engine(False)
    assert "mxfp4 x" in graphs.parts.loaded.quant.summary()
    replay_own_graph_sizes(graphs)  # eager runs the same kernels
    g = torch.Generator().manual_seed(0)
    for n in (1, 4, 16):
        batch = [
            torch.randint(0, 120000, (int(L),), generator=g).tolist()
            for L in torch.randint(3, 200, (n,), generator=g)
        ]
        assert greedy(graphs, batch) == greedy(eager, batch), f"batch {n}"


@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 9, 64, 512])
def test_mxfp4_experts_at_gpt_oss_20b_shape(tokens):
    """gpt-oss-20b's experts (32 of 2880 x 2880, top 4) on the decoding kernels and on the
    workspace + grouped GEMM path, against the reference on the decoded weights; the
    decoding path replayed in a CUDA graph."""
    from kernel_cases import mx_experts
    from tallow_quant_fp4.moe_ops import mxfp4_moe, mxfp4_moe_ref

    e, h, i, top_k = 32, 2880, 2880, 4
    w13, w2 = mx_experts(e, 2 * i, h, seed=tokens), mx_experts(e, h, i, seed=tokens + 1)
    g = torch.Generator().manual_seed(tokens)
    x = (torch.randn(tokens, h, generator=g) * 0.1).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(tokens)]).cuda()
    weights = torch.rand(tokens, top_k, generator=g).softmax(-1).cuda()
    b13 = (torch.randn(e, 2 * i, generator=g) * 0.1).to(torch.bfloat16).cuda()
    b2 = (torch.randn(e, h, generator=g) * 0.1).to(torch.bfloat16).cuda()
    args = dict(activation="swiglu_clamp", w13_bias=b13, w2_bias=b2)
    got = mxfp4_moe(x, w13, w2, weights, ids, **args)
    want = mxfp4_moe_ref(x, w13, w2, weights, ids, **args)
    scale = float(want.float().abs().max())
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * scale)
    if tokens <= 8:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mxfp4_moe(x, w13, w2, weights, ids, **args)
        x.copy_(torch.randn_like(x) * 0.1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mxfp4_moe(x, w13, w2, weights, ids, **args))

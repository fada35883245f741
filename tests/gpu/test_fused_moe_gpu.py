"""The fused MoE on a GPU: CUDA-graph replay of the kernels, and the Qwen3-MoE engine on
``random:qwen3-30b-a3b``'s real shape against eager execution (kernels against their
references at real shapes: tests/kernels/test_moe_kernels.py with ``-m gpu``)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow.kernels.moe import fused_moe, fused_moe_ref  # noqa: E402
from tallow.layers import BuildContext, FusedMoE, RouterSpec  # noqa: E402


def _routing(g: torch.Generator, tokens: int, experts: int, top_k: int):
    weights, ids = torch.randn(tokens, experts, generator=g).softmax(-1).topk(top_k, dim=-1)
    return weights.to(torch.bfloat16).cuda(), ids.to(torch.int32).cuda()


def _close(actual: torch.Tensor, expected: torch.Tensor, rel: float = 3e-2) -> None:
    scale = float(expected.float().abs().max()) + 1e-6
    assert float((actual.float() - expected.float()).abs().max()) <= rel * scale


@pytest.mark.parametrize("tokens", [1, 4, 64, 512])
def test_fused_moe_replays_in_a_cuda_graph(tokens):
    """Captured once, replayed on new inputs and a new routing: nothing on the path syncs
    with the host or sizes a buffer from the routing."""
    g = torch.Generator().manual_seed(tokens)
    e, k, hidden, inter = 128, 8, 2048, 768
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).cuda()
    w13 = (torch.randn(e, 2 * inter, hidden, generator=g) * hidden**-0.5).bfloat16().cuda()
    w2 = (torch.randn(e, hidden, inter, generator=g) * inter**-0.5).bfloat16().cuda()
    weights, ids = _routing(g, tokens, e, k)
    fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    new_weights, new_ids = _routing(g, tokens, e, k)
    x.copy_(torch.randn(tokens, hidden, generator=g).to(torch.bfloat16))
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    _close(out, fused_moe_ref(x, w13, w2, weights, ids))


def test_fused_moe_layer_on_cuda_matches_cpu():
    """The layer (router + Triton experts + gated shared expert) on the GPU against the same
    layer on the CPU (torch references), float32."""

    def build(device: str) -> FusedMoE:
        torch.manual_seed(0)
        layer = FusedMoE(
            64,
            512,
            256,
            router=RouterSpec(top_k=4, renormalize=True),
            shared_intermediate_size=384,
            shared_gate=True,
            build=BuildContext(dtype=torch.float32, device=torch.device(device)),
            prefix="mlp",
        )
        for p in layer.parameters():
            p.data.normal_(0, 0.05)
        return layer

    x = torch.randn(40, 512)
    ref = build("cpu")(x)
    got = build("cuda")
    got.load_state_dict(build("cpu").state_dict())
    _close(got(x.cuda()).cpu(), ref, rel=1e-4)


@pytest.mark.gpu_alone
def test_qwen3_30b_a3b_shape_graphs_match_eager():
    """``random:qwen3-30b-a3b`` in bf16: greedy tokens with the decode steps in CUDA graphs
    equal eager execution's (the MoE layers inside graphs of several batch sizes)."""
    from tallow import LLM, SamplingParams

    prompts = [[(7 * i + j) % 1000 + 1 for j in range(20 + i)] for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    runs = []
    for disable in (False, True):
        llm = LLM(
            model="random:qwen3-30b-a3b",
            dtype="bfloat16",
            device="cuda",
            max_model_len=512,
            num_blocks=256,
            disable_cuda_graph=disable,
        )
        runs.append([list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)])
        del llm
        torch.cuda.empty_cache()
    assert runs[0] == runs[1]

"""Quantized experts on a CUDA GPU at Qwen3-30B-A3B's shapes (128 experts, hidden 2048,
intermediate 768, top-8; Q4_K gate/up, Q4_K or Q6_K down): the decode kernels at every decode
batch up to 32 tokens and the workspace path above, against the torch reference on the
decoded experts; CUDA-graph replay of the decode path; and ``random:tiny-qwen3-moe`` under
``--isq q4_k`` through the engine with CUDA graphs. Fresh random blocks (TALLOW_TEST_SEED
replays a run)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from moe_cases import BASE_SEED, blocks, oracle, seed_of  # noqa: E402
from quant_engine_runs import engine, greedy  # noqa: E402
from tallow.kernels import fused_moe_ref  # noqa: E402
from tallow.layers import BuildContext, FusedExperts  # noqa: E402
from tallow_quant_gguf.scheme import GGUFQuantScheme  # noqa: E402

E, H, I, TOP_K = 128, 2048, 768, 8


def experts_layer(t13: str, t2: str) -> tuple[FusedExperts, torch.Tensor, torch.Tensor]:
    """Real-shape experts under the gguf scheme, loaded from stacked GGUF blocks, and their
    decoded weights (bf16, the reference's)."""
    from tallow.layers import QuantizedWeight

    layer = FusedExperts(
        E,
        H,
        I,
        bias=False,
        activation="silu",
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        prefix="mlp.experts",
        build=BuildContext(dtype=torch.bfloat16, device="cuda", quant=GGUFQuantScheme(None)),
    )
    raw13 = blocks(t13, E * 2 * I, H, "gpu13").reshape(E, 2 * I, -1)
    raw2 = blocks(t2, E * H, I, "gpu2").reshape(E, H, -1)
    for name, raw, qtype, shape in (
        ("w13_weight", raw13, t13, (E, 2 * I, H)),
        ("w2_weight", raw2, t2, (E, H, I)),
    ):
        param = getattr(layer, name)
        param.weight_loader(
            param, QuantizedWeight("gguf", qtype, shape, torch.from_numpy(raw), lambda *a: None)
        )
    layer.quant_method.process_weights_after_loading(layer)
    w13 = oracle(raw13, t13, (E, 2 * I, H)).to("cuda", torch.bfloat16)
    w2 = oracle(raw2, t2, (E, H, I)).to("cuda", torch.bfloat16)
    return layer, w13, w2


def routed(tokens: int, *parts: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed_of("moe-gpu", tokens, *parts))
    x = torch.randn(tokens, H, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, E, device="cuda", generator=g)
    weights, ids = logits.softmax(-1).topk(TOP_K, dim=-1)
    return x, weights, ids


def check(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((got.float() - expected.float()).abs().max())
    assert err <= 3e-2 * scale, f"{what} (TALLOW_TEST_SEED={BASE_SEED}): {err:.3g} of {scale:.3g}"


@pytest.mark.parametrize("t13,t2", [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")])
def test_every_batch_through_the_path_it_takes(t13, t2):
    layer, w13, w2 = experts_layer(t13, t2)
    for tokens in [*range(1, 33), 33, 64, 256, 512]:
        x, weights, ids = routed(tokens, t13, t2)
        got = layer(x, weights, ids)
        check(got, fused_moe_ref(x, w13, w2, weights, ids), f"{t13}/{t2} at {tokens} tokens")


def test_decode_path_replays_in_a_cuda_graph():
    layer, w13, w2 = experts_layer("Q4_K", "Q6_K")
    x, weights, ids = routed(1, "graph")
    layer(x, weights, ids)  # compiled eagerly first, as the engine does
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, weights, ids)
    for step in range(3):
        fresh = routed(1, "graph", step)
        for dst, src in zip((x, weights, ids), fresh):
            dst.copy_(src)
        graph.replay()
        check(out, fused_moe_ref(x, w13, w2, weights, ids), f"graph replay {step}")


def test_an_isq_moe_engine_with_cuda_graphs_matches_eager():
    prompts = [[3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]]
    graphs = engine(
        "random:tiny-qwen3-moe", device="cuda", isq="q4_k", runner={"max_cuda_graph_batch": 32}
    )
    eager = engine(
        "random:tiny-qwen3-moe", device="cuda", isq="q4_k", runner={"disable_cuda_graph": True}
    )
    assert greedy(graphs, prompts, 16) == greedy(eager, prompts, 16)

"""The plugin's kernels on a CUDA GPU at llama-3-8b shapes, against their torch references, on
fresh random inputs (set TALLOW_TEST_SEED to replay a run): every decode batch size up to 16
through the kernel the engine picks, large batches through each path, configurations of the
tuning sweep, PDL, split-K, and CUDA-graph replay of the kernels and of a whole engine serving
a quantized model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from kernel_cases import BASE_SEED, close, seed_of, weight  # noqa: E402
from quant_engine_runs import engine, greedy  # noqa: E402
from tallow.plugin.testing.engine import replay_own_graph_sizes  # noqa: E402
from tallow_quant_gguf import ops  # noqa: E402
from tallow_quant_gguf.kernels.gemv import _gemv_kernel, gemv_triton  # noqa: E402
from tallow_quant_gguf.kernels.matmul import _mma_kernel, qmatmul_triton  # noqa: E402
from tallow_quant_gguf.reference import dequantize_ref  # noqa: E402
from tallow_quant_gguf.scheme import KernelPolicy  # noqa: E402

#: (N, K) of llama-3-8b's projections: qkv, o, gate_up, down (the head is in quant_micro.py)
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def x_of(m: int, k: int, *parts: object) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed_of("x", m, k, *parts))
    return torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "Q5_0", "Q4_0"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_decode_batch_through_the_kernel_the_engine_picks(qtype, n, k):
    _, packed = weight(qtype, n, k, "gpu")
    w = dequantize_ref(packed)
    for m in range(1, 17):
        x = x_of(m, k, qtype, n)
        close(ops.linear(x, [packed]), x, w, None, f"{qtype} [{n}, {k}] m={m}")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_sweep_configurations(qtype):
    """The corners of the tuning sweep's candidates compute the product."""
    from tallow_quant_gguf.tuning import candidates

    n, k = 4096, 4096
    _, packed = weight(qtype, n, k, "sweep")
    w = dequantize_ref(packed)
    for m in (1, 4, 64):
        x = x_of(m, k, "sweep", qtype)
        for choice in candidates(qtype, n, k, m, corners=True):
            got = (
                ops._fused(x, packed, None, choice, None)
                if choice.path != "dequant"
                else ops.linear(x, [packed], policy=KernelPolicy(matmul="dequant"))
            )
            close(got, x, w, None, f"{qtype} m={m} {choice}")


@pytest.mark.parametrize("matmul", ["fused", "dequant"])
@pytest.mark.parametrize("m", [64, 256, 1000])
def test_large_batches_each_path(matmul, m):
    n, k = 4096, 4096
    _, packed = weight("Q4_K", n, k, "large")
    w = dequantize_ref(packed)
    x = x_of(m, k, matmul)
    policy = KernelPolicy(matmul=matmul)
    close(ops.linear(x, [packed], policy=policy), x, w, None, f"{matmul} m={m}")


def test_pdl_launch_matches_plain_launch():
    from tallow.kernels import compiled_with_pdl, off_then_on, pdl_enabled

    if not pdl_enabled(torch.empty(1, device="cuda")):
        pytest.skip("PDL needs compute capability 9.0+ and a Triton with gdc_wait")
    _, packed = weight("Q4_K", 4096, 4096, "pdl")
    x = x_of(4, 4096, "pdl")
    off, on = off_then_on(lambda: gemv_triton(x[:1], packed, config=(4, 1, 1, True)))
    assert torch.equal(off, on)
    assert compiled_with_pdl(_gemv_kernel) is not False
    off, on = off_then_on(lambda: qmatmul_triton(x, packed))
    assert torch.equal(off, on)
    assert compiled_with_pdl(_mma_kernel) is not False


def test_split_k_is_deterministic_and_leaves_its_counters_at_zero():
    from tallow_quant_gguf.kernels.splitk import counters

    _, packed = weight("Q4_K", 4096, 14336, "split")
    x = x_of(16, 14336, "split")
    first = gemv_triton(x[:1], packed, config=(4, 1, 7, True))
    for _ in range(3):
        assert torch.equal(gemv_triton(x[:1], packed, config=(4, 1, 7, True)), first)
    close(first, x[:1], dequantize_ref(packed), None, "split gemv")
    many = qmatmul_triton(x, packed, config=(16, 64, 8, 4, 3, 7, 1))
    close(many, x, dequantize_ref(packed), None, "split mma")
    torch.cuda.synchronize()
    assert int(counters(x.device).count_nonzero()) == 0


def test_graph_replay_equals_eager_for_every_path():
    parts = [weight("Q4_K", 1024, 4096, "graph")[1], weight("Q8_0", 512, 4096, "graph")[1]]
    policy = KernelPolicy(dequant_min_rows=128)
    ops.warm_up(parts, torch.bfloat16, policy)
    for m in (1, 8, 64, 256):  # gemv (split), tensor cores (split), tensor cores, workspace
        x = x_of(m, 4096, "graph")
        eager = ops.linear(x, parts, policy=policy)
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ops.linear(static_x, parts, policy=policy)  # warm-up: compile outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.linear(static_x, parts, policy=policy)
        static_x.copy_(x_of(m, 4096, "other"))
        graph.replay()
        expected = ops.linear(static_x, parts, policy=policy)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"m={m} (TALLOW_TEST_SEED={BASE_SEED})"
        assert not torch.equal(out, eager)


def _graphs_and_eager(source: str, max_model_len: int, **model):
    """Engines with and without CUDA graphs (decode batches up to 32 captured)."""
    return [
        engine(
            source,
            device="cuda",
            dtype="bfloat16",
            num_blocks=2048,
            max_model_len=max_model_len,
            attention_splits=4,
            runner={"disable_cuda_graph": disable, "max_cuda_graph_batch": 32},
            **model,
        )
        for disable in (False, True)
    ]


def _assert_same_tokens(graphs, eager, vocab: int, what: str) -> None:
    assert graphs.core.runner.graphs is not None and eager.core.runner.graphs is None
    replay_own_graph_sizes(graphs)
    g = torch.Generator().manual_seed(seed_of(what))
    for n in (
        1,
        2,
        4,
        8,
        16,
    ):  # captured sizes, each replaying its own graph: eager runs the same kernels
        batch = [
            torch.randint(0, vocab, (int(L),), generator=g).tolist()
            for L in torch.randint(3, 300, (n,), generator=g)
        ]
        assert greedy(graphs, batch, 24) == greedy(eager, batch, 24), (
            f"{what}: batch {n} (TALLOW_TEST_SEED={BASE_SEED})"
        )


def test_engine_graph_replay_equals_eager_for_a_q4_k_gguf_model(tmp_path):
    from quant_gguf_files import VOCAB, write_llama_gguf

    layers = [
        {
            "attn_q": "Q4_K",
            "attn_k": "Q4_K",
            "attn_v": "Q4_K",
            "attn_output": "Q4_K",
            "ffn_gate": "Q4_K",
            "ffn_up": "Q4_K",
            "ffn_down": "Q4_K",
        }
    ] * 3
    path = str(
        write_llama_gguf(
            tmp_path / "q4k.gguf",
            layer_types=layers,
            embed_type="Q4_K",
            head_type="Q6_K",
            seed=seed_of("engine") % 1000,
        )
    )
    graphs, eager = _graphs_and_eager(path, 512)  # the file's context length
    assert type(graphs.parts.loaded.quant).__name__ == "GGUFQuantScheme"
    _assert_same_tokens(graphs, eager, VOCAB, "q4_k gguf")


def test_isq_q4_k_model_graphs_equal_eager_and_weights_are_the_quantized_size():
    graphs, eager = _graphs_and_eager("random:llama-3.2-1b", 2048, isq="q4_k")
    loaded = graphs.parts.loaded
    # the quantized size: the GGML bytes of every matrix, plus what the model holds dense
    ggml = planes = 0
    for module in loaded.model.modules():
        method = getattr(module, "quant_method", None)
        for p in getattr(method, "parts", []):
            ggml += p.rows * p.qtype.row_bytes(p.cols) if p.qtype else p.nbytes
            planes += p.nbytes
    expected = loaded.weight_bytes - planes + ggml
    assert expected <= loaded.weight_bytes <= 1.05 * expected
    assert "Q4_K x" in loaded.quant.summary()
    _assert_same_tokens(graphs, eager, 120000, "isq q4_k")

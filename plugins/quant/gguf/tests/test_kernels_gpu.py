"""The plugin's kernels on a CUDA GPU at llama-3-8b shapes, against their torch references, on
fresh random inputs (set TALLOW_TEST_SEED to replay a run): every decode batch size up to 16
and large batches through each of the three matmul paths, PDL, and CUDA-graph replay of the
kernels and of a whole engine serving a quantized model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from kernel_cases import BASE_SEED, close, seed_of, weight  # noqa: E402
from tallow_quant_gguf import ops  # noqa: E402
from tallow_quant_gguf.kernels.matmul import _qmatmul_kernel, qmatmul_triton  # noqa: E402
from tallow_quant_gguf.reference import dequantize_ref  # noqa: E402
from tallow_quant_gguf.scheme import KernelPolicy  # noqa: E402

#: (N, K) of llama-3-8b's projections: qkv, o, gate_up, down (the head is in quant_micro.py)
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def x_of(m: int, k: int, *parts: object) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed_of("x", m, k, *parts))
    return torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "Q5_0", "Q4_0"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_gemv_every_decode_batch(qtype, n, k):
    _, packed = weight(qtype, n, k, "gpu")
    w = dequantize_ref(packed)
    for m in range(1, 17):
        x = x_of(m, k, qtype, n)
        close(qmatmul_triton(x, packed), x, w, None, f"{qtype} [{n}, {k}] m={m}")


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
    from tallow.kernels.pdl import compiled_with_pdl, off_then_on, pdl_enabled

    if not pdl_enabled(torch.empty(1, device="cuda")):
        pytest.skip("PDL needs compute capability 9.0+ and a Triton with gdc_wait")
    _, packed = weight("Q4_K", 4096, 4096, "pdl")
    x = x_of(1, 4096, "pdl")
    off, on = off_then_on(lambda: qmatmul_triton(x, packed))
    assert torch.equal(off, on)
    assert compiled_with_pdl(_qmatmul_kernel) is not False


def test_graph_replay_equals_eager_for_every_path():
    parts = [weight("Q4_K", 1024, 4096, "graph")[1], weight("Q8_0", 512, 4096, "graph")[1]]
    policy = KernelPolicy(gemv_max_rows=16, dequant_min_rows=128)
    for m in (1, 8, 64, 256):  # gemv, gemv (dot), fused gemm, workspace + cuBLAS
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


def _engine(path: str, disable_cuda_graph: bool):
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine

    return LLMEngine.from_config(config_from_mapping({
        "model": {"source": path, "device": "cuda", "dtype": "bfloat16", "max_model_len": 512},
        "cache": {"num_blocks": 256},
        "runner": {"disable_cuda_graph": disable_cuda_graph, "max_cuda_graph_batch": 16},
        "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
    }))


def test_engine_graph_replay_equals_eager_for_a_q4_k_model(tmp_path):
    from quant_gguf_files import write_llama_gguf
    from tallow.engine.sampling_params import SamplingParams

    layers = [{"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q4_K", "attn_output": "Q4_K",
               "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q4_K"}] * 3
    path = str(write_llama_gguf(tmp_path / "q4k.gguf", layer_types=layers, embed_type="Q4_K",
                                head_type="Q6_K", seed=seed_of("engine") % 1000))
    graphs = _engine(path, disable_cuda_graph=False)
    eager = _engine(path, disable_cuda_graph=True)
    assert graphs.core.runner.graphs is not None and eager.core.runner.graphs is None
    assert type(graphs.parts.loaded.quant).__name__ == "GGUFQuantScheme"
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    g = torch.Generator().manual_seed(seed_of("prompts"))
    for n in (1, 2, 4, 8, 16):  # captured sizes: no padding, so eager runs the same kernels
        batch = [torch.randint(0, 320, (int(L),), generator=g).tolist()
                 for L in torch.randint(3, 40, (n,), generator=g)]

        def run(engine):
            ids = []
            for p in batch:
                ids.append(engine.next_request_id())
                engine.add_request(ids[-1], p, params)
            done = {}
            while engine.has_unfinished():
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out.outputs[0].token_ids
            return [done[i] for i in ids]

        assert run(graphs) == run(eager), f"batch {n} (TALLOW_TEST_SEED={BASE_SEED})"


def test_isq_q4_k_model_graphs_equal_eager_and_weights_are_the_quantized_size():
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow.engine.sampling_params import SamplingParams

    def engine(disable_cuda_graph: bool) -> LLMEngine:
        return LLMEngine.from_config(config_from_mapping({
            "model": {"source": "random:llama-3.2-1b", "dtype": "bfloat16", "device": "cuda",
                      "max_model_len": 2048, "isq": "q4_k"},
            "cache": {"num_blocks": 2048},
            "runner": {"disable_cuda_graph": disable_cuda_graph, "max_cuda_graph_batch": 32},
            "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
        }))

    graphs, eager = engine(False), engine(True)
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
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    g = torch.Generator().manual_seed(seed_of("isq prompts"))
    for n in (1, 2, 4, 16):
        batch = [torch.randint(10, 120000, (int(L),), generator=g).tolist()
                 for L in torch.randint(5, 300, (n,), generator=g)]
        outs = []
        for eng in (graphs, eager):
            ids = []
            for p in batch:
                ids.append(eng.next_request_id())
                eng.add_request(ids[-1], p, params)
            done = {}
            while eng.has_unfinished():
                for out in eng.step():
                    if out.finished:
                        done[out.request_id] = out.outputs[0].token_ids
            outs.append([done[i] for i in ids])
        assert outs[0] == outs[1], f"batch {n} (TALLOW_TEST_SEED={BASE_SEED})"

"""The plugin on a CUDA GPU: its kernels at llama-3-8b's shapes against the float32 product of
the decoded weights (every decode batch size up to 16 through the small-batch kernel, larger
batches through the workspace and cuBLAS, bfloat16 decoding bit for bit), PDL on and off,
CUDA-graph replay of the kernels and of whole engines, and a GPTQ checkpoint against the
transformers model of its decoded weights."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from engines import engine, greedy  # noqa: E402
from int_weights import random_unpacked  # noqa: E402
from tallow.plugin.testing.engine import replay_own_graph_sizes  # noqa: E402
from tallow_quant_int4 import ops  # noqa: E402
from tallow_quant_int4.kernels.dequant import dequantize_triton  # noqa: E402
from tallow_quant_int4.kernels.gemv import _gemv_kernel, gemv_config, gemv_triton  # noqa: E402
from tallow_quant_int4.layout import dequantize, from_codes  # noqa: E402

#: (N, K) of llama-3-8b's projections: qkv, o, gate_up, down
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def weight(
    n: int,
    k: int,
    *,
    bits: int = 4,
    zeros: bool = False,
    group: int = 128,
    act_order: bool = False,
    seed: int = 0,
):
    u = random_unpacked(n, k, bits=bits, group=group, zeros=zeros, act_order=act_order, seed=seed)
    return from_codes(u.codes, u.scales, u.zeros, bits, group_index=u.group_index).to("cuda")


def x_of(m: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)


def close(got: torch.Tensor, x: torch.Tensor, w, what: str) -> None:
    """Within bfloat16 rounding of the float32 product of x and the decoded weight."""
    want = x.float() @ dequantize(w).T
    scale = float(want.abs().max())
    torch.testing.assert_close(
        got.float(), want, rtol=1e-2, atol=1e-2 * scale, msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("zeros", [False, True])
def test_every_decode_batch_size(n, k, zeros):
    w = weight(n, k, zeros=zeros, seed=n + k)
    for m in range(1, 17):
        x = x_of(m, k, seed=m)
        close(ops.linear(x, [w]), x, w, f"[{n}, {k}] m={m}")


@pytest.mark.parametrize("m", [17, 256, 1000])
@pytest.mark.parametrize("bits", [4, 8])
def test_large_batches_through_the_workspace(m, bits):
    w = weight(4096, 4096, bits=bits, zeros=bits == 8, group=64)
    x = x_of(m, 4096, seed=m)
    close(ops.linear(x, [w]), x, w, f"int{bits} m={m}")


def test_act_order_weights_read_x_permuted():
    w = weight(4096, 4096, act_order=True, seed=5)
    for m in (1, 4, 64):
        x = x_of(m, 4096, seed=m)
        close(ops.linear(x, [w]), x, w, f"act-order m={m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantization_is_the_reference_bit_for_bit(dtype):
    for w in (weight(1024, 4096, seed=1), weight(512, 4096, bits=8, zeros=True, seed=2)):
        assert torch.equal(dequantize_triton(w, dtype), dequantize(w, dtype, natural_order=False))


def test_pdl_launch_matches_plain_launch():
    from tallow.kernels import compiled_with_pdl, off_then_on, pdl_enabled

    if not pdl_enabled(torch.empty(1, device="cuda")):
        pytest.skip("PDL needs compute capability 9.0+ and a Triton with gdc_wait")
    w = weight(4096, 4096, seed=3)
    x = x_of(4, 4096, seed=3)
    for m in (1, 4):
        off, on = off_then_on(lambda: gemv_triton(x[:m], w, config=gemv_config(m, 4096, 4096)))
        assert torch.equal(off, on)
    assert compiled_with_pdl(_gemv_kernel) is not False


def test_graph_replay_equals_eager_for_every_path():
    parts = [weight(1024, 4096, seed=4), weight(512, 4096, zeros=True, seed=5)]
    ops.warm_up(parts, torch.bfloat16)
    for m in (1, 2, 8, 16, 64):
        x = x_of(m, 4096, seed=m)
        eager = ops.linear(x, parts)
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ops.linear(static_x, parts)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.linear(static_x, parts)
        static_x.copy_(x_of(m, 4096, seed=100 + m))
        graph.replay()
        expected = ops.linear(static_x, parts)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"m={m}"
        assert not torch.equal(out, eager)


def _engine(source: str, *, graphs: bool, **model):
    return engine(
        source,
        device="cuda",
        dtype="bfloat16",
        max_model_len=2048,
        num_blocks=2048,
        runner={"disable_cuda_graph": not graphs, "max_cuda_graph_batch": 32},
        **model,
    )


def test_isq_int4_engine_graphs_equal_eager():
    rtn = {"method": "rtn"}  # drawn and rounded a slice at a time: both engines alike
    graphs = _engine("random:llama-3.2-1b", graphs=True, isq="int4", int4=rtn)
    eager = _engine("random:llama-3.2-1b", graphs=False, isq="int4", int4=rtn)
    assert graphs.core.runner.graphs is not None and eager.core.runner.graphs is None
    assert "int4 asym g128" in graphs.parts.loaded.quant.summary()
    replay_own_graph_sizes(graphs)
    g = torch.Generator().manual_seed(0)
    for n in (
        1,
        2,
        4,
        8,
        16,
        32,
    ):  # captured sizes, each replaying its own graph: eager runs the same kernels
        batch = [
            torch.randint(0, 120000, (int(L),), generator=g).tolist()
            for L in torch.randint(3, 300, (n,), generator=g)
        ]
        assert greedy(graphs, batch, 24) == greedy(eager, batch, 24), f"batch {n}"


def test_isq_gptq_calibrates_on_the_gpu_the_same_on_every_load():
    """The default method: the engine runs the model over calibration text on the GPU, then
    every layer is quantized by GPTQ there; two loads give the same codes and the engine
    serves with CUDA graphs."""
    # tallow's source: present wherever tallow is, unlike the default corpus's package
    small = {"calibration_sequences": 8, "calibration_tokens": 256, "calibration_corpus": "source"}
    first = _engine("random:llama-3.2-1b", graphs=True, isq="int4", int4=small)
    again = _engine("random:llama-3.2-1b", graphs=False, isq="int4", int4=small)
    quant = first.parts.loaded.quant
    assert quant.summary().endswith("quantized at load to int4 (gptq)") and not quant.calibrating

    def codes(eng):
        layer = eng.parts.loaded.model.model.layers[3]
        return [
            layer.self_attn.qkv_proj.quant_method.parts[0].codes,
            layer.mlp.down_proj.quant_method.parts[0].codes,
        ]

    assert all(torch.equal(a, b) for a, b in zip(codes(first), codes(again)))
    batch = [[5, 17, 300, 2], [9] * 40]
    assert greedy(first, batch, 16) == greedy(again, batch, 16)


@pytest.mark.parametrize("fmt", ["gptq-act-order-asym", "awq", "compressed-tensors"])
def test_a_checkpoint_on_the_gpu_matches_its_decoded_float_model(tmp_path, fmt):
    """float32 activations: the small-batch kernel's float32 sums and cuBLAS's float32
    product against transformers' float32 model of the decoded weights."""
    from tallow.config import config_from_mapping
    from tallow.engine.loader import load_model
    from tallow.plugin.manager import load_plugins
    from tallow.plugin.testing import PagedRunner
    from tiny_checkpoints import write_checkpoint

    pytest.importorskip("transformers", reason="transformers is the float oracle")
    if fmt.startswith("compressed"):
        pytest.importorskip("compressed_tensors", reason="compressed-tensors packs it")
    path, hf = write_checkpoint(tmp_path, fmt)
    config = config_from_mapping(
        {"model": {"source": str(path), "device": "cuda", "dtype": "float32"}}
    )
    loaded = load_model(
        load_plugins(config.plugins).registries,
        str(path),
        device=torch.device("cuda"),
        dtype="float32",
        config=config,
    )
    runner = PagedRunner(loaded.model)
    runner.add(0)
    prompt = [3, 17, 250, 9, 64, 128, 5, 77] * 3  # 24 rows: the workspace path
    logits = runner.step([(0, prompt)])[0]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0]
    scale = float(want.abs().max())
    torch.testing.assert_close(logits.cpu(), want, rtol=1e-3, atol=1e-3 * scale)
    step = runner.step([(0, [int(logits[-1].argmax())])])[0]  # one row: the small-batch kernel
    with torch.no_grad():
        want = hf(torch.tensor([prompt + [int(logits[-1].argmax())]])).logits[0, -1:]
    torch.testing.assert_close(step.cpu(), want, rtol=1e-3, atol=1e-3 * scale)

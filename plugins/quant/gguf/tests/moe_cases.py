"""The quantized-expert kernels and the GGUF MoEMethod against the torch reference, at small
shapes: the experts' blocks decoded by the ``gguf`` package (the oracle), then the core's
``fused_moe_ref``.

Not collected on its own (no ``test_`` prefix): ``test_moe_interpret.py`` runs it in a
subprocess with ``TRITON_INTERPRET=1`` so the kernels execute on the CPU; on a CUDA machine
``python -m pytest plugins/quant/gguf/tests/moe_cases.py`` runs it on the GPU. Random
blocks from the test seed; set TALLOW_TEST_SEED to replay one.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import fused_moe_ref, interpreting
from tallow.layers import BuildContext, FusedMoE, QuantizedWeight, RouterSpec
from tallow_quant_gguf.experts import GGUFMoEMethod
from tallow_quant_gguf.kernels.moe import moe_down_triton, moe_up_triton
from tallow_quant_gguf.packing import pack
from tallow_quant_gguf.qtypes import QUANT_TYPES
from tallow_quant_gguf.scheme import GGUFQuantScheme

if interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
        "(test_moe_interpret.py runs this module that way)",
        allow_module_level=True,
    )

BASE_SEED = base_seed()
#: rows per program and warps small enough for the interpreter to run few programs
FAST = (32, 1, 1, True)


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def blocks(qtype: str, rows: int, cols: int, *parts: object) -> np.ndarray:
    return random_blocks(
        qtype,
        rows,
        cols // QUANT_TYPES[qtype].block,
        seed=seed_of(qtype, rows, cols, *parts),
        extremes=False,
        d_range=(1e-4, 2e-3),
    )


def oracle(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The blocks decoded by the ``gguf`` package, float32 of ``shape``."""
    import gguf

    values = gguf.quants.dequantize(
        raw.reshape(-1, raw.shape[-1]), gguf.GGMLQuantizationType[qtype]
    )
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)


def routing(tokens: int, experts: int, top_k: int, *parts: object):
    g = torch.Generator().manual_seed(seed_of("routing", tokens, experts, top_k, *parts))
    weights, ids = torch.randn(tokens, experts, generator=g).softmax(-1).topk(top_k, dim=-1)
    return weights.to(DEVICE), ids.to(DEVICE)


def activations(tokens: int, hidden: int, dtype: torch.dtype, *parts: object) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed_of("x", tokens, hidden, *parts))
    return torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)


def assert_close(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """float32 sums in another order (and, in 16-bit dtypes, the intermediate rounded in a
    different place): a small fraction of the output's scale (the types with mins cancel
    large terms, so float32 keeps fewer digits of the result than of its terms)."""
    assert got.shape == expected.shape, what
    rel = 1e-4 if got.dtype == torch.float32 else 3e-2
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((got.float().cpu() - expected.float().cpu()).abs().max())
    assert err <= rel * scale, (
        f"{what} (TALLOW_TEST_SEED={BASE_SEED}): max error {err:.3g} of scale {scale:.3g}"
    )


def experts(e: int, h: int, i: int, t13: str, t2: str, *parts: object):
    """(stacked gate/up blocks [E, 2I, bytes], down blocks [E, H, bytes]) and their oracles."""
    raw13 = blocks(t13, e * 2 * i, h, "w13", *parts).reshape(e, 2 * i, -1)
    raw2 = blocks(t2, e * h, i, "w2", *parts).reshape(e, h, -1)
    return raw13, raw2, oracle(raw13, t13, (e, 2 * i, h)), oracle(raw2, t2, (e, h, i))


def run_kernels(x, raw13, raw2, t13, t2, weights, ids, config=FAST):
    e = raw13.shape[0]
    p13 = pack(torch.from_numpy(raw13.reshape(-1, raw13.shape[-1])).to(DEVICE), t13)
    p2 = pack(torch.from_numpy(raw2.reshape(-1, raw2.shape[-1])).to(DEVICE), t2)
    h = moe_up_triton(x, p13, e, ids, swiglu=True, config=config)
    return moe_down_triton(h, p2, e, weights, ids, config=config)


@pytest.mark.parametrize(
    "t13,t2",
    [
        ("Q4_K", "Q6_K"),
        ("Q4_K", "Q4_K"),
        ("Q8_0", "Q8_0"),
        ("Q5_K", "Q3_K"),
        ("Q2_K", "Q5_0"),
        ("IQ4_XS", "Q4_1"),
    ],
)
def test_decode_kernels_match_the_reference_for_each_type(t13, t2):
    e, h, i, tokens, top_k = 8, 256, 256, 2, 2
    raw13, raw2, w13, w2 = experts(e, h, i, t13, t2)
    x = activations(tokens, h, torch.float32, t13)
    weights, ids = routing(tokens, e, top_k, t13)
    got = run_kernels(x, raw13, raw2, t13, t2, weights, ids)
    assert_close(got, fused_moe_ref(x, w13.to(DEVICE), w2.to(DEVICE), weights, ids), f"{t13}/{t2}")


@pytest.mark.parametrize(
    "experts_n,top_k,tokens",
    [(8, 1, 1), (8, 8, 1), (64, 4, 3), (128, 8, 1), (128, 2, 5), (64, 8, 2)],
)
def test_decode_kernels_over_expert_counts_top_k_and_tokens(experts_n, top_k, tokens):
    # Q8_0 down: 32-element blocks keep I (and so the weights) small at 128 experts
    h, i = 256, 96  # 96 rows in program blocks of 64: the masked (uneven) tail is exercised
    raw13, raw2, w13, w2 = experts(experts_n, h, i, "Q4_K", "Q8_0", top_k, tokens)
    x = activations(tokens, h, torch.float32, experts_n, top_k)
    weights, ids = routing(tokens, experts_n, top_k)
    got = run_kernels(x, raw13, raw2, "Q4_K", "Q8_0", weights, ids, config=(64, 1, 1, True))
    assert_close(
        got,
        fused_moe_ref(x, w13.to(DEVICE), w2.to(DEVICE), weights, ids),
        f"E={experts_n} top-{top_k} T={tokens}",
    )


@pytest.mark.parametrize("config", [(4, 1, 1, True), (16, 2, 1, False)])
def test_decode_kernels_under_other_configurations_and_bf16(config):
    e, h, i, tokens, top_k = 8, 256, 32, 1, 2
    raw13, raw2, w13, w2 = experts(e, h, i, "Q4_K", "Q8_0", config)
    x = activations(tokens, h, torch.bfloat16, config)
    weights, ids = routing(tokens, e, top_k, config)
    got = run_kernels(x, raw13, raw2, "Q4_K", "Q8_0", weights, ids, config=config)
    assert got.dtype == torch.bfloat16
    assert_close(
        got,
        fused_moe_ref(
            x, w13.to(DEVICE, torch.bfloat16), w2.to(DEVICE, torch.bfloat16), weights, ids
        ),
        str(config),
    )


def test_up_kernel_without_swiglu_is_each_pairs_plain_product():
    e, h, i, tokens, top_k = 8, 256, 40, 3, 2
    raw = blocks("Q6_K", e * i, h, "plain").reshape(e, i, -1)
    w = oracle(raw, "Q6_K", (e, i, h)).to(DEVICE)
    p = pack(torch.from_numpy(raw.reshape(e * i, -1)).to(DEVICE), "Q6_K")
    x = activations(tokens, h, torch.float32, "plain")
    _, ids = routing(tokens, e, top_k, "plain")
    got = moe_up_triton(x, p, e, ids, swiglu=False, config=FAST)
    expected = torch.stack([x[t // top_k] @ w[ids.reshape(-1)[t]].T for t in range(tokens * top_k)])
    assert_close(got, expected, "plain up")


def moe_layer(e: int, h: int, i: int, top_k: int, *, quant: object) -> FusedMoE:
    build = BuildContext(dtype=torch.float32, device=DEVICE, quant=quant)
    return FusedMoE(
        e, h, i, router=RouterSpec(top_k=top_k, renormalize=True), build=build, prefix="mlp"
    )


def quantized(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> QuantizedWeight:
    def dequantize(data: torch.Tensor, qt: str, shp: tuple[int, ...]) -> torch.Tensor:
        return oracle(data.numpy(), qt, shp)

    return QuantizedWeight(
        "gguf", qtype, shape, torch.from_numpy(np.ascontiguousarray(raw)), dequantize
    )


@pytest.mark.parametrize("tokens", [1, 5, 33, 512])
def test_the_method_takes_either_path_and_matches_the_float_layer(tokens, monkeypatch):
    """A FusedMoE under the gguf scheme, loaded from stacked GGUF tensors (Q4_K gate and up
    apart, Q6_K down), equals the float layer loaded with their decoded values: through the
    decode kernels up to 32 tokens, the workspace and grouped GEMM above."""
    if interpreting():  # the interpreter runs programs one by one: few, large ones
        monkeypatch.setattr(GGUFMoEMethod, "_config", lambda self, p, rows, device: FAST)
    e, h, i, top_k = 8, 256, 256, 2
    scheme = GGUFQuantScheme(None)
    quant_layer = moe_layer(e, h, i, top_k, quant=scheme)
    float_layer = moe_layer(e, h, i, top_k, quant=None)
    raw13, raw2, w13, w2 = experts(e, h, i, "Q4_K", "Q6_K", "layer")
    gate_w = torch.randn(e, h, generator=torch.Generator().manual_seed(seed_of("gate"))) * 0.1
    for layer in (quant_layer, float_layer):
        layer.gate.weight.weight_loader(layer.gate.weight, gate_w)
        params = dict(layer.experts.named_parameters())
        for name, tensor, shard in (
            ("w13_weight", quantized(raw13[:, :i], "Q4_K", (e, i, h)), ("*", "gate")),
            ("w13_weight", quantized(raw13[:, i:], "Q4_K", (e, i, h)), ("*", "up")),
            ("w2_weight", quantized(raw2, "Q6_K", (e, h, i)), None),
        ):
            param = params[name]
            # what CausalLM.load_weights does: blocks only to a loader that keeps them
            param.weight_loader(
                param,
                tensor if getattr(param, "accepts_quantized", False) else tensor.dequantize(),
                shard,
            )
        for module in layer.modules():
            if getattr(module, "quant_method", None) is not None:
                module.quant_method.process_weights_after_loading(module)
    assert "w13_nib" in dict(quant_layer.experts.named_buffers())
    x = activations(tokens, h, torch.float32, "layer")
    assert_close(quant_layer(x), float_layer(x), f"{tokens} tokens")

"""The vectorised quantizer (``tallow_quant_gguf.quantize``) against its oracles.

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: byte for byte against ``gguf.quants.quantize``.
- Q2_K … Q6_K: byte for byte against the plain per-block transcription of llama.cpp's
  reference quantizers (``quantize_row_q*_K_ref`` and the searches they call) in
  ``test_quantize_reference.py``; identical bytes make the round-trip error of every block,
  measured by dequantizing with ``gguf.quants.dequantize``, exactly the reference's — which
  is asserted too, block by block.
- Every type: the bytes dequantize through ``gguf.quants.dequantize`` to values close to the
  input.

The authority on the k-quants' bytes is llama.cpp itself (``test_quantize_llama_cpp.py`` runs
its quantizer on whole models); the transcription here is the fast check.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from test_quantize_reference import reference_quantize  # noqa: E402

from tallow_quant_gguf.quantize import QUANT_TYPES, quant_type, quantize  # noqa: E402

LEGACY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
KQUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def _gguf_type(qtype: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[qtype.upper()]


def _hard_blocks(block: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks that exercise the corner cases: zeros, constants, ties of the absolute maximum
    in both orders, exact halves, one outlier, one sign only, tiny and huge magnitudes."""
    blocks = []
    blocks.append(np.zeros(block))
    blocks.append(np.full(block, 0.75))
    blocks.append(np.full(block, -3.0))
    tie = rng.uniform(-1, 1, block)
    tie[3], tie[block - 2] = 2.0, -2.0  # +max first
    blocks.append(tie)
    tie = tie.copy()
    tie[3], tie[block - 2] = -2.0, 2.0  # -max first
    blocks.append(tie)
    # values on the rounding boundaries of a scale-1 grid
    blocks.append(np.resize(np.arange(-8, 8) + 0.5, block))
    blocks.append(np.resize(np.arange(-16, 16) * 0.5, block))
    outlier = rng.standard_normal(block) * 0.01
    outlier[block // 3] = 40.0
    blocks.append(outlier)
    blocks.append(np.abs(rng.standard_normal(block)) + 0.5)
    blocks.append(-np.abs(rng.standard_normal(block)) - 0.5)
    blocks.append(rng.standard_normal(block) * 1e-6)
    blocks.append(rng.standard_normal(block) * 1e4)
    sparse = rng.standard_normal(block)
    sparse[rng.random(block) < 0.8] = 0.0
    blocks.append(sparse)
    blocks.append(rng.standard_t(2, block))
    return np.stack(blocks).astype(np.float32)


def _test_matrix(qtype: str, seed: int, random_rows: int) -> np.ndarray:
    """Rows of one block each for the corner cases, then random rows of 8 blocks."""
    block = quant_type(qtype).block_elems
    rng = np.random.default_rng(seed)
    hard = _hard_blocks(block, rng)
    cols = 8 * block
    hard_rows = np.concatenate([hard, np.zeros((-len(hard) % 8, block), np.float32)])
    hard_rows = hard_rows.reshape(-1, cols)
    scale = np.exp(rng.uniform(-4, 2, (random_rows, 1)))
    random = (rng.standard_normal((random_rows, cols)) * scale).astype(np.float32)
    return np.concatenate([hard_rows, random])


@pytest.mark.parametrize("qtype", LEGACY)
def test_legacy_types_are_byte_identical_to_gguf(qtype: str) -> None:
    from gguf.quants import quantize as gguf_quantize

    x = _test_matrix(qtype, seed=1, random_rows=64)
    # magnitudes at the ends of float16 and beyond it, where the stored scale saturates
    extremes = np.array(
        [[1e30, -1e30, 65504.0, -1e-30] * 64, [3e38, -3e38, 1.0, 0.0] * 64], dtype=np.float32
    )
    x = np.concatenate([x, extremes])
    ours = quantize(torch.from_numpy(x), qtype).numpy()
    with np.errstate(over="ignore", invalid="ignore"):  # scales beyond float16, inf - inf
        theirs = gguf_quantize(x, _gguf_type(qtype))
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    mismatched = np.nonzero((ours != theirs).any(axis=1))[0]
    assert mismatched.size == 0, f"rows {mismatched.tolist()} differ from gguf's bytes"


@pytest.mark.parametrize("qtype", KQUANTS)
def test_kquants_are_byte_identical_to_the_llama_cpp_reference(qtype: str) -> None:
    from gguf.quants import dequantize

    x = _test_matrix(qtype, seed=2, random_rows=6)
    ours = quantize(torch.from_numpy(x), qtype).numpy()
    theirs = reference_quantize(x, qtype)
    t = quant_type(qtype)
    ours_blocks = ours.reshape(-1, t.type_bytes)
    theirs_blocks = theirs.reshape(-1, t.type_bytes)
    differing = np.nonzero((ours_blocks != theirs_blocks).any(axis=1))[0]
    assert differing.size == 0, f"super-blocks {differing.tolist()} differ from the reference"
    # The round-trip error of every super-block, through gguf's dequantizer.
    blocks = x.reshape(-1, t.block_elems).astype(np.float64)
    err_ours = (dequantize(ours, _gguf_type(qtype)).reshape(blocks.shape) - blocks) ** 2
    err_ref = (dequantize(theirs, _gguf_type(qtype)).reshape(blocks.shape) - blocks) ** 2
    assert np.array_equal(err_ours.sum(axis=1), err_ref.sum(axis=1))


def test_the_square_root_is_c_sqrtf() -> None:
    """Q4_K/Q5_K weight each sub-block by ``sqrtf(sum x² / 32)``; torch's float32 CPU root can
    be one unit in the last place low (as for this sum, which made a Q4_K block differ from
    llama.cpp's), so the quantizer takes a correctly rounded one — numpy's float32 root."""
    from tallow_quant_gguf.quantize_ops import sqrt_f32

    rng = np.random.default_rng(5)
    values = np.concatenate(
        [
            np.array([np.float32(1.0088632106781006) / np.float32(32)], dtype=np.float32),
            (10.0 ** rng.uniform(-30, 30, 100_000)).astype(np.float32),
            rng.uniform(0, 4, 100_000).astype(np.float32),
        ]
    )
    ours = sqrt_f32(torch.from_numpy(values)).numpy()
    assert ours.dtype == np.float32
    assert np.array_equal(ours, np.sqrt(values))
    assert ours[0] == np.float32(0.17755838)


#: Largest relative RMS error on Gaussian weights (typical values are about half of these).
RELATIVE_RMSE = {
    "q8_0": 0.006,
    "q6_k": 0.02,
    "q5_0": 0.05,
    "q5_1": 0.04,
    "q5_k": 0.04,
    "q4_0": 0.11,
    "q4_1": 0.09,
    "q4_k": 0.08,
    "q3_k": 0.2,
    "q2_k": 0.4,
}


@pytest.mark.parametrize("qtype", sorted(QUANT_TYPES))
def test_every_type_round_trips_through_gguf_dequantize(qtype: str) -> None:
    from gguf.quants import dequantize

    gen = torch.Generator().manual_seed(4)
    w = torch.randn(32, 1024, generator=gen) * 0.02
    q = quantize(w, qtype)
    t = quant_type(qtype)
    assert q.dtype == torch.uint8 and q.shape == (32, 1024 // t.block_elems * t.type_bytes)
    back = torch.from_numpy(dequantize(q.numpy(), _gguf_type(qtype)))
    assert back.shape == w.shape
    rel = float((back - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt())
    assert rel < RELATIVE_RMSE[qtype], f"{qtype}: relative RMS error {rel:.4f}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_is_quantized_as_its_float32_values(dtype: torch.dtype) -> None:
    w = (torch.randn(4, 512, generator=torch.Generator().manual_seed(5))).to(dtype)
    for qtype in ("q8_0", "q4_k"):
        assert torch.equal(quantize(w, qtype), quantize(w.float(), qtype))


def test_rows_larger_than_one_chunk_are_quantized_whole() -> None:
    # more blocks than one CPU step handles (2**21 weights), so the chunking is exercised
    w = torch.randn(2**11 + 3, 1024, generator=torch.Generator().manual_seed(6))
    q = quantize(w, "q8_0")
    assert torch.equal(q[-3:], quantize(w[-3:], "q8_0"))
    assert torch.equal(q[:5], quantize(w[:5], "q8_0"))


def test_bad_input_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(torch.zeros(2, 96), "q4_k")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(torch.zeros(2, 40), "q8_0")
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.zeros(256), "q4_k")
    with pytest.raises(ValueError, match="floating-point"):
        quantize(torch.zeros(2, 256, dtype=torch.int32), "q4_k")
    with pytest.raises(ValueError, match="'q7_k' is not supported.*q4_0"):
        quantize(torch.zeros(2, 256), "q7_k")
    assert quant_type("Q4_K") is QUANT_TYPES["q4_k"]


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", sorted(QUANT_TYPES))
def test_cuda_bytes_equal_cpu_bytes(qtype: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.from_numpy(_test_matrix(qtype, seed=7, random_rows=512))
    cpu = quantize(x, qtype)
    gpu = quantize(x.cuda(), qtype)
    assert gpu.is_cuda
    differing = (gpu.cpu() != cpu).any(dim=1).nonzero().flatten().tolist()
    assert not differing, f"{qtype}: rows {differing[:20]} differ between CUDA and CPU"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["q4_k", "q5_k", "q2_k", "q6_k", "q3_k", "q8_0"])
def test_cuda_quantizes_a_large_layer_in_seconds(qtype: str) -> None:
    """An 8B model's largest projection (14336 x 4096): ISQ quantizes layer by layer at load
    time, so one such matrix must take seconds at most."""
    import time

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16)
    quantize(w[:256], qtype)  # first-use costs (allocator, kernels)
    torch.cuda.synchronize()
    start = time.perf_counter()
    quantize(w, qtype)
    torch.cuda.synchronize()
    assert time.perf_counter() - start < 5.0

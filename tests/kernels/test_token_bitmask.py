"""The structured-output mask kernels (the mask applied in place, greedy decoding under masks)
against their torch references, and the references against a token-by-token reading of the
bitmask.

Like ``test_kernels.py``: on a CUDA machine the Triton kernel runs on the GPU at serving
shapes (``pytest -m gpu``); ``test_interpreter.py`` also runs this module under
``TRITON_INTERPRET=1``, where the kernel runs on CPU tensors at small shapes.
"""

from __future__ import annotations

import os

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels.token_bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_ref,
    masked_argmax,
    masked_argmax_ref,
    unpack_bitmask,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
ON_DEVICE = INTERPRET or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def rng() -> torch.Generator:
    seed = base_seed()
    print(f"input seed {seed} (TALLOW_TEST_SEED={base_seed()} replays it)")
    return torch.Generator().manual_seed(seed)


def random_bitmask(g: torch.Generator, rows: int, vocab: int, density: float) -> torch.Tensor:
    allowed = torch.rand(rows, vocab, generator=g) < density
    words = (vocab + 31) // 32
    padded = torch.zeros(rows, words * 32, dtype=torch.bool)
    padded[:, :vocab] = allowed
    weights = 1 << torch.arange(32, dtype=torch.int64)
    packed = (padded.view(rows, words, 32).to(torch.int64) * weights).sum(-1)
    return ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)  # two's complement in int32


def test_reference_reads_each_bit():
    g = rng()
    vocab = 77  # not a multiple of 32: the last word is partly outside the vocabulary
    mask = random_bitmask(g, 3, vocab, 0.4)
    logits = torch.randn(5, vocab, generator=g)
    rows = torch.tensor([4, 0, 2])
    out = logits.clone()
    apply_token_bitmask_ref(out, mask, rows)
    for m, r in enumerate(rows.tolist()):
        for t in range(vocab):
            bit = (int(mask[m, t // 32]) >> (t % 32)) & 1
            assert out[r, t] == (logits[r, t] if bit else float("-inf"))
    for r in (1, 3):  # rows without a mask are untouched
        assert torch.equal(out[r], logits[r])
    assert unpack_bitmask(mask, vocab).sum() == torch.isfinite(out[rows]).sum()


def test_shapes_are_checked():
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="2 words per row"):
        apply_token_bitmask(logits, torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="expected 1 rows"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0]))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_DEVICE, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("density", [0.001, 0.5, 1.0])
@pytest.mark.parametrize("with_rows", [True, False])
def test_kernel_matches_reference(dtype, density, with_rows):
    g = rng()
    n, vocab = (6, 1000) if INTERPRET else (256, 151936)
    logits = (torch.randn(n, vocab, generator=g) * 4).to(dtype).to(DEVICE)
    if with_rows:
        rows = torch.randperm(n, generator=g)[: n // 2 + 1]
        mask = random_bitmask(g, rows.shape[0], vocab, density)
        rows_dev = rows.to(DEVICE)
    else:
        rows, rows_dev = None, None
        mask = random_bitmask(g, n, vocab, density)
    expected, actual = logits.cpu().clone(), logits.clone()
    apply_token_bitmask_ref(expected, mask, rows)
    apply_token_bitmask(actual, mask.to(DEVICE), rows_dev)
    assert torch.equal(actual.cpu(), expected)
    if density < 1.0:
        assert not torch.equal(actual.cpu(), logits.cpu())


def test_masked_argmax_reference_picks_the_best_allowed_token():
    g = rng()
    vocab = 77
    mask = random_bitmask(g, 3, vocab, 0.3)
    mask[1] = 0  # a row that allows nothing: every token is -inf, the first wins
    logits = torch.randn(5, vocab, generator=g)
    before = logits.clone()
    rows = torch.tensor([4, 0, 2])
    got = masked_argmax_ref(logits, mask, rows)
    assert torch.equal(logits, before)  # the logits are not changed
    for m, r in enumerate(rows.tolist()):
        allowed = [t for t in range(vocab) if (int(mask[m, t // 32]) >> (t % 32)) & 1]
        best = max(allowed, key=lambda t: float(logits[r, t])) if allowed else 0
        assert int(got[r]) == best
    for r in (1, 3):  # rows without a mask: the plain argmax
        assert int(got[r]) == int(logits[r].argmax())
    with pytest.raises(ValueError, match="expected 1 rows"):
        masked_argmax(logits, mask, torch.tensor([0]))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_DEVICE, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("density", [0.0, 0.001, 0.5, 1.0])
@pytest.mark.parametrize("with_rows", [True, False])
def test_masked_argmax_matches_reference(dtype, density, with_rows):
    g = rng()
    n, vocab = (6, 9000) if INTERPRET else (256, 151936)
    logits = (torch.randn(n, vocab, generator=g) * 4).to(dtype)
    # ties across the kernel's chunks (the first index wins) and a NaN (it wins where allowed)
    logits[0, :] = 0
    logits[0, vocab - 1] = logits[0, vocab // 2] = logits[0, 5] = 3
    logits[1, vocab // 3] = float("nan")
    if with_rows:
        rows = torch.randperm(n, generator=g)[: n // 2 + 1]
        rows = torch.cat([torch.tensor([0, 1]), rows[(rows != 0) & (rows != 1)]])
        mask = random_bitmask(g, rows.shape[0], vocab, density)
        rows_dev = rows.to(DEVICE)
    else:
        rows, rows_dev = None, None
        mask = random_bitmask(g, n, vocab, density)
    on_device = logits.to(DEVICE)
    expected = masked_argmax_ref(logits, mask, rows)
    got = masked_argmax(on_device, mask.to(DEVICE), rows_dev)
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), expected)
    # the logits are not changed (the NaN included)
    torch.testing.assert_close(on_device.cpu(), logits, rtol=0, atol=0, equal_nan=True)
